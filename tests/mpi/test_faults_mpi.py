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
    assert elapsed < 60  # a hang bound, not a speed: it ends in ~1 s, the others' wait would be 300 s
    output = proc.stdout + proc.stderr
    assert "finished" not in output
    assert "BAD TERMINATION" in output and "signal 9" in output, output


def test_hung_rank_makes_the_others_abort(data: Path) -> None:
    t0 = time.monotonic()
    proc = mpiexec(3, WORKER, data, "hang", "5", timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert elapsed < 60  # a hang bound: the 5 s watchdog ends it in ~6 s; the hung rank alone never would
    assert "did not complete within 5 s: another rank died or hung; aborting the job" in proc.stderr, proc.stderr
    assert "exchange round" in proc.stderr


def test_an_error_on_one_rank_ends_the_whole_job_at_once(tmp_path: Path) -> None:
    """A corrupt image on one rank's share: that rank names it, and the other does not wait for it in
    its next collective until the watchdog's timeout."""
    import numpy as np

    import ddpipe

    from ..decode.images import labelled_samples

    samples = labelled_samples(32, np.random.default_rng(4))
    samples[20]["jpg"] = b"not a jpeg at all"  # in the second of two shards: one rank's share
    ddpipe.write_dataset(tmp_path / "d", iter(samples), samples_per_shard=16, classes=[str(c) for c in range(6)])
    t0 = time.monotonic()
    proc = mpiexec(2, "-m", "ddpipe", "train", tmp_path / "d", "--model", "smallcnn", "--batch-size", "4",
                   "--image-size", "32", "--decode", "dali-cpu", "--device", "cpu", "--shuffle", "none",
                   timeout=120)
    assert proc.returncode != 0
    assert "img/0020" in proc.stderr and "shard-000001" in proc.stderr
    assert time.monotonic() - t0 < 60  # not the 300 s watchdog
