"""``ddpipe verify``: check a dataset against its manifest, and optionally decode every image."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from .checksum import file_checksum, sample_digest
from .dataset import Dataset, dataset_at
from .decode.spec import decode_check, is_image_field, no_image
from .errors import DdpipeError
from .formats.tar_index import check_dali_index
from .sample import KEY, Sample, class_of
from .shard_check import check_shard_file
from .storage.location import is_remote

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


def verify_dataset(path: str | os.PathLike[str], *, decode: bool = False, progress: bool = True,
                   stage_dir: str | os.PathLike[str] | None = None) -> VerifyReport:
    """Check every shard: present, of the recorded size and checksum, with the recorded sample count
    (and each sample's digest, where the manifest records them), each sample's label a class the
    manifest names and the one its label runs record;
    with ``decode``, that every image field decodes. With ``stage_dir``, check instead the copies of
    this dataset staged there (those staged: a partial stage is not a problem), named as the job named
    it: ``"auto"``, ``$VAR`` and ``{host}`` as on this machine, and with ``{node}`` every node's
    directory this machine can see. Problems are collected, not raised."""
    if stage_dir is not None:  # "" was the working directory, a URL a local "s3:/b/x", each "nothing staged"
        from .staging.options import stage_dir_option

        stage_dir_option(stage_dir)
    dataset = dataset_at(path)
    report = VerifyReport()
    shards = list(enumerate(dataset.manifest.shards))
    where: list[tuple[int, Path | None]] = [(i, None) for i, _ in shards]  # the dataset's own: fetched as checked
    if stage_dir is not None:
        where = _staged_copies(dataset, stage_dir)
        if not where:
            report.problems.append(f"{stage_dir}: nothing of this dataset is staged there")
            return report
    with tqdm(where, unit="shard", desc="verify", disable=not progress, dynamic_ncols=True) as bar:
        for i, shard_path in bar:
            report.shards += 1
            try:
                _check_shard(dataset, i, shard_path or dataset.local_copy(i), decode, report)
            except DdpipeError as e:
                if e.path is not None and not is_remote(e.path):  # the object, not its copy fetched for the check
                    e.path = dataset.source_name(Path(e.path))
                report.problems.append(str(e))
            except OSError as e:  # unreadable (its permissions, say): a problem of this shard, not the end of the check
                named = dataset.source_name(Path(e.filename)) if e.filename else dataset.manifest.shards[i].file
                report.problems.append(f"{named}: {e.strerror or e}")
    return report


def _staged_copies(dataset: Dataset, stage_dir: str | os.PathLike[str]) -> list[tuple[int, Path | None]]:
    """Each staged copy of the dataset's shards under the directories ``stage_dir`` names, by shard."""
    from .staging.local_dir import visible_local_dirs
    from .staging.options import dataset_stage_dir

    copies: list[tuple[int, Path | None]] = []
    for node_dir in visible_local_dirs(stage_dir, socket.gethostname(), os.environ):
        staged = dataset_stage_dir(node_dir, dataset)
        copies += [(i, staged / info.file) for i, info in enumerate(dataset.manifest.shards)
                   if (staged / info.file).exists()]
    return copies


def _check_shard(dataset: Dataset, i: int, shard_path: Path, decode: bool, report: VerifyReport) -> None:
    info = dataset.manifest.shards[i]
    shown = dataset.source_name(shard_path)  # an object's URL rather than its fetched copy's path
    check_shard_file(dataset.format, info, shard_path)
    actual = file_checksum(shard_path)
    if actual != info.checksum:
        report.problems.append(f"{shown}: checksum mismatch: index.json says {info.checksum}, "
                               f"file hashes to {actual}")
        return
    for sidecar_check in _SIDECAR_CHECKS.get(dataset.manifest.format, ()):
        sidecar_check(shard_path)
    count = 0
    digests = dataset.sample_digests(i)
    # what plan scores shuffles by and train sizes its model by: they must be the samples' own
    recorded = [c for c, n in info.labels for _ in range(n)] if info.labels else None
    disagreeing: list[str] = []
    with dataset.format.reader(shard_path) as reader:
        for sample in reader.scan():
            if digests is not None and count < len(digests) and sample_digest(sample) != digests[count]:
                report.problems.append(f"{shown}: sample {count} ({sample[KEY]!r}) differs from its digest "
                                       "in index.json")
                count += 1
                continue  # never parsed: a record that changed is not read
            sample = reader.parse(sample)
            count += 1
            try:  # the loader would stop at it, or skip it
                label = class_of(sample, len(dataset.manifest.classes))
            except ValueError as e:
                report.problems.append(f"{shown}: sample {sample[KEY]!r}: {e}")
            else:
                if recorded is not None and count <= len(recorded) and label != recorded[count - 1]:
                    disagreeing.append(f"sample {sample[KEY]!r} is class {label}, they say {recorded[count - 1]}")
            if decode:
                _decode_images(shown, sample, report)
    if disagreeing:  # the first, and how many: a shifted run makes every sample after it disagree
        more = f" (and {len(disagreeing) - 1} more)" if len(disagreeing) > 1 else ""
        report.problems.append(f"{shown}: index.json's labels disagree with the samples': {disagreeing[0]}{more}")
    if count != info.samples:
        report.problems.append(f"{shown}: holds {count} samples, index.json says {info.samples}")
    report.samples += count
    report.bytes += info.bytes


def _decode_images(shown: str, sample: Sample, report: VerifyReport) -> None:
    """Decode each image of ``sample`` (of the shard ``shown``) whole, as ``verify --decode`` does: one that
    does not, or a sample without one, is a problem the loader would stop at, or skip."""
    images = [f for f in sample if is_image_field(f)]
    if not images:
        report.problems.append(f"{shown}: sample {sample[KEY]!r}: {no_image(sample)}")
    for name in images:
        try:
            decode_check(sample[name])
            report.decoded += 1
        except (OSError, ValueError, SyntaxError) as e:
            report.problems.append(f"{shown}: sample {sample[KEY]!r} field {name!r} does not decode: {e}")
