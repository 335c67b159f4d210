"""``write_dataset``: any iterable of samples -> a dataset, for data made in code rather than on disk."""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import ConversionConflictError, OptionError, SampleError, SourceError
from ..fields import whole_option
from ..formats import ShardFormat, ShardWriter, get_format
from ..manifest import MANIFEST_NAME, Manifest, ShardInfo, label_runs, numbered_class_limit, save_manifest
from ..sample import KEY, Sample, class_of
from ..storage.location import is_remote
from .adopt import refuse_unwritable_out


def _unmake(root: Path, made: bool) -> None:
    """Remove the output directory this call made, where nothing was finished in it."""
    if made and root.is_dir() and not any(root.iterdir()):
        root.rmdir()


def write_dataset(out: str | os.PathLike[str], samples: Iterable[Sample], *, format: str = "wds",
                  samples_per_shard: int = 1000, classes: Iterable[str] = ()) -> Manifest:
    """Write ``samples`` in order, ``samples_per_shard`` to a shard; the manifest comes last. A sample
    is a dict of ``__key__`` (a string) and fields of bytes; ``cls``, the class number, may be an int
    (stored as its text, as every shard holds it). Whatever stops the writing (a refused sample, an
    error raised by ``samples`` itself, Ctrl-C) leaves the shards finished before it and no part of
    the one under way, and no directory it made without finishing a shard in it. No sample at all is a
    :class:`~ddpipe.SourceError` (``ddpipe convert`` refuses an empty source too)."""
    whole_option(samples_per_shard, "samples_per_shard", 1)
    if isinstance(classes, (str, bytes)):  # its letters were taken as the class names
        raise OptionError(f"classes must be a list of class names, not the string {classes!r}")
    fmt = get_format(format)
    samples = iter(samples)  # not iterable: Python's TypeError, before a directory is made
    if is_remote(out):  # Path() took it for a local path: "s3:/bucket/..." was made here
        raise OptionError("write_dataset writes a local directory: write the dataset here, then `ddpipe convert DIR "
                          "s3://bucket/prefix` sends it into a bucket", path=out)
    root = Path(out)
    if (root / MANIFEST_NAME).exists():
        raise ConversionConflictError("already holds a dataset", path=root)
    refuse_unwritable_out(root, role="the output")
    made = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    shards: list[ShardInfo] = []
    fields: set[str] = set()
    writer = None
    labels: list[int] = []
    keys: set[object] = set()  # the shard's so far
    names = tuple(classes)
    try:
        for written, given in enumerate(samples):
            sample = _as_stored(given, written)
            label = _label(sample, names, written + 1)  # refused before it is written
            if writer is None:
                writer = fmt.writer(root / f"shard-{len(shards):06d}{fmt.suffix}")
                keys.clear()
            if sample.get(KEY) in keys:  # a tar's readers (webdataset's, DALI's) took two samples of one key for one
                raise SampleError("its key is an earlier sample's in the same shard: keys must be unique",
                                  key=str(sample[KEY]))
            writer.write(sample)
            keys.add(sample[KEY])
            fields.update(k for k in sample if k != KEY)
            labels.append(label)
            if writer.count == samples_per_shard:
                shards.append(_commit(fmt, writer, labels))
                writer, labels = None, []
        if writer is not None:
            shards.append(_commit(fmt, writer, labels))
            writer = None
    except BaseException:
        if writer is not None:
            writer.abort()
        _unmake(root, made)
        raise
    if not shards:  # an exhausted or filtered-out iterator: a dataset no loader can load
        _unmake(root, made)
        raise SourceError("no samples to write: the iterable yielded none", path=root)
    manifest = Manifest(format, tuple(sorted(fields)), names, tuple(shards))
    save_manifest(root, manifest)
    return manifest


def _as_stored(sample: Sample, position: int) -> Sample:
    """``sample`` with a ``cls`` given as a number as its text (what webdataset's writer does with one)."""
    if not isinstance(sample, dict):
        raise SampleError(f"sample {position} is a {type(sample).__name__}, not a dict of fields")
    value = sample.get("cls")
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return {**sample, "cls": b"%d" % int(value)}
    return sample


def _label(sample: Sample, names: tuple[str, ...], samples: int) -> int:
    """The sample's class: one of the ``names`` where they are given (:func:`~ddpipe.sample.class_of`);
    where none are, no more than a manifest takes unnamed, counting the ``samples`` so far."""
    key = str(sample.get(KEY))
    try:
        label = class_of(sample, len(names))
    except ValueError as e:
        raise SampleError(str(e), key=key) from None
    if label >= numbered_class_limit(samples):
        raise SampleError(f"cls {label} is too large to be a class index (the dataset is {samples} samples so far)",
                          key=key)
    return label


def _commit(fmt: ShardFormat, writer: ShardWriter, labels: list[int]) -> ShardInfo:
    path = writer.commit()
    checksum, digests = fmt.written_checksums(path)
    return ShardInfo(path.name, writer.count, path.stat().st_size, checksum, label_runs(labels), digests)
