"""What node-local staging buys when the dataset sits on a slow shared file system.

    python benchmarks/staging.py [--n 3000] [--ranks 2] [--throttle 100MB/s,5ms] [--repeats 3]

The source is read through ddpipe's slow-source model (the node's link: 100 MB/s and 5 ms per open
by default, shared by the node's ranks). On 2 ranks, loader epochs (encoded samples, partial
shuffle) are timed: straight from the slow source; epoch 1 with staging (copying as it reads);
epochs 2 and 3 with staging (the copies reused); an epoch with a staging capacity of a third of the
data (two shards at least), in two runs one after the other into one directory; and the same shards
read from local disk without staging or throttling (the reference): epochs 2 and 3 of a loader of its own, in turns with
staging's (each order once; the means of the two). Each measured epoch starts with the files it
reads evicted from the page cache. Also: the staging copy's throughput as a ratio of the source's
bandwidth.

Re-sharding (peer staging): 2 emulated nodes of 2 ranks stage an epoch into a directory per node;
then the job continues on 3 nodes of 2 ranks (MPICH's cliques), whose shares differ, each node with
its own slow link to the source (``--reshard-throttle``). Its first epoch is timed with peer staging
(shards another node holds come from it over MPI), with staging from the source only, reading the
source directly, and,
as the reference, its second epoch (every shard local). Each starts from the same 2-node copies,
with every file evicted from the page cache. On one machine the "network" between nodes is MPI's
shared memory, faster than a cluster's links; the source model is the same per node.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from _common import DATA, mpiexec, save, synth_shards, timed_epoch

import ddpipe
from ddpipe.bench.harness import machine, median, table
from ddpipe.comm import init_comm
from ddpipe.staging import SourceLimits, StageOptions
from ddpipe.staging.options import dataset_stage_dir


def worker(root: Path, stage: Path, throttle: str, out: Path) -> None:
    comm = init_comm()
    dataset = ddpipe.open_dataset(root)
    source = [root / s.file for s in dataset.manifest.shards]
    staged = [dataset_stage_dir(stage, dataset) / s.file for s in dataset.manifest.shards]

    def loader(**kw: object) -> ddpipe.EncodedStream:
        return ddpipe.EncodedStream(root, 256, shuffle="partial", comm=comm, **kw)  # type: ignore[arg-type]

    result: dict[str, float] = {}
    result["direct"] = timed_epoch(loader(source_limits=throttle), source)
    if comm.world.rank == 0:
        shutil.rmtree(stage, ignore_errors=True)
    comm.barrier()
    staging = loader(source_limits=throttle, stage_dir=stage)
    result["staged_epoch1"] = timed_epoch(staging, source)
    assert staging.stager is not None
    stats = comm.allgather(dict(staging.stager.stats))
    # the copies reused against the local disk, like with like: later epochs of a loader each (the
    # reference's first untimed, as staging's first is the copying one). A fresh loader's first epoch
    # also starts its threads and makes its plan: taken as the reference, it put the staged copies at
    # 0.75 to 1.02 of a local disk from run to run. In turns, each order once (staged, local, local,
    # staged): this machine's cold reads of the same files alternate between two speeds (0.37 and
    # 0.46 s for 354 MB) from one read to the next
    local = loader(keep_mapped=False)  # each epoch cold, as the staged copies' (which are never kept mapped)
    timed_epoch(local, source)
    times: dict[str, list[float]] = {"staged": [], "local": []}
    for epoch, order in ((1, ("staged", "local")), (2, ("local", "staged"))):
        staging.set_epoch(epoch)
        local.set_epoch(epoch)
        for what in order:
            times[what].append(timed_epoch(staging, staged) if what == "staged" else timed_epoch(local, source))
    result["staged_reused"] = sum(times["staged"]) / len(times["staged"])
    result["local"] = sum(times["local"]) / len(times["local"])
    copied = sum(s["bytes"] for s in stats)
    result["copy_mb_s"] = copied / 1e6 / max(max(s["seconds"] for s in stats), 1e-9)
    # a capacity of a third of the node's share: each epoch stages its shards again as its readers make
    # room. Run twice into one directory: the second run finds what the first left there (it waited out
    # the stage timeout once the first run's notes of finished shards were counted for it)
    capped = stage.with_name(stage.name + "-capacity")
    if comm.world.rank == 0:
        shutil.rmtree(capped, ignore_errors=True)
    comm.barrier()
    shards = dataset.manifest.shards
    capacity = max(sum(s.bytes for s in shards) // 3, 2 * max(s.bytes for s in shards))  # two: a small --n
    for run in ("capacity_run1", "capacity_run2"):
        with loader(source_limits=throttle, stage_dir=capped, stage_capacity=capacity) as capped_loader:
            result[run] = timed_epoch(capped_loader, source)
    if comm.world.rank == 0:
        out.write_text(json.dumps(result))


def reshard_worker(root: Path, template: str, throttle: str, out: Path, variant: str) -> None:
    """One launch on the new node count: the epoch after re-sharding, staged as ``variant`` says."""
    comm = init_comm()
    dataset = ddpipe.open_dataset(root)
    stage_root = Path(template.replace("{node}", str(comm.world.node)))
    staged = [dataset_stage_dir(stage_root, dataset) / s.file for s in dataset.manifest.shards]
    evict = [root / s.file for s in dataset.manifest.shards] + [p for p in staged if p.exists()]
    stage = None if variant == "direct" else StageOptions(Path(template), peers=variant == "peers")
    loader = ddpipe.EncodedStream(root, 256, shuffle="partial", stage=stage, source_limits=throttle,
                           comm=comm)
    result: dict[str, float] = {"epoch": timed_epoch(loader, evict)}
    if loader.stager is not None:
        stats = comm.allgather(dict(loader.stager.stats) if comm.world.local_rank == 0 else None)
        leaders = [s for s in stats if s is not None]
        result["bytes"] = sum(s["bytes"] for s in leaders)
        result["peer_bytes"] = sum(s["peer_bytes"] for s in leaders)
        if variant == "peers":  # the reference: the next epoch, every shard now on its node
            loader.set_epoch(1)
            result["local"] = timed_epoch(loader, [p for p in staged if p.exists()])
    if comm.world.rank == 0:
        out.write_text(json.dumps(result))


def reshard(root: Path, throttle: str, repeats: int) -> tuple[list[dict[str, object]], list[dict[str, float]]]:
    """The re-sharding case (see the module's doc): rows of the table, and every run's figures."""
    base, stage = DATA / "reshard-base", DATA / "reshard-stage"
    shutil.rmtree(base, ignore_errors=True)
    mpiexec(4, __file__, "--stage-only", root, str(base / "node{node}"), nodes=2)  # 2 nodes stage an epoch
    runs: list[dict[str, float]] = []
    for _ in range(repeats):
        run: dict[str, float] = {}
        for variant in ("peers", "source", "direct"):
            shutil.rmtree(stage, ignore_errors=True)
            shutil.copytree(base, stage)  # every variant starts from the 2-node job's copies
            out = DATA / "reshard-run.json"
            mpiexec(6, __file__, "--throttle", throttle, "--reshard-worker", root, str(stage / "node{node}"), out,
                    variant, nodes=3)
            figures = json.loads(out.read_text())
            run[variant] = figures["epoch"]
            if variant == "peers":
                run["local"] = figures["local"]
                run["peer_share"] = figures["peer_bytes"] / max(figures["bytes"], 1)
                run["staged_bytes"] = figures["bytes"]
        runs.append(run)
    r = {k: median([run[k] for run in runs]) for k in runs[0]}
    rows: list[dict[str, object]] = [
        {"read": "staged, shards held by other nodes fetched from them", "seconds": r["peers"],
         "vs_source": r["peers"] / r["source"], "vs_local": r["peers"] / r["local"]},
        {"read": "staged, every shard not on the node from the source", "seconds": r["source"], "vs_source": 1.0,
         "vs_local": r["source"] / r["local"]},
        {"read": "straight from the slow source, no staging", "seconds": r["direct"],
         "vs_source": r["direct"] / r["source"], "vs_local": r["direct"] / r["local"]},
        {"read": "next epoch, every shard local (reference)", "seconds": r["local"],
         "vs_source": r["local"] / r["source"], "vs_local": 1.0},
    ]
    return rows, runs


def stage_only(root: Path, template: str) -> None:
    comm = init_comm()
    for _ in ddpipe.EncodedStream(root, 256, shuffle="partial", stage_dir=template, comm=comm):
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--throttle", default="100MB/s,5ms")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reshard-throttle", default="25MB/s,5ms",
                    help="each node's link to the source in the re-sharding case (a shared file system's "
                         "bandwidth divided among many nodes)")
    ap.add_argument("--worker", nargs=3, metavar=("DATA", "STAGE", "OUT"))
    ap.add_argument("--reshard-worker", nargs=4, metavar=("DATA", "STAGE", "OUT", "VARIANT"))
    ap.add_argument("--stage-only", nargs=2, metavar=("DATA", "STAGE"))
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), Path(args.worker[1]), args.throttle, Path(args.worker[2]))
        return
    if args.reshard_worker:
        data, stage, out, variant = args.reshard_worker
        reshard_worker(Path(data), stage, args.throttle, Path(out), variant)
        return
    if args.stage_only:
        stage_only(Path(args.stage_only[0]), args.stage_only[1])
        return
    root = synth_shards(args.n, "staging")
    runs = []
    for _ in range(args.repeats):
        out = DATA / "staging-run.json"
        mpiexec(args.ranks, __file__, "--throttle", args.throttle, "--worker", root, DATA / "stage-bench", out)
        runs.append(json.loads(out.read_text()))
    bandwidth = SourceLimits.parse(args.throttle).bandwidth or float("nan")
    r = {k: median([run[k] for run in runs]) for k in runs[0]}
    local = r["local"]
    rows = [
        {"read": "straight from the slow source", "seconds": r["direct"], "vs_local": r["direct"] / local},
        {"read": "staged, epoch 1 (copying)", "seconds": r["staged_epoch1"], "vs_local": r["staged_epoch1"] / local},
        {"read": "staged, epochs 2 and 3 (copies reused)", "seconds": r["staged_reused"],
         "vs_local": r["staged_reused"] / local},
        {"read": "staged, a capacity of a third of the data, first run", "seconds": r["capacity_run1"],
         "vs_local": r["capacity_run1"] / local},
        {"read": "staged, the same capacity, a second run into its directory", "seconds": r["capacity_run2"],
         "vs_local": r["capacity_run2"] / local},
        {"read": "local disk, no staging (reference)", "seconds": local, "vs_local": 1.0},
    ]
    copy = {"copy_mb_s": r["copy_mb_s"], "source_mb_s": bandwidth / 1e6, "ratio": r["copy_mb_s"] / (bandwidth / 1e6)}
    epochs = table(rows, [("read", "epoch read", "s"), ("seconds", "seconds", ".2f"), ("vs_local", "/ local", ".2f")])
    copies = table([copy], [("copy_mb_s", "staging copy MB/s", ".1f"), ("source_mb_s", "source bandwidth MB/s", ".1f"),
                            ("ratio", "copy / source", ".2f")])
    reshard_rows, reshard_runs = reshard(root, args.reshard_throttle, args.repeats)
    share = median([float(run["peer_share"]) for run in reshard_runs])
    resharded = table(reshard_rows, [("read", "epoch after re-sharding 2 nodes onto 3", "s"),
                                     ("seconds", "seconds", ".2f"), ("vs_source", "/ from source", ".2f"),
                                     ("vs_local", "/ local", ".2f")])
    text = f"{epochs}\n\n{copies}\n\n{resharded}\n\nbytes staged from peers: {share:.0%} of those staged"
    command = (f"python benchmarks/staging.py --n {args.n} --ranks {args.ranks} --throttle {args.throttle} "
               f"--reshard-throttle {args.reshard_throttle} --repeats {args.repeats}")
    path = save("staging", {"benchmark": "staging", "command": command, "machine": machine(), "ranks": args.ranks,
                            "rows": rows, "copy": copy, "runs": runs, "reshard_rows": reshard_rows,
                            "reshard_runs": reshard_runs, "peer_share": share, "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
