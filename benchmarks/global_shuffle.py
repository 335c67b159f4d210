"""A global shuffle's epoch on real ranks, reading shards whose manifest records each sample's
digest, against the same shards under a manifest without them (each rank then hashes every shard it
reads from whole: on W ranks, the whole dataset W times an epoch), on one node and as W nodes.

    python benchmarks/global_shuffle.py [--n 3000] [--ranks 2 4] [--repeats 5]

Data: random_access.py's (the synth set in 16 MB shards of each format; the same files, hard
linked, beside a manifest without digests, as ddpipe wrote them before it recorded them). *Nodes*:
1, the ranks one node's; or W, each rank a node of its own as MPI sees it (MPICH's cliques): its
reads then want less than half of each shard on their node, and check each sample against its
digest, while on one node its ranks together want all of each shard, and hash it whole as before
(``reading._random_digests``). The W nodes are emulated on one machine: their ranks share one page
cache, so a cold epoch's reads together cover every file, sample by sample in random order, where
on real nodes each node reads its ranks' share alone (random_access.py measures one rank's reads).

Each repeat runs one epoch of ``EncodedStream(shuffle="global")`` on every rank per format and
manifest, alternated: first every cold epoch (a new stream each, its files evicted from the page
cache first), then every warm one (one stream per format and manifest, kept from epoch to epoch as
a loader keeps its mappings, after an epoch that brings its files in). *Epoch*: the slowest rank's
seconds. *Processor*: the processor seconds of every rank's process over the epoch, summed. The
ratios are the digests' over no digests', repeat by repeat, their median.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

from _common import DATA, mpiexec, save, synth_shards, timed_epoch
from random_access import without_digests

import ddpipe
from ddpipe.bench.harness import machine, median, table
from ddpipe.comm import Comm, init_comm

FORMATS = ("wds", "hdf5", "lmdb")
MANIFESTS = ("digests", "no digests")
BATCH = 64


def epoch(stream: ddpipe.EncodedStream, comm: Comm, number: int, evict: list[Path]) -> tuple[float, float]:
    """One epoch: the slowest rank's seconds, and every rank's processor seconds summed."""
    stream.set_epoch(number)
    cpu = time.process_time()
    seconds = timed_epoch(stream, evict)
    return seconds, float(sum(comm.allgather(time.process_time() - cpu)))


def worker(sets: dict[str, str], repeats: int, out: Path) -> None:
    comm = init_comm()
    runs: dict[str, dict[str, list[float]]] = {key: {"cold": [], "cold_cpu": [], "warm": [], "warm_cpu": []}
                                               for key in sets}
    for repeat in range(repeats):  # cold first: a stream kept for its warm epochs keeps its files' pages in
        for key, root in sets.items():
            stream = ddpipe.EncodedStream(root, BATCH, shuffle="global", comm=comm)
            files = [stream.dataset.shard_path(k) for k in range(len(stream.dataset.manifest.shards))]
            seconds, cpu = epoch(stream, comm, repeat, files)
            runs[key]["cold"].append(seconds)
            runs[key]["cold_cpu"].append(cpu)
            del stream
            gc.collect()
    streams = {key: ddpipe.EncodedStream(root, BATCH, shuffle="global", comm=comm) for key, root in sets.items()}
    for stream in streams.values():
        epoch(stream, comm, 0, [])
    for repeat in range(repeats):
        for key, stream in streams.items():
            seconds, cpu = epoch(stream, comm, repeat + 1, [])
            runs[key]["warm"].append(seconds)
            runs[key]["warm_cpu"].append(cpu)
    if comm.world.rank == 0:
        out.write_text(json.dumps({"nodes": comm.world.num_nodes, "runs": runs}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--worker", nargs=2, metavar=("SETS", "OUT"))
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker[0]), args.repeats, Path(args.worker[1]))
        return
    sets: dict[str, str] = {}
    for fmt in FORMATS:
        root = synth_shards(args.n, "loader", fmt)
        sets[f"{fmt}/digests"] = str(root)
        sets[f"{fmt}/no digests"] = str(without_digests(root))
    rows: list[dict[str, Any]] = []
    for ranks in args.ranks:
        for nodes in (1, ranks):
            out = DATA / f"global-shuffle-{ranks}-{nodes}.json"
            mpiexec(ranks, __file__, "--repeats", str(args.repeats), "--worker", json.dumps(sets), out, nodes=nodes)
            got = json.loads(out.read_text())
            assert got["nodes"] == nodes, got["nodes"]  # as MPI saw them
            runs = got["runs"]
            for fmt in FORMATS:
                for manifest in MANIFESTS:
                    mine = runs[f"{fmt}/{manifest}"]
                    row: dict[str, Any] = {"ranks": ranks, "nodes": nodes, "format": fmt, "manifest": manifest,
                                           **{f"{k}_s": median(v) for k, v in mine.items()}}
                    if manifest == "digests":
                        whole = runs[f"{fmt}/no digests"]
                        for k in mine:
                            row[f"{k}_vs_no_digests"] = median([a / b for a, b in zip(mine[k], whole[k], strict=True)])
                    rows.append(row)
                    print(row, flush=True)
    text = table(rows, [("ranks", "ranks", "d"), ("nodes", "nodes", "d"), ("format", "format", "s"),
                        ("manifest", "manifest", "s"),
                        ("cold_s", "cold: epoch s", ".2f"), ("cold_vs_no_digests", "/ no digests", ".2f"),
                        ("cold_cpu_s", "processor s", ".2f"), ("cold_cpu_vs_no_digests", "/ no digests", ".2f"),
                        ("warm_s", "warm: epoch s", ".2f"), ("warm_vs_no_digests", "/ no digests", ".2f"),
                        ("warm_cpu_s", "processor s", ".2f"), ("warm_cpu_vs_no_digests", "/ no digests", ".2f")])
    print(text)
    ranks = " ".join(map(str, args.ranks))
    doc = {"benchmark": "global_shuffle",
           "command": f"python benchmarks/global_shuffle.py --n {args.n} --ranks {ranks} --repeats {args.repeats}",
           "machine": machine(), "rows": rows, "table": text}
    print(f"wrote {save('global_shuffle', doc)}")


if __name__ == "__main__":
    main()
