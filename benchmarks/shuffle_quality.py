"""How mixed each shuffle mode's stream is, on a class-sorted dataset read by 4 real ranks.

    python benchmarks/shuffle_quality.py [--ranks 4] [--classes 100] [--per-class 50]

Every mode runs the real Loader under mpiexec over class-sorted shards (each shard holds one or
two classes); rank 0 scores what the ranks yielded with ddpipe.quality.score_epoch. The reference
measured in the same run is ``random_skew``: uniformly random batches, the best any shuffle can do.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _common import DATA, mpiexec, save

import ddpipe
from ddpipe.bench.harness import machine, table
from ddpipe.comm import init_comm
from ddpipe.quality import score_epoch
from ddpipe.sample import Sample

CONFIGS = [("none", 0.0), ("local", 0.0), ("partial", 0.1), ("partial", 0.3), ("partial", 0.5), ("global", 0.0)]
BATCH = 64


def make_data(root: Path, classes: int, per_class: int) -> None:
    def samples() -> Iterator[Sample]:
        for i in range(classes * per_class):
            yield {"__key__": f"s/{i:07d}", "cls": b"%d" % (i // per_class), "bin": bytes(256)}

    shutil.rmtree(root, ignore_errors=True)
    ddpipe.write_dataset(root, samples(), samples_per_shard=per_class * 2, classes=[str(c) for c in range(classes)])


def worker(root: Path, out: Path, per_class: int) -> None:
    comm = init_comm()
    results = []
    for mode, q in CONFIGS:
        loader = ddpipe.EncodedStream(root, BATCH, shuffle=mode, exchange_fraction=q, seed=0, buffer_size=1024,
                               comm=comm)
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            stream = np.array([int(s["__key__"][2:]) for batch in loader for s in batch])
            streams = comm.allgather(stream)
            if comm.world.rank == 0:
                labels = np.arange(len(loader.dataset)) // per_class  # class-sorted: sample i is class i // per_class
                score = score_epoch(streams, labels, BATCH)
                results.append({"mode": mode, "q": q, "epoch": epoch, **score.to_dict()})
    if comm.world.rank == 0:
        out.write_text(json.dumps(results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--per-class", type=int, default=50)
    ap.add_argument("--worker", nargs=2, metavar=("DATA", "OUT"))
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), Path(args.worker[1]), args.per_class)
        return
    root, out = DATA / "shuffle-quality", DATA / "shuffle-quality.json"
    make_data(root, args.classes, args.per_class)
    mpiexec(args.ranks, __file__, "--per-class", args.per_class, "--worker", root, out)
    runs = json.loads(out.read_text())
    rows: list[dict[str, Any]] = []
    for mode, q in CONFIGS:
        mine = [r for r in runs if r["mode"] == mode and r["q"] == q]
        rows.append({"mode": mode if mode != "partial" else f"partial Q={q}",
                     **{k: float(np.mean([r[k] for r in mine])) for k in
                        ("batch_skew", "random_skew", "rank_skew", "order_correlation")}})
        rows[-1]["skew_over_random"] = rows[-1]["batch_skew"] / rows[-1]["random_skew"]
    cols = [("mode", "mode", "s"), ("batch_skew", "batch skew", ".3f"), ("random_skew", "random batches", ".3f"),
            ("skew_over_random", "skew / random", ".2f"), ("rank_skew", "rank skew", ".3f"),
            ("order_correlation", "order corr.", ".3f")]
    text = table(rows, cols)
    command = (f"python benchmarks/shuffle_quality.py --ranks {args.ranks} --classes {args.classes} "
               f"--per-class {args.per_class}")
    path = save("shuffle_quality", {"benchmark": "shuffle_quality", "command": command, "machine": machine(),
                                    "ranks": args.ranks, "batch_size": BATCH, "rows": rows, "runs": runs,
                                    "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
