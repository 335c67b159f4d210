"""A rank that dies or hangs during an exchange ends the job with a clear error, not a hang."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ..conftest import mpiexec
from ..helpers import make_dataset

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("fault_worker.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # large enough that the producers are still exchanging when rank 1 stops
    return make_dataset(tmp_path_factory.mktemp("faults") / "wds", "wds", [200] * 6, payload=2048)


def test_killed_rank_ends_the_job(data: Path) -> None:
    t0 = time.monotonic()
    proc = mpiexec(3, WORKER, data, "kill", "20", timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert elapsed < 60
    output = proc.stdout + proc.stderr
    assert "finished" not in output
    assert "BAD TERMINATION" in output and "signal 9" in output, output


def test_hung_rank_makes_the_others_abort(data: Path) -> None:
    t0 = time.monotonic()
    proc = mpiexec(3, WORKER, data, "hang", "5", timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert elapsed < 60
    assert "did not complete within 5 s: another rank died or hung; aborting the job" in proc.stderr, proc.stderr
    assert "exchange round" in proc.stderr
