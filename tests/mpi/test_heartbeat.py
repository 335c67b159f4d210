"""Heartbeats between two real hosts (tests/hosts/ssh-ns): a rank that leaves closes its links, so
that no beat is left unreceived at MPI_Finalize (UCX warned of each across hosts), and the rank after
it tells its exit from a freeze."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..conftest import mpiexec

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("heartbeat_worker.py")


def test_ranks_that_leave_one_after_another_leave_no_beat_unreceived() -> None:
    proc = mpiexec(4, WORKER, "staggered", hosts=2, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.split("\n")[:-1]) == [f"bye {r}" for r in range(4)], proc.stdout
    assert "not matched" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_the_rank_after_one_that_left_names_its_exit_not_a_freeze() -> None:
    proc = mpiexec(2, WORKER, "outlived", hosts=2, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = r"^reason 1: rank 0 \(host mnode1\), which left the job \d+ s ago$"
    assert re.search(said, proc.stdout, re.M), proc.stdout
    assert "not matched" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
