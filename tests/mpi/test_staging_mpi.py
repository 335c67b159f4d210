"""Staging with real ranks: one copy per node, made by local rank 0, every sample once per epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import mpiexec
from ..helpers import make_dataset

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("stage_worker.py")


@pytest.mark.parametrize(("ranks", "capacity"), [(3, None), (2, 3 * 13 * 2600)])
def test_one_copy_per_node_and_exactly_once(tmp_path: Path, ranks: int, capacity: int | None) -> None:
    data = make_dataset(tmp_path / "src", "wds", [13] * 8, payload=2048)
    out = tmp_path / "report.json"
    args = [data, tmp_path / "stage", out] + ([str(capacity)] if capacity else [])
    proc = mpiexec(ranks, WORKER, *args, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert [r["local_rank"] for r in report] == list(range(ranks))  # one node here
    assert all(r["copied"] == 0 for r in report[1:])  # only local rank 0 copies
    if capacity is None:
        assert report[0]["copied"] == 8  # each shard once, and reused by the second (sticky) epoch
    else:
        assert report[0]["copied"] > 8  # the share does not fit: evicted shards come back next epoch
    for epoch in range(2):
        seen = [k for r in report for k in r["epochs"][epoch]]
        assert len(set(seen)) == 104  # every sample, every epoch
        assert len(seen) == ranks * -(-104 // ranks)  # and copies only as the documented padding
