"""A host that freezes (every process stopped) is named and the job ends within a minute; a host that
is merely slow is waited for. Two real hosts (tests/hosts/ssh-ns), with the default timeout and
silence a user gets."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ..conftest import mpiexec, mpiexec_command, mpiexec_env
from ..helpers import make_dataset

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("frozen_worker.py")


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_frozen_host_is_named_and_the_job_ends_within_a_minute(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "wds", "wds", [40] * 8, payload=2000)
    job = subprocess.Popen(mpiexec_command(4, WORKER, data, "freeze", hosts=2), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=mpiexec_env(), start_new_session=True)
    frozen: list[int] = []
    try:
        assert job.stdout is not None
        said = ""
        while len(ready := re.findall(r"ready (\d+) (\d+) (mnode\d)", said)) < 4:  # two ranks' lines may merge
            line = job.stdout.readline()
            assert line, said  # the job runs until stopped: it ends only by failing
            said += line
        ranks = [int(pid) for _, pid, host in ready if host == "mnode2"]
        assert len(ranks) == 2, said
        frozen = [*ranks, parent(ranks[0])]  # the host's ranks and its MPI proxy: the whole host stops
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        _, err = job.communicate(timeout=120)  # a hang bound; the promise is checked below
        took = time.monotonic() - stopped
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    assert job.returncode != 0
    assert "host mnode2 (ranks 2, 3)" in err and "no sign of life" in err, err
    assert took < 60, f"the job ended {took:.0f} s after its host froze"


def test_a_slow_host_is_waited_for_longer_than_a_frozen_one_would_be(tmp_path: Path) -> None:
    """The other host's ranks wait 70 s in one exchange round, past the silence a frozen host gets,
    and the epoch finishes with every sample."""
    data = make_dataset(tmp_path / "wds", "wds", [20] * 4, payload=2000)  # a shard per rank: one slow open each
    proc = mpiexec(4, WORKER, data, "slow", hosts=2, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "done 80" in proc.stdout, proc.stdout + proc.stderr
