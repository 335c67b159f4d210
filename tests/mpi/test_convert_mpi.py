"""The MPI-split conversion with real ranks: the same bytes as one process."""

from __future__ import annotations

import json
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


def test_an_output_on_each_node_of_its_own_is_refused_before_a_shard_is_written(raw_images: Path) -> None:
    """Two real hosts (tests/hosts/ssh-ns), each with a directory of its own at the output's path: mnode2's
    ranks failed writing their first shard's record, and said only that that file did not exist."""
    out = "/dev/shm/ddpipe-test-convert"
    setup = {"mnode1": [["mkdir", out]], "mnode2": [["mkdir", out]]}
    proc = mpiexec(4, Path(__file__).parents[1] / "hosts" / "on_hosts.py", json.dumps(setup), "convert", raw_images,
                   out, "--samples-per-shard", "5", "--quiet", timeout=200, hosts=2)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    said = (f"{out}: not seen from mnode2 as rank 0 left it (with index.json or plan.json): give an output every node "
            "sees (a shared file system), or an s3:// prefix")
    # every rank raises it (the ranks agreed that rank 2 failed): rank 0 says it for the job, naming rank 2
    assert proc.stderr == f"ddpipe: error: rank 2 failed: {said}\n", proc.stderr
    assert ".shard-" not in proc.stderr
