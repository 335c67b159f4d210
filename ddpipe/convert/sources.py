"""What a conversion reads: an ImageFolder tree, a list file, or an existing ddpipe dataset.

Each source enumerates its items deterministically (sorted paths, manifest order) without reading
image bytes, so every MPI rank computes the same item list and the same shard layout on its own.
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import UnidentifiedImageError

from ..checksum import digest_mismatch
from ..dataset import Dataset, open_dataset
from ..decode.jpeg_header import jpeg_size
from ..decode.spec import NOT_AN_IMAGE, PixelLimitError, check_pixels, decode_check, open_image
from ..directory_kind import hint, what_is_in
from ..errors import CorruptShardError, DdpipeError, SourceError
from ..formats import ShardReader
from ..manifest import MANIFEST_NAME, SkippedItem
from ..sample import KEY, Sample, sanitize_key
from ..storage import is_remote
from .classes import numbered_classes

# PIL's format name -> the WebDataset field an image is stored under
_FIELD_OF_FORMAT = {"JPEG": "jpg", "PNG": "png", "GIF": "gif", "BMP": "bmp", "WEBP": "webp", "TIFF": "tiff"}


@dataclass(frozen=True)
class SourceItem:
    """One sample to write. File items name an image and its label; dataset items a shard position."""

    path: str
    size: int
    key: str | None = None
    label: int | None = None
    index: int | None = None  # position within the shard ``path`` for dataset items


@dataclass(frozen=True)
class Source:
    """An enumerated source: its items in source order, its classes, and what identifies it."""

    kind: str  # "imagefolder", "list" or "dataset"
    root: str
    items: tuple[SourceItem, ...]
    classes: tuple[str, ...]
    identity: str  # what the resume fingerprint hashes: relative paths and sizes, or shard checksums
    shard_ranges: tuple[tuple[int, int], ...] = ()  # a dataset source's own shard boundaries
    format: str | None = None
    skipped: tuple[SkippedItem, ...] = ()
    empty_classes: tuple[str, ...] = ()  # an ImageFolder's class directories that hold no file


def open_source(src: str | os.PathLike[str]) -> Source:
    if is_remote(src):  # only a ddpipe dataset is read from a bucket or a server
        return _dataset_source(str(src))
    path = Path(src)
    if path.is_dir() and (path / MANIFEST_NAME).exists():
        return _dataset_source(path)
    if what_is_in(path) in ("hdf5", "lmdb") and not (path.is_dir() and any(p.is_dir() for p in path.iterdir())):
        raise SourceError(f"not images but {hint(path)}; then convert the adopted dataset if you want shards",
                          path=path)
    if path.is_dir():
        return _imagefolder_source(path)
    if path.is_file() and path.suffix.lower() in (".csv", ".tsv", ".txt", ".lst"):
        return _list_source(path)
    if not path.exists():
        raise SourceError("no such file or directory", path=path)
    raise SourceError("not a dataset, an ImageFolder directory or a list file (.csv, .tsv, .txt, .lst)", path=path)


def key_of(relative: str) -> str:
    return sanitize_key(os.path.splitext(relative)[0])


def check_unique(items: list[SourceItem]) -> None:
    seen: dict[str, str] = {}
    for item in items:
        assert item.key is not None
        if item.key in seen:
            raise SourceError(f"{item.path!r} and {seen[item.key]!r} map to the same key {item.key!r}")
        seen[item.key] = item.path


def _unlisted(error: OSError) -> None:
    """os.walk's answer to a directory it cannot list: left to itself it goes on without a word, and
    the images there would be missing from the dataset, not even counted as skipped."""
    raise SourceError(f"cannot list: {error.strerror or error}; its images would be left out", path=error.filename)


def _imagefolder_source(root: Path) -> Source:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise SourceError("no class directories: an ImageFolder tree is root/<class>/<image>", path=root)
    items: list[SourceItem] = []
    relative: list[str] = []
    empty = []
    for label, cls in enumerate(classes):
        before = len(items)
        top = str(root / cls)
        for dirpath, dirnames, filenames in os.walk(top, onerror=_unlisted):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            # each path relative to the root, from the walk's own joins: os.path.relpath, which makes
            # both paths absolute first, took 36 us a file, some 45 s of ImageNet's listing
            under = cls + dirpath[len(top):]
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                full = os.path.join(dirpath, name)
                rel = f"{under}/{name}"
                relative.append(rel)
                try:
                    size = os.path.getsize(full)
                except OSError:
                    size = 0  # a dangling link, say: reported when the item is read, under the on-error policy
                items.append(SourceItem(path=full, size=size, key=key_of(rel), label=label))
        if len(items) == before:
            empty.append(cls)
    if not items:
        raise SourceError("no files under the class directories", path=root)
    check_unique(items)
    identity = "\n".join(f"{rel}\t{i.size}\t{i.label}" for rel, i in zip(relative, items, strict=True))
    return Source("imagefolder", str(root), tuple(items), tuple(classes), identity, empty_classes=tuple(empty))


def _list_rows(list_file: Path) -> list[list[str]]:
    """Each row's (path, label): from CSV or TSV (path, label, and any further columns), from the
    'path label' lines of Caffe's ImageNet lists (a path may hold spaces: the label is after the last
    one), or from MXNet im2rec's .lst (index, label, path, tab-separated)."""
    text = list_file.read_text(encoding="utf-8")
    first = text.splitlines()[0] if text.strip() else ""
    suffix = list_file.suffix.lower()
    if suffix == ".lst":
        return _im2rec_rows(list_file, text)
    if suffix == ".tsv" or "\t" in first:
        delimiter = "\t"
    elif suffix == ".txt" and "," not in first:
        delimiter = " "
    else:
        delimiter = ","
    if delimiter == " ":
        rows = [line.strip().rsplit(None, 1) for line in text.splitlines() if line.strip()]
    else:
        rows = [r for r in csv.reader(io.StringIO(text), delimiter=delimiter) if r and any(c.strip() for c in r)]
    if rows and rows[0][0].strip().lower() in ("path", "file", "filename", "image"):
        rows = rows[1:]
    if not rows:
        raise SourceError(f"the list file has no rows of 'path{delimiter}label'", path=list_file)
    for n, row in enumerate(rows, 1):
        if len(row) < 2:
            raise SourceError(f"row {n} has {len(row)} column(s); expected 'path{delimiter}label'", path=list_file)
    return rows


def _im2rec_rows(list_file: Path, text: str) -> list[list[str]]:
    rows = [line.rstrip("\r\n").split("\t") for line in text.splitlines() if line.strip()]
    if not rows:
        raise SourceError("the list file has no rows of 'index<TAB>label<TAB>path'", path=list_file)
    for n, row in enumerate(rows, 1):
        if len(row) != 3:
            raise SourceError(f"row {n} has {len(row)} columns; an im2rec .lst row is index, label, path "
                              "(one label), tab-separated", path=list_file)
    return [[path, _im2rec_label(label)] for _, label, path in rows]


def _im2rec_label(label: str) -> str:
    """im2rec writes a class index as a float ("3.000000"): as the index; anything else as it is."""
    whole, dot, fraction = label.strip().partition(".")
    return whole if dot and whole.isdecimal() and fraction.strip("0") == "" else label.strip()


def _list_source(list_file: Path) -> Source:
    rows = _list_rows(list_file)
    labels = [r[1].strip() for r in rows]
    if all(re.fullmatch(r"-?[0-9]+", lbl) for lbl in labels):  # ASCII digits: str.isdigit takes '²' too
        numbers = [int(lbl) for lbl in labels]
        if min(numbers) < 0:
            lowest = min(numbers)
            raise SourceError(f"row {numbers.index(lowest) + 1}'s label is {lowest}: labels are class indices "
                              "from 0, or class names", path=list_file)
        classes = list(numbered_classes(max(numbers), len(rows), list_file))
        label_of = {lbl: int(lbl) for lbl in labels}
    else:
        classes = sorted(set(labels))
        label_of = {c: i for i, c in enumerate(classes)}
    base = list_file.parent
    items = []
    for row, lbl in zip(rows, labels, strict=True):
        full = (base / row[0].strip()).resolve()
        rel = os.path.relpath(full, base.resolve())
        if rel.startswith(".."):
            rel = full.name
        try:
            size = full.stat().st_size
        except OSError:
            size = 0  # reported when the item is read, under the on-error policy
        items.append(SourceItem(path=str(full), size=size, key=key_of(rel), label=label_of[lbl]))
    check_unique(items)
    identity = "\n".join(f"{r[0].strip()}\t{i.size}\t{i.label}" for r, i in zip(rows, items, strict=True))
    return Source("list", str(list_file), tuple(items), tuple(classes), identity)


def _dataset_source(root: str | Path) -> Source:
    ds = open_dataset(root)
    items: list[SourceItem] = []
    ranges: list[tuple[int, int]] = []
    for info in ds.manifest.shards:
        per_sample = info.bytes // max(info.samples, 1)
        start = len(items)
        path = ds.source_name(ds.data_root / info.file)  # the same in every process, for objects too
        items.extend(SourceItem(path=path, size=per_sample, index=i) for i in range(info.samples))
        ranges.append((start, len(items)))
    identity = "\n".join(f"{s.file}\t{s.samples}\t{s.checksum}" for s in ds.manifest.shards)
    return Source("dataset", str(root), tuple(items), ds.manifest.classes, identity, tuple(ranges),
                  ds.manifest.format, ds.manifest.skipped)


def _image_format(data: bytes) -> str:
    """PIL's name for the image's format, once its header is read and its size found within the pixel
    limit. A JPEG's header is read here (jpeg_size: 6 us, against PIL's 128 us to open it, a fifth of a
    profiled conversion without its check); any other image, or a JPEG header it does not read, is PIL's."""
    size = jpeg_size(data)
    if size is not None:
        check_pixels(*size)
        return "JPEG"
    with open_image(data) as img:
        check_pixels(*img.size)
        return str(img.format or "")


class ItemLoader:
    """Turns source items into samples; keeps one shard reader open for dataset sources."""

    def __init__(self, kind: str, root: str, decode_check: bool = True) -> None:
        self._dataset: Dataset | None = open_dataset(root) if kind == "dataset" else None
        self._reader: ShardReader | None = None
        self._digests: np.ndarray | None = None  # its shard's sample digests, where it has them
        self._failed: dict[str, str] = {}  # shards that failed their check whole, by name: why
        self._decode_check = decode_check

    def load(self, item: SourceItem) -> Sample:
        if self._dataset is not None:
            return self._load_from_dataset(item)
        try:
            with open(item.path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise SourceError(f"cannot read: {e.strerror or e}", path=item.path) from None
        try:
            kind = _image_format(data)
        except PixelLimitError as e:
            raise SourceError(f"does not decode: {e}", path=item.path) from None
        except (UnidentifiedImageError, OSError, ValueError):
            # PIL's message names the in-memory buffer by its address: the manifest records this text,
            # and two identical runs must write identical manifests
            raise SourceError(NOT_AN_IMAGE, path=item.path) from None
        if self._decode_check:  # the whole image, not only its header: a JPEG cut short fails here
            try:
                decode_check(data, draft=True)
            except (OSError, ValueError, SyntaxError) as e:
                raise SourceError(f"does not decode: {e}", path=item.path) from None
        assert item.key is not None
        return {KEY: item.key, _FIELD_OF_FORMAT.get(kind, kind.lower()): data, "cls": b"%d" % (item.label or 0)}

    def _load_from_dataset(self, item: SourceItem) -> Sample:
        """One sample of a dataset, checked as a loader checks what it reads, so that a damaged shard is
        never copied into shards whose new checksums would vouch for it: against its digest where the
        manifest records them, else its whole shard against its checksum as it is opened. A sample that
        fails is a :class:`SourceError` (the conversion's ``on_error`` says whether it stops or leaves it
        out); a shard that fails whole fails each of its items without being hashed again."""
        assert self._dataset is not None and item.index is not None
        if item.path in self._failed:
            raise _unread(item, self._failed[item.path])
        try:
            if self._reader is None or self._dataset.source_name(self._reader.path) != item.path:
                self.close()
                shard = next(i for i, s in enumerate(self._dataset.manifest.shards)
                             if self._dataset.source_name(self._dataset.data_root / s.file) == item.path)
                self._digests = self._dataset.sample_digests(shard)
                self._reader = self._dataset.open_shard(shard, verify=self._digests is None)
            sample = self._reader[item.index]
        except CorruptShardError as e:
            if self._reader is None:  # the shard failed its check whole: each of its samples is named unread
                self._failed[item.path] = e.message
                raise _unread(item, e.message) from None
            raise SourceError(e.message, path=item.path) from None
        except DdpipeError:
            raise
        except OSError as e:
            raise SourceError(f"cannot read sample {item.index}: {e}", path=item.path) from None
        error = digest_mismatch(self._digests, item.index, sample, item.path)
        if error is not None:
            raise SourceError(error.message, path=item.path)
        return self._reader.parse(sample)  # checked first, then parsed

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _unread(item: SourceItem, why: str) -> SourceError:
    """The error for a sample of a dataset left unread because its shard failed its check whole (``why``):
    which sample, so that each one a conversion leaves out is told apart."""
    return SourceError(f"sample {item.index} unread, its shard failing its check: {why}", path=item.path)
