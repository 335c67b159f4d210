"""The exchange's transfer on real ranks, as one node and as several: segments for the ranks of a
node land in the place their receiver offered (or, larger, go through the sender's shared send
slot), the rest go through MPI; either way every byte arrives, the slots grow when a round outgrows
them, and a segment received stays intact while later rounds run, whichever way it came; a rank
that waits for the others does the caller's work meanwhile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import mpiexec

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("alltoallv_worker.py")


@pytest.mark.parametrize(("ranks", "nodes"), [(3, None), (4, 2), (5, 5)])
def test_every_byte_arrives_through_slots_and_mpi(tmp_path: Path, ranks: int, nodes: int | None) -> None:
    out = tmp_path / "report.json"
    proc = mpiexec(ranks, WORKER, out, "12", nodes=nodes, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert len(report) == ranks
    alone = nodes == ranks  # a rank alone on its node has no node peers and no slots
    assert all((r["slot_bytes"] > 0) != alone for r in report)
    assert len({r["slot_bytes"] for r in report if r["node"] == 0}) == 1  # one size on a node
    # node peers' segments of the steady rounds landed in their receivers' zones, uncopied, some
    # written there by their senders before the call
    assert all((r["landed_bytes"] > 0) != alone for r in report)
    assert all((r["written"] > 0) != alone for r in report)
    # a rank waiting for the others does the caller's work meanwhile, until the work says it is done
    assert 1 <= report[0]["waiting_steps"] <= 3
    assert all(r["waiting_steps"] == 0 for r in report[1:])


def test_without_shared_memory_to_spare_segments_go_through_mpi(tmp_path: Path) -> None:
    """Where /dev/shm has little room left (a container's), ranks make no send slots and no landing
    zones, whose pages would end them with SIGBUS once touched beyond it: every byte still arrives."""
    out = tmp_path / "report.json"
    proc = mpiexec(3, WORKER, out, "12", "small-shm", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert all(r["slot_bytes"] == 0 and r["landed_bytes"] == 0 and r["written"] == 0 for r in report)
