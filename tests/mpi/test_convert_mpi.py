"""The MPI-split conversion with real ranks: the same bytes as one process."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpipe.convert import ConvertOptions, convert

from ..conftest import dir_bytes, mpiexec

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [2, 3])
def test_mpi_split_matches_single_process(raw_images: Path, tmp_path: Path, ranks: int) -> None:
    convert(raw_images, tmp_path / "single", ConvertOptions(format="lmdb", samples_per_shard=5, seed=2, progress=False))
    proc = mpiexec(ranks, "-m", "ddpipe", "convert", raw_images, tmp_path / "mpi", "--format", "lmdb",
                   "--samples-per-shard", "5", "--seed", "2", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("5 shards, 24 samples") == 1  # rank 0 reports for the job
    assert dir_bytes(tmp_path / "mpi") == dir_bytes(tmp_path / "single")


def test_a_failing_rank_fails_every_rank(raw_copy: Path, tmp_path: Path) -> None:
    bad = sorted(raw_copy.rglob("*.jpg"))[7]  # shard 1: written by rank 1
    bad.write_bytes(b"garbage")
    proc = mpiexec(2, "-m", "ddpipe", "convert", raw_copy, tmp_path / "o", "--samples-per-shard", "5", "--quiet",
                   timeout=120)
    assert proc.returncode != 0
    assert bad.name in proc.stderr and "rank 1 failed" in proc.stderr
    assert not (tmp_path / "o" / "index.json").exists()
