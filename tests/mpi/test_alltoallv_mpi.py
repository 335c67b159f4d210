"""The exchange's transfer on real ranks, as one node and as several: a node's ranks read each
other's segments straight from the sender's buffers (or, where they may not, copy them out of its
shared send slot), the rest go through MPI; either way every byte arrives, the slots grow when a
round outgrows them, and a segment received stays intact while later rounds run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import mpiexec

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("alltoallv_worker.py")


@pytest.mark.parametrize(("ranks", "nodes", "how"), [(3, None, "cross-memory"), (3, None, "slots"),
                                                     (4, 2, "cross-memory"), (5, 5, "cross-memory")])
def test_every_byte_arrives(tmp_path: Path, ranks: int, nodes: int | None, how: str) -> None:
    out = tmp_path / "report.json"
    proc = mpiexec(ranks, WORKER, out, 12, how, nodes=nodes, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert len(report) == ranks
    alone = nodes == ranks  # a rank alone on its node has no node peers, no slots, nothing to read
    assert all((r["slot_bytes"] > 0) != alone for r in report)
    assert all(r["cross_memory"] == (how == "cross-memory" and not alone) for r in report)
    assert len({r["slot_bytes"] for r in report if r["node"] == 0}) == 1  # one size on a node
