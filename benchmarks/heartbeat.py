"""What the heartbeat thread costs a rank's work, against none and against an earlier commit's
heartbeats, in the same run.

    python benchmarks/heartbeat.py [--repeats 15] [--rounds 4] [--ranks 2] [--reference CHECKOUT ...]

Every rank of an MPI job runs a heartbeat thread (ddpipe/comm/heartbeat.py) that wakes a few times a
second, takes the interpreter lock and polls its links. What that may cost is the work of the rank's
other threads: here, each rank's main thread runs a pure-Python loop that holds the lock throughout
(the kind of work a loader's batching does), for about a second a block. Blocks with the
heartbeats running alternate with blocks without, in the same processes; a block's time is its
slowest rank's, and a run's figure its fastest block of each kind (the work is fixed: the fastest is
the least disturbed by the rest of the machine, as with ``timeit``), the median over runs. Each tree
(this checkout, and each ``--reference``) runs in fresh ranks of its own (``PYTHONPATH``), the trees'
order alternated over ``--rounds``. *With / without* is the heartbeats' cost in that tree; */ at*
sets this tree's ratio against each reference's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from _common import commit_of, env_of, save, trees_to_measure

from ddpipe.bench.harness import machine, median, table

WORK = 8_000_000  # loop steps a block: about a second here (several of the heartbeats' wake-ups)


def busy(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def child(repeats: int) -> None:
    """One tree's ranks: blocks with and without heartbeats, alternated; rank 0 prints the JSON."""
    from mpi4py import MPI

    from ddpipe.comm.heartbeat import Heartbeats

    world = MPI.COMM_WORLD
    hosts = world.allgather(socket.gethostname())
    seconds: dict[str, list[float]] = {"with": [], "without": []}
    busy(WORK // 10)  # warm
    for r in range(2 * repeats):
        running = "with" if r % 2 == 0 else "without"
        beats = Heartbeats(world.Dup(), hosts) if running == "with" else None
        world.Barrier()
        t0 = time.perf_counter()
        busy(WORK)
        mine = time.perf_counter() - t0
        slowest = world.allreduce(mine, op=MPI.MAX)
        if beats is not None:
            beats.stop()
        seconds[running].append(slowest)
    if world.Get_rank() == 0:
        # fixed work: the fastest block is the one least disturbed by the rest of the machine (as timeit)
        print(json.dumps({k: min(v) for k, v in seconds.items()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15, help="blocks of each kind per run")
    ap.add_argument("--rounds", type=int, default=4, help="fresh runs per tree, their order alternated")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--reference", type=Path, action="append", default=[])
    ap.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        child(args.repeats)
        return
    here = Path(__file__).resolve().parents[1]
    exe = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if exe is None:
        raise SystemExit("mpiexec not found: pip install 'ddpipe[mpi]' (make setup does)")
    trees = trees_to_measure(args.reference)
    runs: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else reversed(list(trees)):
            env = env_of(trees[tree])
            out = subprocess.run([exe, "-n", str(args.ranks), sys.executable, __file__, "--run", "--repeats",
                                  str(args.repeats)], env=env, capture_output=True, text=True, check=True)
            runs[tree].append(json.loads(out.stdout.splitlines()[-1]))
    rows = []
    ratios = {tree: median([run["with"] / run["without"] for run in runs[tree]]) for tree in trees}
    for tree in trees:
        row: dict[str, object] = {
            "tree": commit_of(here) if tree == "this" else tree,
            "with_s": median([run["with"] for run in runs[tree]]),
            "without_s": median([run["without"] for run in runs[tree]]),
            "with_vs_without": ratios[tree]}
        for ref in trees:
            if ref != "this":
                row[f"vs_at_{ref}"] = ratios[tree] / ratios[ref] if tree == "this" else None
        rows.append(row)
    cols = [("tree", "commit", "s"), ("with_s", "seconds with heartbeats", ".3f"),
            ("without_s", "without (reference)", ".3f"), ("with_vs_without", "with / without", ".3f")]
    cols += [(f"vs_at_{ref}", f"/ at {ref}", ".3f") for ref in trees if ref != "this"]
    text = table(rows, cols)
    command = (f"python benchmarks/heartbeat.py --repeats {args.repeats} --rounds {args.rounds} --ranks {args.ranks}"
               + "".join(f" --reference <checkout of {ref}>" for ref in trees if ref != "this"))
    doc = {"benchmark": "heartbeat", "command": command, "machine": machine(), "ranks": args.ranks,
           "work_steps": WORK, "rows": rows, "runs": runs, "table": text}
    path = save("heartbeat", doc)
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
