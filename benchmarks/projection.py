"""The cluster projection (``ddpipe bench --project``'s model, ddpipe/bench/projection.py) against
epochs measured on 1, 2 and 3 emulated nodes.

    python benchmarks/projection.py [--n 3000] [--throttle 50MB/s,5ms] [--repeats 3]

Each node (2 ranks; MPICH's cliques make the nodes) reads the shared dataset through its own slow
link (the slow-source model, per node), as the nodes of a cluster each read the shared file system
through their own link, with partial shuffling. Measured: the first epoch (nothing staged), every
file evicted from the page cache first. Projected: the model fed with what a user would feed it,
the dataset's size, the per-node link (so the file system's aggregate is nodes x link) and the
per-rank rate of the pipeline measured on this node count with the source unthrottled. The target is
agreement within 25%. The emulated nodes share this machine's 2 cores, so the case is kept
fetch-bound, the term the projection exists to predict at scale.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _common import DATA, mpiexec, save, synth_shards, timed_epoch

import ddpipe
from ddpipe.bench.harness import machine, median, table
from ddpipe.bench.projection import Cluster, Workload, project
from ddpipe.comm import init_comm
from ddpipe.staging import SourceLimits

RANKS_PER_NODE = 2
BATCH = 256


def worker(root: Path, throttle: str, out: Path) -> None:
    comm = init_comm()
    dataset = ddpipe.open_dataset(root)
    files = [root / s.file for s in dataset.manifest.shards]

    def loader(**kw: object) -> ddpipe.Loader:
        return ddpipe.Loader(root, BATCH, decode="none", shuffle="partial", comm=comm, **kw)  # type: ignore[arg-type]

    unthrottled = loader()
    free = timed_epoch(unthrottled, files)
    measured = timed_epoch(loader(source_limits=throttle), files)
    if comm.world.rank == 0:
        per_rank = len(dataset) / comm.world.size
        out.write_text(json.dumps({"measured": measured, "rate_per_rank": per_rank / free, "unthrottled": free}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--throttle", default="50MB/s,5ms", help="each node's link to the shared dataset")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", nargs=2, metavar=("DATA", "OUT"))
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), args.throttle, Path(args.worker[1]))
        return
    root = synth_shards(args.n, "projection", shard_bytes=4_000_000)  # enough shards to share evenly
    manifest = ddpipe.load_manifest(root)
    link = SourceLimits.parse(args.throttle)
    rows, runs = [], []
    for nodes in (1, 2, 3):
        figures = []
        for _ in range(args.repeats):
            out = DATA / "projection-run.json"
            mpiexec(nodes * RANKS_PER_NODE, __file__, "--throttle", args.throttle, "--worker", root, out, nodes=nodes)
            figures.append(json.loads(out.read_text()))
        runs.append({"nodes": nodes, "runs": figures})
        measured = median([f["measured"] for f in figures])
        rate = median([f["rate_per_rank"] for f in figures])
        cluster = Cluster(nodes=nodes, gpus_per_node=RANKS_PER_NODE, fs_bandwidth=nodes * (link.bandwidth or 1e18),
                          open_latency=link.latency)
        work = Workload(images=manifest.num_samples, image_bytes=manifest.num_bytes / manifest.num_samples,
                        batch_size=BATCH, step_time=0.0, decode_rate=rate, shuffle="partial")
        p = project(cluster, work, staging=False)
        rows.append({"nodes": nodes, "ranks": p.ranks, "measured_s": measured, "projected_s": p.epoch,
                     "ratio": p.epoch / measured, "bottleneck": p.bottleneck})
    text = table(rows, [("nodes", "nodes", "d"), ("ranks", "ranks", "d"), ("measured_s", "measured epoch s", ".2f"),
                        ("projected_s", "projected epoch s", ".2f"), ("ratio", "projected / measured", ".2f"),
                        ("bottleneck", "projected bottleneck", "s")])
    command = f"python benchmarks/projection.py --n {args.n} --throttle {args.throttle} --repeats {args.repeats}"
    path = save("projection", {"benchmark": "projection", "command": command, "machine": machine(), "rows": rows,
                               "runs": runs, "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
