"""``write_dataset``: any iterable of samples -> a dataset, for data made in code rather than on disk."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..checksum import file_checksum
from ..errors import ConversionConflictError, SampleError
from ..formats import ShardWriter, get_format
from ..manifest import MANIFEST_NAME, Manifest, ShardInfo, label_runs, numbered_class_limit, save_manifest
from ..sample import KEY, Sample, class_of


def write_dataset(out: str | os.PathLike[str], samples: Iterable[Sample], *, format: str = "wds",
                  samples_per_shard: int = 1000, classes: Iterable[str] = ()) -> Manifest:
    """Write ``samples`` in order, ``samples_per_shard`` to a shard; the manifest comes last."""
    if samples_per_shard < 1:
        raise ValueError("samples_per_shard must be at least 1")
    root = Path(out)
    if (root / MANIFEST_NAME).exists():
        raise ConversionConflictError("already holds a dataset", path=root)
    root.mkdir(parents=True, exist_ok=True)
    fmt = get_format(format)
    shards: list[ShardInfo] = []
    fields: set[str] = set()
    writer = None
    labels: list[int] = []
    names = tuple(classes)
    for written, sample in enumerate(samples):
        try:
            label = _label(sample, names, written + 1)
        except SampleError:  # refused before it is written
            if writer is not None:
                writer.abort()
            raise
        if writer is None:
            writer = fmt.writer(root / f"shard-{len(shards):06d}{fmt.suffix}")
        try:
            writer.write(sample)
        except BaseException:
            writer.abort()
            raise
        fields.update(k for k in sample if k != KEY)
        labels.append(label)
        if writer.count == samples_per_shard:
            shards.append(_commit(writer, labels))
            writer, labels = None, []
    if writer is not None:
        shards.append(_commit(writer, labels))
    manifest = Manifest(format, tuple(sorted(fields)), names, tuple(shards))
    save_manifest(root, manifest)
    return manifest


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


def _commit(writer: ShardWriter, labels: list[int]) -> ShardInfo:
    path = writer.commit()
    return ShardInfo(path.name, writer.count, path.stat().st_size, file_checksum(path), label_runs(labels))
