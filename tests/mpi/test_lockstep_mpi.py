"""A loader under a training loop whose steps end in a collective: a rank that has taken its batch
waits there for the others, while a rank still taking its batch may wait for an exchange round that
the waiting rank's exchange must reach. With small batches and a large shuffle buffer that round lay
further ahead than the hand-over to the consumer held (256 samples by default), and the job hung
until the collective timeout; the hand-over now holds the plan's lead (``RankPlan.lead``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ddpipe

from ..conftest import mpiexec
from ..helpers import make_dataset

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("lockstep_worker.py")


def test_a_training_loops_steps_in_lockstep_never_wait_on_the_exchange(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "ds", "wds", [1000] * 8, payload=16)
    options = ddpipe.PlanOptions(shuffle="partial", exchange_fraction=1.0, buffer_size=4096, batch_size=4)
    plan = ddpipe.plan_epoch(ddpipe.open_dataset(root).manifest, 2, 0, 0, options)
    assert max(r.lead for r in plan.ranks) > ddpipe.ReadOptions().prefetch  # the case that hung
    proc = mpiexec(2, WORKER, root, "4", "4096", timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = sorted(re.findall(r"rank \d epoch \d: \d+", proc.stdout))
    assert lines == sorted(f"rank {r} epoch {e}: 4000" for r in range(2) for e in range(2)), proc.stdout
