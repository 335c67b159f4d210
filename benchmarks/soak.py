"""Memory over a long run: resident memory after each of 20 epochs must level off and stay flat.

    python benchmarks/soak.py [--n 1000] [--epochs 20] [--ranks 2]

2 ranks, partial shuffle (Q = 0.3), node-local staging and DALI decoding on, batches of 64 images
(224x224 uint8). After each epoch every rank reads its resident set size (/proc/self/statm) and
the epoch's own peak (VmHWM, reset at the epoch's start through /proc/self/clear_refs); the growth
reported is from the end of epoch 1 to the end of the last, per rank, for both, and from the end of
epoch 5 (the heap keeps freed memory for reuse, and reaches its working size over the first few).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from _common import DATA, mpiexec, save, synth_shards

from ddpipe.bench.harness import machine, table

SETTLED = 4  # the end of epoch 5, counted from 0


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def epoch_peak_mb(reset: bool = False) -> float:
    """The peak resident set since the last reset (Linux's VmHWM)."""
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
        return 0.0
    line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


def worker(root: Path, stage: Path, epochs: int, out: Path) -> None:
    import ddpipe
    from ddpipe.comm import init_comm
    from ddpipe.decode import DecodeOptions

    comm = init_comm()
    loader = ddpipe.Loader(root, 64, shuffle="partial", exchange_fraction=0.3, decoder="dali-cpu", device="cpu",
                           decode=DecodeOptions(dtype="uint8"), stage_dir=stage, comm=comm)
    rss = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        epoch_peak_mb(reset=True)
        for _ in loader:
            pass
        rss.append((rss_mb(), epoch_peak_mb()))
    everyone = comm.allgather(rss)
    if comm.world.rank == 0:
        out.write_text(json.dumps(everyone))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--worker", nargs=3, metavar=("DATA", "STAGE", "OUT"))
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), Path(args.worker[1]), args.epochs, Path(args.worker[2]))
        return
    root = synth_shards(args.n, "soak")
    stage, out = DATA / "soak-stage", DATA / "soak.json"
    shutil.rmtree(stage, ignore_errors=True)
    mpiexec(args.ranks, __file__, "--epochs", args.epochs, "--worker", root, stage, out)
    per_rank = json.loads(out.read_text())
    rows = []
    for r, figures in enumerate(per_rank):
        rss, peaks = [f[0] for f in figures], [f[1] for f in figures]
        rows.append({"rank": r, "epoch1_mb": rss[0], "last_mb": rss[-1], "growth": (rss[-1] - rss[0]) / rss[0],
                     "epoch1_peak_mb": peaks[0], "last_peak_mb": peaks[-1], "max_peak_mb": max(peaks),
                     "peak_growth": (peaks[-1] - peaks[0]) / peaks[0],
                     "settled_growth": (rss[-1] - rss[SETTLED]) / rss[SETTLED]})
    last = args.epochs
    text = table(rows, [("rank", "rank", "d"), ("epoch1_mb", "RSS after epoch 1 (MB)", ".0f"),
                        ("last_mb", f"after epoch {last} (MB)", ".0f"), ("growth", "growth", "+.1%"),
                        ("epoch1_peak_mb", "epoch 1 peak (MB)", ".0f"),
                        ("last_peak_mb", f"epoch {last} peak (MB)", ".0f"),
                        ("max_peak_mb", "highest epoch peak (MB)", ".0f"), ("peak_growth", "peak growth", "+.1%"),
                        ("settled_growth", f"RSS growth, epochs {SETTLED + 1}-{last}", "+.1%")])
    command = f"python benchmarks/soak.py --n {args.n} --epochs {args.epochs} --ranks {args.ranks}"
    path = save("soak", {"benchmark": "soak", "command": command, "machine": machine(), "rows": rows,
                         "rss_mb_per_epoch": per_rank, "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
