"""How long planning one epoch takes at ImageNet scale, against an earlier commit's planning in the same run.

    python benchmarks/plan_time.py [--repeats 7] [--reference CHECKOUT ...]

Every rank plans each epoch as it starts, on the thread that asks for the epoch's first batch, and
for every rank (each needs the others' exchange rounds): the plan is on the path of every epoch's
first batch. The manifest is benchmarks/plan.py's (1,281,167 samples with ImageNet's class sizes
in 1,024 shards; in memory, no file). Each row plans one epoch of a shuffle on a world size, batches of
256, the default shuffle buffer (1,024) and exchange fraction (0.3). Each tree's plans run in a
fresh process of their own (``PYTHONPATH``), the trees' order alternated; each figure is the median
of ``--repeats`` plans after a first, untimed one. ``--reference`` (repeatable) plans with an earlier
commit's ddpipe in the same run; each row gives this tree's time over each reference's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import commit_of, env_of, save, trees_to_measure

from ddpipe.bench.harness import machine, median, table

CASES = [(shuffle, world) for shuffle in ("local", "partial", "global") for world in (1, 8, 64)]
BATCH = 256


def child(repeats: int) -> dict[str, float]:
    """This tree's median seconds for each case (keys ``shuffle/world``)."""
    from plan import imagenet_like_manifest

    from ddpipe.plan import PlanOptions, plan_epoch

    manifest = imagenet_like_manifest()
    out = {}
    for shuffle, world in CASES:
        options = PlanOptions(shuffle=shuffle, batch_size=BATCH)
        seconds = []
        for epoch in range(repeats + 1):
            t0 = time.perf_counter()
            plan_epoch(manifest, world, 0, epoch, options)
            seconds.append(time.perf_counter() - t0)
        out[f"{shuffle}/{world}"] = median(seconds[1:])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per tree, their order alternated")
    ap.add_argument("--reference", type=Path, action="append", default=[])
    ap.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        print(json.dumps(child(args.repeats)))
        return
    here = Path(__file__).resolve().parents[1]
    trees = trees_to_measure(args.reference)
    runs: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else reversed(list(trees)):
            env = env_of(trees[tree])
            out = subprocess.run([sys.executable, __file__, "--run", "--repeats", str(args.repeats)], env=env,
                                 capture_output=True, text=True, check=True)
            runs[tree].append(json.loads(out.stdout))
    this = commit_of(here)
    rows = []
    for shuffle, world in CASES:
        key = f"{shuffle}/{world}"
        seconds = median([run[key] for run in runs["this"]])
        row: dict[str, object] = {"shuffle": shuffle, "world": world, "commit": this, "seconds": seconds}
        for ref in trees:
            if ref != "this":
                row[f"vs_at_{ref}"] = seconds / median([run[key] for run in runs[ref]])
        rows.append(row)
    cols = [("shuffle", "shuffle", "s"), ("world", "ranks", "d"), ("commit", "commit", "s"),
            ("seconds", "seconds", ".3f")] + [(f"vs_at_{ref}", f"/ at {ref}", ".2f") for ref in trees if ref != "this"]
    text = table(rows, cols)
    command = f"python benchmarks/plan_time.py --repeats {args.repeats} --rounds {args.rounds}" + "".join(
        f" --reference <checkout of {ref}>" for ref in trees if ref != "this")
    doc = {"benchmark": "plan_time", "command": command, "machine": machine(), "batch": BATCH,
           "rows": rows, "runs": runs, "table": text}
    path = save("plan_time", doc)
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
