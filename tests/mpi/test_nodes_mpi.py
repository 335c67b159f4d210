"""Several nodes on one machine, twice over: as MPI itself sees them (MPICH's cliques split the ranks
into nodes for MPI_COMM_TYPE_SHARED), and as real hosts (hydra's ssh launcher through
tests/hosts/ssh-ns: each host its own host name and /dev/shm, ranks talking over TCP). One staged
copy per node in each node's own directory, every sample once per epoch, equal batches, eviction per
node, the exchange crossing nodes, a mid-epoch state resumed on another node count, and node leaders
copying staged shards from each other."""

from __future__ import annotations

import collections
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ..conftest import mpiexec
from ..helpers import make_dataset

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("nodes_worker.py")
SHARDS, PER_SHARD, PAYLOAD = 12, 10, 2600
TOTAL = SHARDS * PER_SHARD
CAPACITY = 3 * PER_SHARD * (PAYLOAD + 1024)  # three shards of a node's six


@pytest.fixture(params=["cliques", "hosts"])
def place(request: pytest.FixtureRequest) -> str:
    """How the nodes are made: MPICH's cliques on one host, or real hosts (tests/hosts/ssh-ns)."""
    return str(request.param)


def on(place: str, nodes: int) -> dict[str, int]:
    return {"nodes": nodes} if place == "cliques" else {"hosts": nodes}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("nodes") / "wds", "wds", [PER_SHARD] * SHARDS, payload=PAYLOAD)


def launch(data: Path, tmp: Path, place: str, nodes: int, phase: str, *extra: str) -> list[dict[str, Any]]:
    out = tmp / f"{phase}-{nodes}.json"
    proc = mpiexec(2 * nodes, WORKER, data, tmp / "local" / "node{node}", out, phase, *extra, timeout=300,
                   **on(place, nodes))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report: list[dict[str, Any]] = json.loads(out.read_text())
    return report


def flat(batches: list[list[str]]) -> list[str]:
    return [k for b in batches for k in b]


@pytest.mark.parametrize("nodes", [2, 3])
def test_nodes_stage_one_copy_each_and_yield_every_sample_once(data: Path, tmp_path: Path, place: str,
                                                               nodes: int) -> None:
    report = launch(data, tmp_path, place, nodes, "run")
    by_node = collections.defaultdict(list)
    for r in report:
        by_node[r["node"]].append(r)
    assert sorted(by_node) == list(range(nodes)) and all(len(rs) == 2 for rs in by_node.values())
    dirs = {r["node"]: r["stage_dir"] for r in report}
    assert len(set(dirs.values())) == nodes  # a directory per node, named from {node}
    for node, ranks in by_node.items():
        assert {r["stage_dir"] for r in ranks} == {dirs[node]}
        assert f"node{node}" in dirs[node]
        leader, other = sorted(ranks, key=lambda r: r["local_rank"])
        assert other["copied"] == 0  # one copy per node: local rank 0 makes it
        assert leader["copied"] == len(leader["staged"])  # each of its shards once, kept for epoch 1
    staged = [s for r in report if r["local_rank"] == 0 for s in r["staged"]]
    assert len(staged) == len(set(staged)) == SHARDS  # sticky shares: each shard on exactly one node
    for epoch in range(2):
        per_rank = [r["epochs"][epoch] for r in report]
        assert len({len(b) for b in per_rank}) == 1  # equal batch counts
        seen = collections.Counter(k for b in per_rank for k in flat(b))
        assert len(seen) == TOTAL and sum(seen.values()) == len(report) * -(-TOTAL // len(report))
    assert all(r["cross_node_bytes"] > 0 for r in report)  # every rank sent samples to other nodes


def test_capacity_evicts_on_each_node(data: Path, tmp_path: Path, place: str) -> None:
    report = launch(data, tmp_path, place, 2, "run", str(CAPACITY))
    leaders = [r for r in report if r["local_rank"] == 0]
    for r in leaders:
        assert r["evicted"] > 0 and r["copied"] > len(r["staged"])  # evicted shards staged again
        assert len(r["staged"]) <= 3
    for epoch in range(2):
        seen = {k for r in report for k in flat(r["epochs"][epoch])}
        assert len(seen) == TOTAL


def test_a_state_from_two_nodes_resumes_on_three(data: Path, tmp_path: Path, place: str) -> None:
    first = launch(data, tmp_path, place, 2, "run")
    second = launch(data, tmp_path, place, 3, "resume")
    assert len(second) == 6 and len({r["node"] for r in second}) == 3
    before = [k for r in first for k in flat(r["part"])]
    after = [k for r in second for k in flat(r["rest"])]
    assert not set(before) & set(after)  # nothing twice
    assert set(before) | set(after) == {k for r in first for k in flat(r["epochs"][0])}  # nothing lost
    assert len({len(r["rest"]) for r in second}) == 1  # equal batches on the new nodes' ranks
    # peer staging: the new shares were staged from the nodes that held them, not all from the source
    leaders = [r for r in second if r["local_rank"] == 0]
    assert sum(r["peer_copied"] for r in leaders) > 0
    new_node = next(r for r in leaders if r["node"] == 2)  # its directory was empty: every shard from peers
    assert new_node["peer_copied"] == new_node["copied"] > 0
    for r in leaders:  # every copy, from a peer or the source, is the source's bytes
        for copy in Path(r["stage_dir"]).glob("*.tar"):
            assert copy.read_bytes() == (data / copy.name).read_bytes()


def test_a_peer_gives_its_copy_or_says_it_cannot(tmp_path: Path, place: str) -> None:
    import os

    (tmp_path / "shard.bin").write_bytes(os.urandom(20 << 20))  # more than one chunk
    proc = mpiexec(2, Path(__file__).with_name("peer_worker.py"), tmp_path, timeout=120, **on(place, 2))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the right bytes; a refusal when it no longer has them; other bytes refused by checksum; a timeout
    said = [w for w in proc.stdout.split() if w in ("fetched", "refused", "checked", "abandoned", "gone")]
    assert said == ["fetched", "refused", "checked", "abandoned", "gone"]  # (UCX may warn too)
    assert "copying from the source instead" in proc.stderr


def test_two_node_leaders_fetching_from_each_other_at_once_get_their_own_answers(tmp_path: Path, place: str) -> None:
    import os

    for rank in (0, 1):  # sizes that differ between the ranks, one over a chunk: a mixed-up answer shows
        for k, size in enumerate((1000 + rank, (9 << 20) + 7 * rank, 3 + rank)):
            (tmp_path / f"r{rank}-{k}.bin").write_bytes(os.urandom(size))
    proc = mpiexec(2, Path(__file__).with_name("peer_both_worker.py"), tmp_path, timeout=300, **on(place, 2))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0: 0 wrong" in proc.stdout and "rank 1: 0 wrong" in proc.stdout, proc.stdout + proc.stderr


def stage(data: Path, local_dir: str | Path, place: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``ddpipe stage`` on two nodes of two ranks each."""
    return mpiexec(4, "-m", "ddpipe", "stage", data, "--local-dir", local_dir, "--epochs", "2", "--quiet", *extra,
                   timeout=200, **on(place, 2))


def test_nodes_sharing_a_staging_directory_with_a_capacity_are_refused(data: Path, tmp_path: Path,
                                                                        place: str) -> None:
    """One directory that both nodes see (this machine's /tmp, for the hosts too): each node's capacity
    would evict the other's copies, and a job like this hung in three runs of five. Refused at start on
    every rank, in one line naming the directory, with nothing staged and no marker left behind."""
    shared = tmp_path / "stage"
    proc = stage(data, shared, place, "--capacity", str(CAPACITY))
    assert proc.returncode != 0
    assert f"ddpipe: error: nodes 0 and 1 stage into one directory, {shared} " in proc.stderr
    assert "Traceback" not in proc.stderr
    assert [p.name for p in shared.rglob("*") if p.is_file()] == []


def test_nodes_sharing_a_staging_directory_without_a_capacity_share_its_copies(data: Path, tmp_path: Path) -> None:
    shared = tmp_path / "stage"
    proc = stage(data, shared, "cliques")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    copies = sorted(p.name for p in shared.rglob("*.tar"))
    assert copies == sorted(p.name for p in data.glob("*.tar"))  # each node's share, once, side by side


def test_hosts_naming_one_directory_on_their_own_disks_may_have_a_capacity(data: Path) -> None:
    """The same name on every host, each host's own storage (its /dev/shm): not shared, not refused."""
    proc = stage(data, f"/dev/shm/ddpipe-test-{os.getpid()}", "hosts", "--capacity", str(CAPACITY))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "one directory" not in proc.stderr
