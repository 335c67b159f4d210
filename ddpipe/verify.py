"""``ddpipe verify``: check a dataset against its manifest, and optionally decode every image."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from .checksum import file_checksum
from .dataset import Dataset
from .decode.spec import IMAGE_FIELDS, decode_check
from .errors import DdpipeError
from .formats.tar import check_dali_index
from .manifest import load_manifest
from .sample import KEY

# format -> checks of the files kept beside each shard, which the manifest's checksum does not cover
_SIDECAR_CHECKS: dict[str, tuple[Callable[[Path], None], ...]] = {"wds": (check_dali_index,)}



@dataclass
class VerifyReport:
    shards: int = 0
    samples: int = 0
    bytes: int = 0
    decoded: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _samples(dataset: Dataset, shard: int) -> Iterator[dict[str, object]]:
    with dataset.open_shard(shard) as reader:
        yield from reader.scan()


def verify_dataset(path: str | os.PathLike[str], *, decode: bool = False, progress: bool = True) -> VerifyReport:
    """Check every shard: present, of the recorded size and checksum, with the recorded sample count;
    with ``decode``, that every image field decodes. Problems are collected, not raised."""
    dataset = Dataset(path, load_manifest(path))
    report = VerifyReport()
    shards = dataset.manifest.shards
    with tqdm(shards, unit="shard", desc="verify", disable=not progress, dynamic_ncols=True) as bar:
        for i, info in enumerate(bar):
            report.shards += 1
            shard_path = dataset.root / info.file
            try:
                dataset.check_files_of(i)
                actual = file_checksum(shard_path)
                if actual != info.checksum:
                    report.problems.append(f"{shard_path}: checksum mismatch: index.json says {info.checksum}, "
                                           f"file hashes to {actual}")
                    continue
                for sidecar_check in _SIDECAR_CHECKS.get(dataset.manifest.format, ()):
                    sidecar_check(shard_path)
                count = 0
                for sample in _samples(dataset, i):
                    count += 1
                    if decode:
                        for name in (f for f in IMAGE_FIELDS if f in sample):
                            try:
                                decode_check(sample[name])  # type: ignore[arg-type]
                                report.decoded += 1
                            except (OSError, ValueError, SyntaxError) as e:
                                report.problems.append(
                                    f"{shard_path}: sample {sample[KEY]!r} field {name!r} does not decode: {e}")
                report.samples += count
                report.bytes += info.bytes
            except DdpipeError as e:
                report.problems.append(str(e))
    return report
