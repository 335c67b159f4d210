"""A rank's shards are written one after another while a thread of the process flushes, names and
records each one finished: the writer does not wait for the disk, and no more shards wait than there
are workers."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from ddpipe.convert import ConvertOptions, convert, shard_job, shard_runner
from ddpipe.convert.shard_job import ShardJob, ShardResult
from ddpipe.errors import DiskFullError

from ..conftest import dir_bytes

HANG = 60  # seconds: far past a shard of five small images


def shard_number(job: ShardJob) -> int:
    return int(Path(job.shard_path).stem.rsplit("-", 1)[1])


def test_a_shard_is_published_while_the_next_is_written(raw_images: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    shards = -(-len(list(raw_images.rglob("*.jpg"))) // 5)
    started = [threading.Event() for _ in range(shards)]
    events: list[tuple[str, int]] = []
    write, publish = shard_job.write_shard, shard_job.publish

    def writing(job: ShardJob, *args: object, **kwargs: object) -> ShardResult:
        events.append(("write", shard_number(job)))
        started[shard_number(job)].set()
        return write(job, *args, **kwargs)  # type: ignore[arg-type]

    def publishing(job: ShardJob, result: ShardResult) -> ShardResult:
        k = shard_number(job)
        assert not Path(job.shard_path).exists()  # the writer left it under its hidden name
        # held until the next shard is being written: were publishing in the writer's way, it never would be
        if k + 1 < shards and not started[k + 1].wait(HANG):
            raise AssertionError(f"shard {k + 1} was not written while shard {k} waited to be published")
        published = publish(job, result)
        events.append(("published", k))
        return published

    monkeypatch.setattr(shard_runner, "write_shard", writing)
    monkeypatch.setattr(shard_runner, "publish", publishing)
    out = tmp_path / "out"
    manifest = convert(raw_images, out, ConvertOptions(samples_per_shard=5, progress=False))
    assert [s.file for s in manifest.shards] == [f"shard-{k:06d}.tar" for k in range(shards)]
    for k in range(shards - 2):  # one shard waits at most: the one after next is begun once it is out
        assert events.index(("published", k)) < events.index(("write", k + 2))
    convert(raw_images, tmp_path / "plain", ConvertOptions(samples_per_shard=5, progress=False))
    assert dir_bytes(out) == dir_bytes(tmp_path / "plain")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_shard_that_cannot_be_flushed_fails_the_run_and_leaves_no_partial_file(
        raw_images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    """The disk fills as the third shard is flushed (ENOSPC from its fsync): the error names it, it is
    not left behind under any name, nor are shards finished after it, and a rerun completes."""
    fsync = os.fsync

    def full_at_the_third(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".shard-000002.tar.partial"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", full_at_the_third)
    out = tmp_path / "out"
    with pytest.raises(DiskFullError) as info:
        convert(raw_images, out, ConvertOptions(samples_per_shard=5, workers=workers, progress=False))
    assert str(info.value.path).endswith("shard-000002.tar")
    assert not [p.name for p in out.iterdir() if p.name.endswith(".partial")]
    assert not (out / "index.json").exists() and not (out / "shard-000002.tar").exists()
    if workers == 1:  # in order: the two before it were published
        assert {"shard-000000.tar", "shard-000001.tar"} <= {p.name for p in out.glob("shard-*.tar")}
    monkeypatch.setattr(os, "fsync", fsync)
    convert(raw_images, out, ConvertOptions(samples_per_shard=5, workers=workers, progress=False))
    convert(raw_images, tmp_path / "plain", ConvertOptions(samples_per_shard=5, progress=False))
    assert dir_bytes(out) == dir_bytes(tmp_path / "plain")
