"""Reading in a process of its own (``read_in="process"``) on every rank under mpiexec: the same
batches as threads give, exchange rounds relayed through each rank's parent, staged copies, a rank
that stops early or reads apart before the others start, and a reading process killed mid-exchange."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import mpiexec
from .ranks import TINY_DALI, indexed_samples, ranks_report

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(("ranks", "nodes", "shuffle", "received_area"),
                         [(2, None, "local", None), (2, None, "partial", None), (3, 2, "partial", None),
                          (2, None, "partial", 6000)])
def test_reading_in_a_process_on_each_rank_gives_the_threads_batches(tmp_path: Path, ranks: int, nodes: int | None,
                                                                     shuffle: str, received_area: int | None) -> None:
    """Under mpiexec, MPI set up in every rank, each rank's reading process (read_in="process") reads
    that rank's share and, for ``partial``, exchanges half its samples with the other ranks' reading
    processes through its parent (within a node and between nodes): every rank's batches, labels and
    pixels, are the ones its threads give, every sample is read, and samples did cross. A received
    area of ``received_area`` bytes (a few rounds') makes rounds take places freed by earlier ones
    while batches still use others, and some find no room and come through the connection."""
    import ddpipe

    data = tmp_path / "ds"
    ddpipe.write_dataset(data, iter(indexed_samples(40)), samples_per_shard=4)
    out = tmp_path / "out.json"
    small = (f"import ddpipe.comm.relay as relay; relay.received_area_bytes = lambda area, batches: {received_area}\n"
             if received_area is not None else "")
    code = (small + "import json, sys, ddpipe; from ddpipe.comm import init_comm; c = init_comm(timeout=60); "
            f"o = dict({TINY_DALI}, shuffle={shuffle!r}, exchange_fraction=0.5, round_size=4, comm=c); "
            "got = {}; sent = {}\n"
            "for m in ('thread', 'process'):\n"
            "    with ddpipe.Loader(sys.argv[1], 3, read_in=m, **o) as ld:\n"
            "        got[m] = [[[y.tolist(), float(x.double().sum())] for x, y in ld]\n"
            "                  for e in range(2) if ld.set_epoch(e) or True]\n"
            "        x = ld.stats.read.exchange; sent[m] = x.samples_sent if x else 0\n"
            "r = c.allgather({'got': got, 'sent': sent})\n"
            "c.world.rank == 0 and open(sys.argv[2], 'w').write(json.dumps(r))")
    proc = mpiexec(ranks, "-c", code, data, out, timeout=200, nodes=nodes)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert all(r["got"]["process"] == r["got"]["thread"] for r in report)
    for epoch in range(2):
        assert {y for r in report for labels, _ in r["got"]["process"][epoch] for y in labels} == set(range(40))
    sent = [r["sent"] for r in report]
    assert all(s["process"] == s["thread"] for s in sent)
    assert all(s["process"] > 0 for s in sent) == (shuffle == "partial")


def test_reading_processes_that_stop_mid_epoch_never_hang_and_resume_with_the_rest(tmp_path: Path) -> None:
    """With ``partial`` read in processes, a rank that leaves its epoch early still takes part in the
    exchange rounds through its parent while the others read on (each rank here breaks at a batch
    of its own, and the next epoch is whole), and a loader that breaks on every rank at the same
    batch resumes, in a fresh one, with exactly the samples not yet yielded."""
    import ddpipe

    data = tmp_path / "ds"
    ddpipe.write_dataset(data, iter(indexed_samples(60)), samples_per_shard=5)
    out = tmp_path / "out.json"
    code = ("import json, sys, ddpipe; from ddpipe.comm import init_comm; c = init_comm(timeout=60); r = c.world.rank\n"
            "def loader(seed):\n"
            f"    return ddpipe.Loader(sys.argv[1], 3, {TINY_DALI}, shuffle='partial', seed=seed,\n"
            "        exchange_fraction=0.5, round_size=4, buffer_size=4, read_in='process', comm=c)\n"
            "report = {'apart': [], 'resumed': []}\n"
            "with loader(7) as ld:\n"
            "    for b, (_, y) in enumerate(ld):\n"
            "        if b == r: break\n"
            "    ld.set_epoch(1); report['apart'] = [v for _, y in ld for v in y.tolist()]\n"
            "for stop_at in (0, 2):\n"
            "    seen = []\n"
            "    with loader(stop_at) as ld:\n"
            "        for b, (_, y) in enumerate(ld):\n"
            "            seen += y.tolist()\n"
            "            if b == stop_at: state = ld.state_dict(); break\n"
            "    with loader(stop_at) as fresh:\n"
            "        fresh.load_state_dict(state); seen += [v for _, y in fresh for v in y.tolist()]\n"
            "    report['resumed'].append(seen)\n"
            "g = c.allgather(report); r == 0 and open(sys.argv[2], 'w').write(json.dumps(g))")
    report = ranks_report(3, code, data, out)
    assert {v for r in report for v in r["apart"]} == set(range(60))
    for trial in range(2):
        assert {v for r in report for v in r["resumed"][trial]} == set(range(60))


@pytest.mark.parametrize("nodes", [1, 2])
def test_reading_processes_read_their_nodes_staged_copies(tmp_path: Path, nodes: int) -> None:
    """Staging with ``partial`` read in processes, on one node and on two: local rank 0's training
    process copies each of its node's shards once, the reading processes read the copies, and
    every rank's batches are the ones its threads give, epoch after epoch."""
    import ddpipe

    data = tmp_path / "ds"
    ddpipe.write_dataset(data, iter(indexed_samples(48)), samples_per_shard=4)
    out = tmp_path / "out.json"
    code = ("import json, sys, ddpipe; from ddpipe.comm import init_comm; c = init_comm(timeout=60)\n"
            "got, copied = {}, {}\n"
            "for m in ('thread', 'process'):\n"
            f"    with ddpipe.Loader(sys.argv[1], 3, {TINY_DALI}, shuffle='partial', read_in=m, comm=c,\n"
            "            exchange_fraction=0.5, round_size=4, stage_dir=sys.argv[2] + '/' + m + '/{node}') as ld:\n"
            "        got[m] = [[y.tolist() for _, y in ld] for e in range(2) if ld.set_epoch(e) or True]\n"
            "        copied[m] = ld.stager.stats['copied'] + ld.stager.stats['peer_copied']\n"
            "r = c.allgather({'got': got, 'copied': copied, 'node': c.world.node, 'local': c.world.local_rank})\n"
            "c.world.rank == 0 and open(sys.argv[3], 'w').write(json.dumps(r))")
    proc = mpiexec(4, "-c", code, data, tmp_path / "stage", out, timeout=200, nodes=nodes)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert all(r["got"]["process"] == r["got"]["thread"] for r in report)
    for epoch in range(2):
        assert {y for r in report for b in r["got"]["process"][epoch] for y in b} == set(range(48))
    for r in report:  # local rank 0 of each node copies; its node's ranks read only that
        assert (r["copied"]["process"] > 0) == (r["local"] == 0) and r["copied"]["process"] == r["copied"]["thread"]
    for node in range(nodes):
        assert len(list((tmp_path / "stage" / "process" / str(node)).glob("*/*.tar"))) > 0


def test_a_reading_process_killed_mid_exchange_ends_the_job_naming_it(tmp_path: Path) -> None:
    """Rank 1's reading process is killed after its first batch, while the others exchange on: rank 1
    says so (in this epoch, or as the next starts, if it had read this one whole by then) and the
    job ends at once, not at the watchdog's timeout (the other ranks' relays wait in a round that
    rank will never join)."""
    import ddpipe

    data = tmp_path / "ds"
    ddpipe.write_dataset(data, iter(indexed_samples(60)), samples_per_shard=5)
    code = ("import os, signal, sys, ddpipe; from ddpipe.comm import init_comm; c = init_comm(timeout=100)\n"
            f"ld = ddpipe.Loader(sys.argv[1], 3, {TINY_DALI}, shuffle='partial',\n"
            "    read_in='process', exchange_fraction=0.5, round_size=4, comm=c)\n"
            "for e in range(3):\n"
            "    ld.set_epoch(e)\n"
            "    for b, _ in enumerate(ld):\n"
            "        if e == b == 0 and c.world.rank == 1: os.kill(ld.decoding._reader._proc.pid, signal.SIGKILL)\n")
    proc = mpiexec(3, "-c", code, data, timeout=90)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "rank 1" in output and "the reading process ended unexpectedly" in output, output
    assert "did not complete within" not in output, output


def test_a_rank_reads_apart_before_the_others_start_to(tmp_path: Path) -> None:
    """With no exchange (``local``), a rank's reading process needs nothing of the other ranks: rank 0
    reads its whole epoch before rank 1 starts its own (which waits for rank 0's word that it has)."""
    import ddpipe

    data = tmp_path / "ds"
    ddpipe.write_dataset(data, iter(indexed_samples(20)), samples_per_shard=4)
    code = ("import sys, time, ddpipe; from pathlib import Path; from ddpipe.comm import init_comm\n"
            "c = init_comm(timeout=60); told = Path(sys.argv[2])\n"
            f"ld = ddpipe.Loader(sys.argv[1], 3, {TINY_DALI}, shuffle='local', read_in='process', comm=c)\n"
            "if c.world.rank == 1:\n"
            "    deadline = time.monotonic() + 60\n"
            "    while not told.exists() and time.monotonic() < deadline: time.sleep(0.05)\n"
            "    assert told.exists(), 'rank 0 never read its epoch'\n"
            "n = sum(len(y) for _, y in ld)\n"
            "if c.world.rank == 0: told.write_text(str(n))\n"
            "print('rank', c.world.rank, 'read', n, flush=True)\n")
    proc = mpiexec(2, "-c", code, data, tmp_path / "told", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 read 10" in proc.stdout and "rank 1 read 10" in proc.stdout
