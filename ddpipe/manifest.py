"""The dataset manifest, ``index.json``: what planning reads instead of scanning shards.

A dataset is a directory holding shard files and ``index.json``::

    {
      "ddpipe": 1,
      "format": "wds",
      "fields": ["cls", "jpg"],
      "classes": ["class_0000", ...],
      "shards": [{"file": "shard-000000.tar", "samples": 512, "bytes": 56885248,
                  "checksum": "xxh3_64:9f86d081884c7d65", "labels": [[0, 300], [1, 212]]}, ...],
      "skipped": [{"path": "raw/bad.jpg", "error": "not an image"}],
      "origin": {"fingerprint": "..."}
    }

A shard's ``labels`` are its samples' classes in stored order, run-length encoded (a class-sorted
shard is one or two runs): what ``ddpipe plan`` scores shuffles with, without reading a shard.
It is optional; datasets without it are scored after reading their labels.

It is written atomically and holds nothing that varies between runs (no time stamps), so the
same conversion gives the same bytes.

A dataset adopted in place from files another tool wrote (``ddpipe index``) may keep its manifest
elsewhere: ``"data_dir"`` names the directory of its files (relative to the manifest's, or absolute),
and ``"layout"`` tells the format's reader how those files hold samples.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .checksum import unpack_digests
from .directory_kind import hint
from .errors import DdpipeError, ManifestError, MissingShardError
from .fields import checked, kind_of, whole_number
from .formats.atomic import atomic_write_bytes

if TYPE_CHECKING:
    from .storage import ObjectStorage

MANIFEST_NAME = "index.json"
MANIFEST_VERSION = 1
MOST_NUMBERED_CLASSES = 1 << 20  # see numbered_class_limit


def numbered_class_limit(samples: int) -> int:
    """How many classes a dataset of ``samples`` that names none may number: a label past both
    :data:`MOST_NUMBERED_CLASSES` and one class per sample is more likely an identifier than a class
    index, and what counts samples per class (plan scoring) or names each class (conversion) would
    take memory out of all proportion to the dataset."""
    return max(MOST_NUMBERED_CLASSES, samples)


@dataclass(frozen=True)
class ShardInfo:
    """One shard: its file name (relative to the dataset), sample count, size and checksum."""

    file: str
    samples: int
    bytes: int
    checksum: str
    labels: tuple[tuple[int, int], ...] = ()  # (class, count) runs in stored order; () when unknown
    # each sample's digest (checksum.sample_digest), packed; "" when the shard has none (then its reads
    # check the whole file's checksum)
    digests: str = ""

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"file": self.file, "samples": self.samples, "bytes": self.bytes,
                               "checksum": self.checksum}
        if self.labels:
            doc["labels"] = [list(run) for run in self.labels]
        if self.digests:
            doc["digests"] = self.digests
        return doc

    @classmethod
    def from_dict(cls, doc: object, number: int = 0) -> ShardInfo:
        """The inverse of :meth:`to_dict`; a ValueError saying which field is wrong if ``doc`` (shard entry
        ``number``) is not one."""
        if not isinstance(doc, dict):
            raise ValueError(f"shard entry {number} must be an object, not {kind_of(doc)}")
        name = checked(doc, "file", str)
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise ValueError(f"shard file {name!r} must be a file name inside the dataset (no '/', not hidden)")
        try:
            labels = doc.get("labels", [])
            if not isinstance(labels, list) or not all(isinstance(r, list) and len(r) == 2 for r in labels):
                raise ValueError("'labels' must be a list of [class, count] runs")
            runs = tuple((whole_number(c, "a label run's class"), whole_number(n, "a label run's count"))
                         for c, n in labels)
            return cls(name, whole_number(doc.get("samples"), "'samples'"), whole_number(doc.get("bytes"), "'bytes'"),
                       checked(doc, "checksum", str), runs, checked(doc, "digests", str, default=""))
        except ValueError as e:
            raise ValueError(f"shard {name!r}: {e}") from None


def _names(doc: dict[str, Any], key: str) -> tuple[str, ...]:
    names = checked(doc, key, list, default=[])
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"{key!r} must be a list of names")
    return tuple(names)


def label_runs(labels: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """``labels`` as (class, count) runs; () if any is unknown (negative)."""
    runs: list[list[int]] = []
    for label in labels:
        if label < 0:
            return ()
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])
    return tuple((c, n) for c, n in runs)


@dataclass(frozen=True)
class SkippedItem:
    """A source item that a conversion with ``on_error="skip"`` left out, and why."""

    path: str
    error: str


@dataclass(frozen=True)
class Manifest:
    """A dataset's description. Frozen: build a new one with :func:`dataclasses.replace`."""

    format: str
    fields: tuple[str, ...]
    classes: tuple[str, ...]
    shards: tuple[ShardInfo, ...]
    skipped: tuple[SkippedItem, ...] = ()
    origin: dict[str, str] = field(default_factory=dict)
    layout: dict[str, Any] = field(default_factory=dict)  # how an adopted format's files hold samples
    data_dir: str | None = None  # where the shard files are, when not beside index.json

    # sums over every shard, kept: asked for per shard or per batch, they made loading 20,000 shards take 10 s
    @functools.cached_property
    def num_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @functools.cached_property
    def num_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def sample_labels(self) -> np.ndarray | None:
        """Every sample's class by global index, from the shards' label runs; None if a shard has none."""
        if any(s.samples and not s.labels for s in self.shards):
            return None
        runs = [run for s in self.shards for run in s.labels]
        if not runs:
            return np.zeros(0, dtype=np.int64)
        classes, counts = zip(*runs, strict=True)
        return np.repeat(np.asarray(classes, dtype=np.int64), np.asarray(counts, dtype=np.int64))

    @functools.cached_property
    def content_id(self) -> str:
        """What this dataset holds, not where: its shards in order, with their sample counts and checksums
        (a loader state names it, so that it resumes only over the dataset it was saved from)."""
        shards = json.dumps([[s.file, s.samples, s.checksum] for s in self.shards]).encode()
        return hashlib.sha256(shards).hexdigest()[:32]

    def shard_starts(self) -> list[int]:
        """Global index of each shard's first sample (shards in manifest order)."""
        starts, total = [], 0
        for s in self.shards:
            starts.append(total)
            total += s.samples
        return starts

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "ddpipe": MANIFEST_VERSION,
            "format": self.format,
            "fields": list(self.fields),
            "classes": list(self.classes),
            "num_samples": self.num_samples,
            "shards": [s.to_dict() for s in self.shards],
            "skipped": [{"path": s.path, "error": s.error} for s in self.skipped],
        }
        if self.origin:
            doc["origin"] = dict(sorted(self.origin.items()))
        if self.layout:
            doc["layout"] = dict(sorted(self.layout.items()))
        if self.data_dir is not None:
            doc["data_dir"] = self.data_dir
        return json.dumps(doc, indent=1) + "\n"

    @classmethod
    def from_dict(cls, doc: object, *, path: str | os.PathLike[str] = MANIFEST_NAME) -> Manifest:
        """Validate a parsed ``index.json``; raise :class:`ManifestError` naming what is wrong."""
        if not isinstance(doc, dict) or "ddpipe" not in doc:
            raise ManifestError("not a ddpipe manifest (no 'ddpipe' version key)", path=path)
        if doc["ddpipe"] != MANIFEST_VERSION:
            raise ManifestError(f"manifest version {doc['ddpipe']!r} is not supported", path=path)
        try:
            shards = tuple(ShardInfo.from_dict(s, i) for i, s in enumerate(checked(doc, "shards", list)))
            skipped = checked(doc, "skipped", list, default=[])
            if not all(isinstance(s, dict) and isinstance(s.get("path"), str) and isinstance(s.get("error"), str)
                       for s in skipped):
                raise ValueError("'skipped' must be a list of {\"path\": ..., \"error\": ...} entries")
            origin, layout = checked(doc, "origin", dict, default={}), checked(doc, "layout", dict, default={})
            data_dir = None if doc.get("data_dir") is None else checked(doc, "data_dir", str)
            manifest = cls(format=checked(doc, "format", str), fields=_names(doc, "fields"),
                           classes=_names(doc, "classes"), shards=shards,
                           skipped=tuple(SkippedItem(s["path"], s["error"]) for s in skipped),
                           origin={str(k): str(v) for k, v in origin.items()}, layout=dict(layout), data_dir=data_dir)
        except ValueError as e:
            raise ManifestError(f"malformed manifest: {e}", path=path) from None
        _check_shards(manifest, path)
        if "num_samples" in doc and doc["num_samples"] != manifest.num_samples:
            raise ManifestError(
                f"num_samples {doc['num_samples']} disagrees with the shards' sum {manifest.num_samples}",
                path=path,
            )
        return manifest


def _check_shards(manifest: Manifest, path: str | os.PathLike[str]) -> None:
    """Each shard's entry against itself and the manifest (its samples, its label runs, its digests), and
    no shard file listed twice; a :class:`ManifestError` naming the shard and ``path`` if not."""
    total = manifest.num_samples
    class_limit = numbered_class_limit(total)
    for s in manifest.shards:
        if s.samples > s.bytes:  # before any array is sized from the count (its digests, its labels)
            raise ManifestError(f"shard {s.file!r}: {s.samples} samples in {s.bytes} bytes (a sample takes at "
                                "least one)", path=path)
        if s.labels and sum(n for _, n in s.labels) != s.samples:
            raise ManifestError(f"shard {s.file!r}: its label runs do not add up to its {s.samples} samples",
                                path=path)
        top = max((c for c, _ in s.labels), default=-1)
        if manifest.classes and top >= len(manifest.classes):  # a training loss would fail on it
            raise ManifestError(f"shard {s.file!r}: a label run's class is {top}, but the manifest names "
                                f"{len(manifest.classes)} classes", path=path)
        if top >= class_limit:  # before counts per class are sized from it
            raise ManifestError(f"shard {s.file!r}: a label run's class is {top}, more classes than a dataset of "
                                f"{total} samples is taken to have", path=path)
        if s.digests:
            try:
                unpack_digests(s.digests, s.samples)
            except ValueError as e:
                raise ManifestError(f"shard {s.file!r}: its sample digests do not read: {e}", path=path) from None
    if len({s.file for s in manifest.shards}) != len(manifest.shards):
        raise ManifestError("a shard file is listed twice", path=path)


def load_manifest(dataset: str | os.PathLike[str]) -> Manifest:
    """Read and validate ``DATASET/index.json``."""
    path = Path(dataset) / MANIFEST_NAME
    if not Path(dataset).exists():
        raise ManifestError("no such directory", path=dataset)
    if not Path(dataset).is_dir():
        if Path(dataset).name == MANIFEST_NAME:  # as an object store's URL to it is told
            raise ManifestError(f"names the index.json itself: a dataset is the directory holding it "
                                f"({Path(dataset).parent})", path=dataset)
        raise ManifestError("not a directory: a dataset is a directory holding index.json", path=dataset)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"no index.json: {_what_makes_one(Path(dataset))}", path=path) from None
    except OSError as e:
        raise ManifestError(f"cannot read: {e}", path=path) from None
    return manifest_from_text(text, path)


def _what_makes_one(directory: Path) -> str:
    """The command that makes a manifest for what ``directory`` holds (images to convert, shards to
    adopt), for a newcomer who points a loader at the raw data."""
    try:
        said = hint(directory)
    except DdpipeError:  # a directory whose mode refuses a look: say what is generally done
        said = None
    return said or "not a ddpipe dataset (try 'ddpipe index' or 'ddpipe convert')"


def manifest_from_text(text: bytes, path: str | os.PathLike[str]) -> Manifest:
    """A manifest from the bytes of an ``index.json`` read from ``path`` (a file or an object URL)."""
    try:
        doc = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"not valid JSON: {e}", path=path) from None
    return Manifest.from_dict(doc, path=path)


def save_manifest(dataset: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write ``DATASET/index.json`` atomically: readers see the old manifest or the new one."""
    path = Path(dataset) / MANIFEST_NAME
    atomic_write_bytes(path, manifest.to_json().encode())
    return path


def load_manifest_from(objects: ObjectStorage) -> Manifest:
    """Read and validate the ``index.json`` object under a remote location."""
    manifest = find_manifest(objects)
    if manifest is None:
        named = objects.url().rstrip("/")
        if named.endswith(f"/{MANIFEST_NAME}"):  # as a local path to the file is refused: "not a directory"
            raise ManifestError(f"names the index.json itself: a dataset is the prefix holding it "
                                f"({named.removesuffix(f'/{MANIFEST_NAME}')})", path=named)
        raise ManifestError("no index.json: not a ddpipe dataset (try 'ddpipe index' or 'ddpipe convert')",
                            path=objects.url(MANIFEST_NAME))
    return manifest


def find_manifest(objects: ObjectStorage) -> Manifest | None:
    """The ``index.json`` object under a remote location, validated, or None if there is none."""
    try:
        text = objects.get(MANIFEST_NAME)
    except MissingShardError:
        return None
    return manifest_from_text(text, objects.url(MANIFEST_NAME))
