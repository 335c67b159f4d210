"""A loader's exchange runs in a thread of its own while its caller goes on: the caller's collectives
on the communicator it handed the loader (ddpipe train's progress lines), and a second loader's
exchange, must never be matched with the first loader's. They were: ddpipe train on two ranks with a
partial shuffle of several rounds an epoch hung at its first progress line until the collective
timeout, and two loaders iterated together aborted in MPI ("Message truncated")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..conftest import mpiexec, torchrun
from ..helpers import make_dataset

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("beside_worker.py")


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("beside")
    return (make_dataset(root / "a", "wds", [200] * 12, payload=64),
            make_dataset(root / "b", "wds", [300] * 8, payload=96))


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_the_callers_collectives_and_a_second_loaders_never_meet_the_first_loaders(two: tuple[Path, Path],
                                                                                   launcher: str) -> None:
    proc = (mpiexec if launcher == "mpiexec" else torchrun)(2, WORKER, *two, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # the ranks' lines may run together in the launcher's output
    lines = sorted(re.findall(r"rank \d epoch \d: \d+ \d+ whole (?:True|False)", proc.stdout))
    # 2,400 samples of each over 2 ranks, 75 batches of 16 a rank
    assert lines == sorted(f"rank {r} epoch {e}: 1200 1200 whole True" for r in range(2) for e in range(3)), \
        proc.stdout
