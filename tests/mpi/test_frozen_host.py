"""A host that freezes (every process stopped) is named and the job ends (in ~25 s); a host that
is merely slow is waited for. Two real hosts (tests/hosts/ssh-ns), with the default timeout and
silence a user gets."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ..conftest import mpiexec, mpiexec_command, mpiexec_env
from ..helpers import make_dataset
from .freezing import WORKER, freeze_mnode2

pytestmark = pytest.mark.mpi


def test_a_frozen_host_is_named_and_the_job_ends_before_the_collective_timeout(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "wds", "wds", [40] * 8, payload=2000)
    job = freeze_mnode2(mpiexec_command(4, WORKER, data, "freeze", hosts=2), mpiexec_env())
    assert job.returncode != 0
    assert "host mnode2 (ranks 2, 3)" in job.stderr and "no sign of life" in job.stderr, job.stderr
    # a hang bound, not a speed: naming the host takes the 20 s of silence; without it the job would wait out
    # the 300 s collective timeout, or forever. Far from both, so that a loaded machine does not fail it
    assert job.seconds < 150, f"the job ended {job.seconds:.0f} s after its host froze"


def test_a_host_that_dies_ends_the_job_within_seconds(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "wds", "wds", [40] * 8, payload=2000)
    job = freeze_mnode2(mpiexec_command(4, WORKER, data, "freeze", hosts=2), mpiexec_env(), how=signal.SIGKILL)
    assert job.returncode != 0
    assert job.seconds < 30, f"the job ended {job.seconds:.0f} s after its host died"  # the launcher notices


def test_a_slow_host_is_waited_for_longer_than_a_frozen_one_would_be(tmp_path: Path) -> None:
    """The other host's ranks wait 70 s in one exchange round, past the silence a frozen host gets,
    and the epoch finishes with every sample."""
    data = make_dataset(tmp_path / "wds", "wds", [20] * 4, payload=2000)  # a shard per rank: one slow open each
    proc = mpiexec(4, WORKER, data, "slow", hosts=2, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "done 80" in proc.stdout, proc.stdout + proc.stderr
