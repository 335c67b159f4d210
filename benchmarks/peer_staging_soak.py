"""Peer staging, run after run: the 2-node `rotate` case that once crashed or hung 8 runs in 15.

    python benchmarks/peer_staging_soak.py [--runs 30] [--n 480]

Each run is a fresh job of 4 ranks on 2 nodes staging into a fresh directory per node
(``STAGE/node{node}``), with `rotate` assignment (each epoch moves shards to the other node, whose
leader copies them from its peer rather than the source) and partial shuffling, for 3 epochs; a run
passes when it exits 0 within its hang bound and every epoch yielded every sample exactly once.
Runs on both kinds of node: MPICH's cliques on one host, and two real hosts (tests/hosts/ssh-ns: own
host name and /dev/shm, MPI over TCP; needs root). Not a speed benchmark: the figure is how many
consecutive runs passed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import DATA, ROOT, save, synth_shards

from ddpipe.bench.harness import machine, table

EPOCHS, HANG_BOUND = 3, 300.0
SSH_NS = ROOT / "tests" / "hosts" / "ssh-ns"


def worker(root: Path, stage: str, out: Path) -> None:
    import ddpipe
    from ddpipe.comm import init_comm

    comm = init_comm()
    loader = ddpipe.EncodedStream(root, 8, shuffle="partial", exchange_fraction=0.3, shard_assignment="rotate",
                           stage_dir=stage, comm=comm)
    once, peer_copied = True, 0
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        keys = [s["__key__"] for batch in loader for s in batch]
        everyone = [k for ks in comm.allgather(keys) for k in ks]
        once = once and len(everyone) == len(set(everyone)) == len(loader) * 8 * comm.world.size
    if loader.stager is not None:
        peer_copied = int(loader.stager.stats["peer_copied"])
    report = comm.allgather({"once": once, "peer_copied": peer_copied})
    if comm.world.rank == 0:
        out.write_text(json.dumps(report))


def launch(place: str, root: Path, run: int) -> dict[str, object]:
    exe = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    stage = DATA / "peer-soak-stage" / f"{place}-{run}"
    shutil.rmtree(stage, ignore_errors=True)
    out = stage / "report.json"
    stage.mkdir(parents=True)
    where = (["-launcher", "ssh", "-launcher-exec", str(SSH_NS), "-hosts", "127.0.0.2,127.0.0.3", "-ppn", "2"]
             if place == "hosts" else [])
    env = {**os.environ, **({"MPIR_CVAR_NUM_CLIQUES": "2"} if place == "cliques" else {})}
    command = [exe, *where, "-n", "4", sys.executable, __file__, "--worker", str(root), str(stage / "node{node}"),
               str(out)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=HANG_BOUND,
                              start_new_session=True)
        outcome = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        outcome = f"hung past {HANG_BOUND:.0f} s"
    seconds = time.perf_counter() - t0
    report = json.loads(out.read_text()) if outcome == "ok" and out.exists() else []
    if outcome == "ok" and not all(r["once"] for r in report):
        outcome = "a sample missing or repeated"
    shutil.rmtree(stage, ignore_errors=True)
    return {"place": place, "run": run, "outcome": outcome, "seconds": seconds,
            "peer_copied": sum(int(r["peer_copied"]) for r in report)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--n", type=int, default=480)
    ap.add_argument("--places", nargs="+", default=["cliques", "hosts"], choices=["cliques", "hosts"])
    ap.add_argument("--worker", nargs=3, metavar=("DATA", "STAGE", "OUT"))
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), args.worker[1], Path(args.worker[2]))
        return
    if "hosts" in args.places and os.geteuid() != 0:
        raise SystemExit("the 'hosts' runs need root (tests/hosts/ssh-ns uses unshare): --places cliques")
    root = synth_shards(args.n, "peer-soak", shard_bytes=1_000_000)
    runs, rows = [], []
    for place in args.places:
        mine = []
        for run in range(args.runs):
            result = launch(place, root, run)
            print(f"{place} run {run + 1}/{args.runs}: {result['outcome']} ({result['seconds']:.1f} s, "
                  f"{result['peer_copied']} shards from the peer)", file=sys.stderr, flush=True)
            mine.append(result)
        runs += mine
        passed = [r for r in mine if r["outcome"] == "ok"]
        rows.append({"place": place, "runs": len(mine), "passed": len(passed), "failed": len(mine) - len(passed),
                     "median_s": statistics.median(float(str(r["seconds"])) for r in mine),
                     "peer_copied": statistics.median(int(str(r["peer_copied"])) for r in passed) if passed else 0})
    text = table(rows, [("place", "nodes made by", "s"), ("runs", "runs", "d"), ("passed", "passed", "d"),
                        ("failed", "failed", "d"), ("median_s", "median run (s)", ".1f"),
                        ("peer_copied", "shards copied from the peer per run (median)", ".0f")])
    command = f"python benchmarks/peer_staging_soak.py --runs {args.runs} --n {args.n}"
    path = save("peer_staging_soak", {"benchmark": "peer_staging_soak", "command": command, "machine": machine(),
                                      "epochs": EPOCHS, "rows": rows, "runs": runs, "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
