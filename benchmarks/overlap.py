"""The CPU decoding path beside a step that waits for its device: how much of the pipeline's work
hides under the step, this tree against earlier commits' (``--reference``) in the same run.

    python benchmarks/overlap.py [--n 1024] [--repeats 5] [--epochs 3] [--reference CHECKOUT ...]

A node whose GPUs are fed by DALI on its CPU (``decode="dali-cpu"``) trains with a step that launches
its work and then waits for the device, leaving the cores to the pipeline. ``ddpipe bench`` models
that step as a sleep of ``--step-time`` a batch (the interpreter lock and the cores let go), here
beside ``dali-cpu`` at 224 pixels, batches of 64: the epoch's images/s; the pipeline alone and
the step alone; the stall (the share of the epoch the step waited for batches); the overlap (1: the
epoch took the longer of the two alone, 0: their sum); each batch's wait after the first, p50 and
p99; the first batch's. Two steps: one shorter than the pipeline's time per batch (the pipeline is
the bottleneck: at best the epoch runs at its rate alone) and one longer (the step is: at best
nothing stalls). Each (step, tree) runs ``--repeats`` times, each a fresh ``ddpipe bench`` process
of that tree's ddpipe, the order alternated; the figures are medians over the runs (each run's,
``ddpipe bench``'s over its epochs). Each of this tree's rows gives its images/s as a ratio to each
reference's (``vs_at_<commit>``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import commit_of, env_of, save, synth_shards, trees_to_measure

from ddpipe.bench.harness import machine, median, table

BATCH, SIZE = 64, 224
STEPS = {"shorter than the pipeline's": 0.035, "longer than the pipeline's": 0.1}  # seconds a batch of 64


def run_bench(tree: Path, data: Path, step_s: float, epochs: int) -> dict[str, float]:
    """One ``ddpipe bench`` of ``tree``'s ddpipe (a process of its own, run in that tree): its figures."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "bench.json"
        subprocess.run([sys.executable, "-m", "ddpipe", "bench", str(data), "--decode", "dali-cpu",
                        "--batch-size", str(BATCH), "--image-size", str(SIZE), "--step-time", str(step_s),
                        "--epochs", str(epochs), "--no-progress", "--json", str(out)],
                       check=True, timeout=900, capture_output=True, env=env_of(tree), cwd=tree)
        doc = json.loads(out.read_text())
    latency = doc["latency"][0]
    return {"images_s": doc["images"] / doc["epoch_seconds"], "pipeline_images_s": doc["max_feed_images_per_s"],
            "step_images_s": doc["step_images_per_s"], "stall": doc["stall"], "overlap": doc["overlap"],
            "wait_p50_ms": 1e3 * latency["wait_p50_s"], "wait_p99_ms": 1e3 * latency["wait_p99_s"],
            "first_batch_ms": 1e3 * latency["first_batch_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3, help="epochs of each ddpipe bench run")
    ap.add_argument("--reference", type=Path, action="append", default=[],
                    help="a checkout of an earlier commit (git worktree add): its ddpipe measured too, each of "
                         "its runs beside this tree's; may be given more than once")
    args = ap.parse_args()
    data = synth_shards(args.n, "loader", "wds", shard_bytes=32_000_000, seed=0)  # loader.py's and feed.py's
    trees = trees_to_measure(args.reference)
    references = [tree for tree in trees if tree != "this"]
    todo = [(step, tree) for step in STEPS for tree in trees]
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    for rep in range(args.repeats):
        for step, tree in todo if rep % 2 == 0 else reversed(todo):  # alternated: drift hits all alike
            got = run_bench(trees[tree], data, STEPS[step], args.epochs)
            runs.setdefault((step, tree), []).append(got)
            print(f"  {tree}, step {step}: " + ", ".join(f"{k} {v:.3f}" for k, v in got.items()), file=sys.stderr)
    commits = {tree: commit_of(path) for tree, path in trees.items()}
    rows: list[dict[str, Any]] = []
    for step, tree in todo:
        got = {key: median([r[key] for r in runs[step, tree]]) for key in runs[step, tree][0]}
        versus = {f"vs_at_{ref}": got["images_s"] / median([r["images_s"] for r in runs[step, ref]])
                  if tree == "this" else None for ref in references}
        rows.append({"step": step, "step_ms": 1e3 * STEPS[step], "tree": tree, "commit": commits[tree], **got,
                     **versus})
    columns = [("step_ms", "step ms", ".0f"), ("commit", "commit", "s"), ("images_s", "images/s", ".0f"),
               ("pipeline_images_s", "pipeline alone", ".0f"), ("step_images_s", "step alone", ".0f"),
               ("stall", "stall", ".1%"), ("overlap", "overlap", ".0%"), ("wait_p50_ms", "wait p50 ms", ".1f"),
               ("wait_p99_ms", "wait p99 ms", ".1f"), ("first_batch_ms", "first batch ms", ".1f")]
    columns += [(f"vs_at_{ref}", f"/ at {ref}", ".2f") for ref in references]
    text = table(rows, columns)
    command = f"python benchmarks/overlap.py --n {args.n} --repeats {args.repeats} --epochs {args.epochs}"
    command += "".join(f" --reference <checkout of {ref}>" for ref in references)
    doc = {"benchmark": "overlap", "command": command, "commits": commits, "machine": machine(), "batch": BATCH,
           "size": SIZE, "rows": rows, "runs": {f"{tree}, step {step}": r for (step, tree), r in runs.items()},
           "table": text}
    path = save("overlap", doc)
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
