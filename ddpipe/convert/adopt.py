"""``ddpipe index DIR``: adopt WebDataset tar shards in place by writing their manifest.

Shards written by the ``webdataset`` library's ``ShardWriter`` or by plain ``tar`` are read
header by header (the data is only hashed), DALI index files are written beside them, and
``index.json`` makes the directory a ddpipe dataset without copying a byte of the shards.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..checksum import pack_digests, sample_digest
from ..errors import (
    ChangedShardsWarning,
    ConversionConflictError,
    DdpipeError,
    ManifestError,
    OptionError,
    UnlabelledSamplesWarning,
)
from ..formats.atomic import Finished, discard, partial_path, raise_if_disk_full
from ..formats.tar import TarFormat, TarReader
from ..formats.tar_index import format_dali_index, index_path, scan_tar_members, split_member_name
from ..manifest import MANIFEST_NAME, Manifest, ShardInfo, label_runs, load_manifest, save_manifest
from ..sample import label_of
from ..storage.location import is_remote
from .classes import named_classes


def recorded_classes(root: Path) -> list[str] | None:
    """The class names of the manifest already in ``root``, if any: indexing again keeps the names
    given before. An ``index.json`` that is not ddpipe's is someone else's file: refused, not replaced."""
    if not (root / MANIFEST_NAME).exists():
        return None
    try:
        recorded = load_manifest(root)
    except ManifestError as e:
        raise ConversionConflictError(
            f"index.json exists but cannot be kept: {e.message}; move it away first",
            path=root / MANIFEST_NAME,
        ) from None
    return list(recorded.classes) or None


#: the formats only ddpipe writes (a manifest of one is of shards ddpipe converted)
OWN_FORMATS = ("hdf5", "lmdb")


def refuse_a_dataset_ddpipe_wrote(data: Path, out: Path | None) -> None:
    """Adopting files writes a manifest made from them as they are now; a directory (``data``, or the
    ``out`` whose manifest would be replaced) whose ``index.json`` a conversion wrote is refused."""
    for where in dict.fromkeys([data, out or data]):
        manifest = recorded_manifest(where)  # one not ddpipe's, or unreadable: refused where classes are looked for
        if manifest is not None:
            refuse_if_converted(manifest, str(where))


def refuse_if_converted(manifest: Manifest, where: str) -> None:
    """A manifest a conversion wrote (at ``where``, a directory or a URL) belongs to a dataset already:
    indexing it would replace the checksums its shards are checked against (a shard changed since
    would be vouched for) and what a rerun of the conversion resumes from. Refused, naming it."""
    if manifest.format in OWN_FORMATS or manifest.origin:
        raise ConversionConflictError(
            f"is a dataset that ddpipe convert wrote ({manifest.format}, {len(manifest.shards)} shard(s), "
            f"{manifest.num_samples} samples) and needs no index: `ddpipe verify {where}` checks its shards "
            "against its index.json", path=where)


def recorded_manifest(target: Path) -> Manifest | None:
    """The manifest in ``target`` that indexing would replace, if there is a readable one."""
    try:
        return load_manifest(target) if (target / MANIFEST_NAME).is_file() else None
    except (ManifestError, OSError):
        return None


def warn_of_changed_shards(before: Manifest | None, after: Manifest, where: str) -> None:
    """Indexing again takes the files as they are: warn, naming them, of those whose bytes differ from
    the manifest ``before`` (at ``where``) that ``after`` replaces: data rewritten on purpose, or
    damaged (``ddpipe verify`` would have said)."""
    if before is None:
        return
    recorded = {s.file: s.checksum for s in before.shards}
    changed = [s.file for s in after.shards if recorded.get(s.file, s.checksum) != s.checksum]
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        warnings.warn(f"{where}: {len(changed)} file(s) differ from the checksums it recorded and are indexed as "
                      f"they are now: {', '.join(changed[:3])}{more}", ChangedShardsWarning, stacklevel=3)


def refuse_read_only(data: Path, out: Path | None) -> None:
    """Refuse to adopt ``data`` where its manifest cannot be written: beside ``data`` when it is
    read-only, or in an ``out`` that cannot be made or written. Said before its files are read (each
    is hashed whole: minutes for an ImageNet), not after."""
    if out is None:
        if data.is_dir() and not os.access(data, os.W_OK):
            raise DdpipeError("the data directory is read-only: write the manifest elsewhere with --out DIR",
                              path=data)
        return
    refuse_unwritable_out(out)


def refuse_unwritable_out(out: Path, role: str = "--out") -> None:
    """Refuse an output directory (``role`` says which) that is not one, or cannot be made or written
    to by this user: said before any input is read, not at the first write."""
    there = out  # the directory it is, or the nearest one that exists to be made in
    while not there.exists() and there != there.parent:
        there = there.parent
    which = "it" if there == out else str(there)
    if not there.is_dir():
        raise DdpipeError(f"{role} cannot be made: {which} is not a directory", path=out)
    if not os.access(there, os.W_OK | os.X_OK):
        raise DdpipeError(f"{role} cannot be written: {which} is read-only", path=out)


def given_or_recorded(classes: list[str] | None, data: Path, out: Path | None) -> list[str] | None:
    """The class names given, else those of the manifest already where this one goes (indexing again
    keeps them); refuses, before any work, to replace an ``index.json`` that is not ddpipe's."""
    target = out or data
    recorded = recorded_classes(target) if target.is_dir() else None
    return classes if classes is not None else recorded


def write_adopted(data: Path, out: Path | None, manifest: Manifest) -> Manifest:
    """Save ``manifest`` beside the adopted files in ``data``, or in ``out`` naming ``data`` relative to it
    (a read-only data directory must be given one)."""
    target = out or data
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        manifest = Manifest(**{**manifest.__dict__, "data_dir": os.path.relpath(data.resolve(), out.resolve())})
    else:
        refuse_read_only(data, out)  # and again, for a directory made read-only while it was read
    warn_of_changed_shards(recorded_manifest(target), manifest, str(target / MANIFEST_NAME))
    save_manifest(target, manifest)
    return manifest


@dataclass(frozen=True)
class AdoptedTar:
    """One tar shard adopted: its manifest entry, its DALI index (written beside it, not yet named: see
    :func:`indexes_named_at_the_end`), its samples' fields, and what its ``cls`` values say:
    how many samples have one, the largest class number, and the samples without a class number (no
    ``cls``, a negative one, or a name): how many, and the first's key and ``cls``. Counts, not a
    value per sample: ImageNet's 1.28 million would take hundreds of MB."""

    shard: ShardInfo
    index: Finished
    fields: frozenset[str]
    labelled: int = 0
    largest: int = -1
    without: int = 0
    first_without: tuple[str, bytes | None] | None = None
    names_a_class: bool = True  # no cls value is anything but a class number (a missing one is no matter)


def adopt_tar(tar: Path, *, index: bool = True) -> AdoptedTar:
    """Read one tar shard header by header, write its DALI index beside it under a temporary name
    (unless not ``index``: its readers then scan its headers), and say what it holds."""
    groups = scan_tar_members(tar)
    try:
        dali_index = format_dali_index(groups).encode()
    except UnicodeEncodeError as e:  # tarfile keeps undecodable bytes as surrogates
        line = e.object[e.object.rfind("\n", 0, e.start) + 1:].split("\n", 1)[0]
        name = line.rsplit(" ", 1)[-1].encode("utf-8", "surrogateescape")
        raise DdpipeError(f"member {name!r}: its name is not UTF-8; rename it, or repack the tar", path=tar) from None
    fields = frozenset(ext for group in groups for ext, *_ in group)
    stored: list[bytes | None] = [None] * len(groups)
    digests: list[int] = []  # each sample's, as a reader gives it: a rank reading a share checks those
    with TarReader(tar, groups) as reader:
        for sample in reader.scan():
            digests.append(sample_digest(sample))
            if "cls" in sample:
                stored[len(digests) - 1] = bytes(sample["cls"])
        checksum = TarFormat().checksum(reader)  # through the mapping the scan paged in: the file read once
    numbers = [_as_int(v) for v in stored]
    shard = ShardInfo(tar.name, len(groups), tar.stat().st_size, checksum, label_runs(numbers), pack_digests(digests))
    without = [i for i, n in enumerate(numbers) if n < 0]
    first = (split_member_name(groups[without[0]][0][3])[0], stored[without[0]]) if without else None
    return AdoptedTar(shard, _written(index_path(tar), dali_index) if index else Finished(()), fields,
                      labelled=sum(v is not None for v in stored), largest=max(numbers, default=-1),
                      without=len(without), first_without=first,
                      names_a_class=all(n >= 0 for n, v in zip(numbers, stored, strict=True) if v is not None))


def _written(final: Path, data: bytes) -> Finished:
    tmp = partial_path(final)
    try:
        tmp.write_bytes(data)
    except OSError as e:
        discard(tmp)
        raise_if_disk_full(e, final)
        raise
    return Finished(((str(tmp), str(final)),))


@contextlib.contextmanager
def indexes_named_at_the_end() -> Iterator[list[AdoptedTar]]:
    """A list to adopt tar shards into: their DALI indexes are named beside them when the block ends
    well, and removed when it fails, so that a failed ``ddpipe index`` leaves no file of its own."""
    adopted: list[AdoptedTar] = []
    try:
        yield adopted
    except BaseException:
        for a in adopted:
            a.index.discard()
        raise
    Finished(tuple(f for a in adopted for f in a.index.files)).commit()


def tars_manifest(adopted: Sequence[AdoptedTar], classes: list[str] | None,
                  where: str | os.PathLike[str]) -> Manifest:
    """The manifest of tar shards adopted: class names from ``classes``, else from the largest integer
    ``cls`` value found. Samples without a class number (no ``cls`` among labelled samples, -1, or a
    name) leave the classes unnamed, with an :class:`~ddpipe.errors.UnlabelledSamplesWarning`."""
    samples = sum(a.shard.samples for a in adopted)
    labelled = any(a.labelled for a in adopted)
    # no labels, or some not class numbers: naming classes is left to the user
    unnamed = not labelled or not all(a.names_a_class for a in adopted)
    largest = max(a.largest for a in adopted)
    named = tuple(classes or ()) if unnamed else named_classes(largest, samples, classes, where)
    without = sum(a.without for a in adopted)
    if labelled and without:  # a labelled dataset, some of whose samples have no class number
        first = next(a for a in adopted if a.first_without is not None)
        assert first.first_without is not None
        key, value = first.first_without
        what = "no .cls" if value is None else f".cls {value!r}"
        left = "the classes are left unnamed, and " if unnamed else ""
        warnings.warn(f"{without} of {samples} samples have no class number (the first: {key!r} in "
                      f"{first.shard.file}, {what}): {left}training skips or refuses those samples (--on-error)",
                      UnlabelledSamplesWarning, stacklevel=3)
    fields = sorted(set().union(*(a.fields for a in adopted)))
    return Manifest(format="wds", fields=tuple(fields), classes=named, shards=tuple(a.shard for a in adopted))


def tar_names(names: Iterable[str]) -> list[str]:
    """The tar shards among a directory's (or a prefix's) entries, in the manifest's order: those at its
    top, not hidden."""
    return sorted(n for n in names if n.endswith(".tar") and "/" not in n and not n.startswith("."))


def index_tars(directory: str | os.PathLike[str], *, classes: list[str] | None = None,
               out: str | os.PathLike[str] | None = None) -> Manifest:
    """Write ``index.json`` (and DALI ``.idx`` files) for the ``*.tar`` shards in ``directory``; with
    ``out``, only ``out/index.json``, naming ``directory``, and nothing in ``directory`` (the shards'
    readers scan their headers, as DALI's indexer does).

    Class names come from ``classes``, else from the manifest already where this one goes, else from
    the largest integer ``cls`` value found (see :func:`tars_manifest`).
    """
    if is_remote(directory):  # Path() made "s3:/bucket/..." of it
        raise OptionError("index_tars adopts a local directory: `ddpipe index s3://bucket/prefix` adopts tars in a "
                          "bucket", path=directory)
    if out is not None and is_remote(out):
        raise OptionError("out is a local directory for index.json (without it, index.json goes beside the tars)",
                          path=out)
    root = Path(directory)
    if not root.is_dir():
        raise DdpipeError("not a directory", path=root)
    out_dir = None if out is None else Path(out)
    refuse_read_only(root, out_dir)
    refuse_a_dataset_ddpipe_wrote(root, out_dir)
    classes = given_or_recorded(classes, root, out_dir)
    tars = tar_names(p.name for p in root.glob("*.tar"))
    if not tars:
        raise DdpipeError("no .tar shards found", path=root)
    with indexes_named_at_the_end() as adopted:
        for name in tars:
            adopted.append(adopt_tar(root / name, index=out_dir is None))
        # within: a manifest that cannot be written leaves no DALI index named either
        return write_adopted(root, out_dir, tars_manifest(adopted, classes, root))


def _as_int(label: bytes | None) -> int:
    """A ``cls`` value as a class index; -1 where it is missing or not an integer."""
    if label is None:
        return -1
    try:
        return label_of({"cls": label})
    except ValueError:
        return -1
