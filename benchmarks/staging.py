"""What node-local staging buys when the dataset sits on a slow shared file system.

    python benchmarks/staging.py [--n 3000] [--ranks 2] [--throttle 100MB/s,5ms] [--repeats 3]

The source is read through ddpipe's slow-source model (the node's link: 100 MB/s and 5 ms per open
by default, shared by the node's ranks). On 2 ranks, loader epochs (encoded samples, partial
shuffle) are timed: straight from the slow source; epoch 1 with staging (copying as it reads);
epoch 2 with staging (the copies reused); and the same shards read from local disk without
staging or throttling (the reference). Each measured epoch starts with the files it reads evicted
from the page cache. Also: the staging copy's throughput as a ratio of the source's bandwidth.
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
from ddpipe.staging import SourceLimits
from ddpipe.staging.stager import dataset_stage_dir


def worker(root: Path, stage: Path, throttle: str, out: Path) -> None:
    comm = init_comm()
    dataset = ddpipe.open_dataset(root)
    source = [root / s.file for s in dataset.manifest.shards]
    staged = [dataset_stage_dir(stage, dataset) / s.file for s in dataset.manifest.shards]

    def loader(**kw: object) -> ddpipe.Loader:
        return ddpipe.Loader(root, 256, decode="none", shuffle="partial", comm=comm, **kw)  # type: ignore[arg-type]

    result: dict[str, float] = {}
    result["direct"] = timed_epoch(loader(source_limits=throttle), source)
    if comm.world.rank == 0:
        shutil.rmtree(stage, ignore_errors=True)
    comm.barrier()
    staging = loader(source_limits=throttle, stage_dir=stage)
    result["staged_epoch1"] = timed_epoch(staging, source)
    assert staging.stager is not None
    stats = comm.allgather(dict(staging.stager.stats))
    staging.set_epoch(1)
    result["staged_epoch2"] = timed_epoch(staging, staged)
    result["local"] = timed_epoch(loader(), source)
    copied = sum(s["bytes"] for s in stats)
    result["copy_mb_s"] = copied / 1e6 / max(max(s["seconds"] for s in stats), 1e-9)
    if comm.world.rank == 0:
        out.write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--throttle", default="100MB/s,5ms")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", nargs=3, metavar=("DATA", "STAGE", "OUT"))
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), Path(args.worker[1]), args.throttle, Path(args.worker[2]))
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
        {"read": "staged, epoch 2 (copies reused)", "seconds": r["staged_epoch2"],
         "vs_local": r["staged_epoch2"] / local},
        {"read": "local disk, no staging (reference)", "seconds": local, "vs_local": 1.0},
    ]
    copy = {"copy_mb_s": r["copy_mb_s"], "source_mb_s": bandwidth / 1e6, "ratio": r["copy_mb_s"] / (bandwidth / 1e6)}
    epochs = table(rows, [("read", "epoch read", "s"), ("seconds", "seconds", ".2f"), ("vs_local", "/ local", ".2f")])
    copies = table([copy], [("copy_mb_s", "staging copy MB/s", ".1f"), ("source_mb_s", "source bandwidth MB/s", ".1f"),
                            ("ratio", "copy / source", ".2f")])
    text = f"{epochs}\n\n{copies}"
    command = (f"python benchmarks/staging.py --n {args.n} --ranks {args.ranks} --throttle {args.throttle} "
               f"--repeats {args.repeats}")
    path = save("staging", {"benchmark": "staging", "command": command, "machine": machine(), "ranks": args.ranks,
                            "rows": rows, "copy": copy, "runs": runs, "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
