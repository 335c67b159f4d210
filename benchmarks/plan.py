"""``ddpipe plan`` at ImageNet scale: scores for every Q at W = 2,048 from the manifest alone.

    python benchmarks/plan.py [--world-size 2048] [--batch-size 32]

A synthetic manifest: 1,281,167 samples of 1,000 classes with ImageNet's spread of class sizes (732
to 1,300), in class order, cut into 1,024 shards, each an empty sparse file of the size the manifest
records (the command checks each shard's size, so that a manifest cannot claim more samples than
its files hold, and reads none). The command runs as a user runs it, in a fresh process; the
target is under one minute. Measured in the same run for reference: planning one epoch of a global
shuffle in this process (the cheapest plan), so the ratio shows what scoring the local, partial and
global plans costs on top.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
from _common import DATA, save

import ddpipe
from ddpipe.bench.harness import machine, table
from ddpipe.manifest import Manifest, ShardInfo, label_runs, save_manifest

SAMPLES, CLASSES, SHARDS = 1_281_167, 1000, 1024
TARGET_SECONDS = 60.0


def imagenet_like_manifest() -> Manifest:
    rng = np.random.default_rng(0)
    sizes = np.full(CLASSES, 1300)
    short = rng.choice(CLASSES, 100, replace=False)  # ImageNet: 1,300 for most classes, fewer for some
    sizes[short] = rng.integers(732, 1300, len(short))
    sizes[short[0]] += SAMPLES - int(sizes.sum())  # exactly 1,281,167 in all
    labels = np.repeat(np.arange(CLASSES), sizes)
    bounds = [i * SAMPLES // SHARDS for i in range(SHARDS + 1)]
    # bytes as ImageNet's JPEGs take (110 KB on average): a manifest must say a size its samples fit in
    shards = tuple(ShardInfo(f"shard-{i:06d}.tar", bounds[i + 1] - bounds[i], (bounds[i + 1] - bounds[i]) * 110_000,
                             "xxh3_64:0",
                             label_runs(labels[bounds[i] : bounds[i + 1]].tolist())) for i in range(SHARDS))
    return Manifest("wds", ("cls", "jpg"), tuple(f"n{c:08d}" for c in range(CLASSES)), shards)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    root = DATA / "imagenet-manifest"
    root.mkdir(parents=True, exist_ok=True)
    manifest = imagenet_like_manifest()
    save_manifest(root, manifest)
    for shard in manifest.shards:  # sparse, of the recorded sizes: ddpipe plan checks each size and reads none
        with open(root / shard.file, "wb") as f:
            f.truncate(shard.bytes)

    t0 = time.perf_counter()
    ddpipe.plan_epoch(manifest, args.world_size, 0, 0, ddpipe.PlanOptions(shuffle="global", batch_size=args.batch_size))
    reference = time.perf_counter() - t0

    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ddpipe", "plan", str(root), "--world-size", str(args.world_size),
                           "--batch-size", str(args.batch_size), "--json"], capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - t0
    advice = json.loads(proc.stdout)
    rows = [{"what": f"ddpipe plan, W={args.world_size}, {len(advice['scores'])} plans scored", "seconds": seconds,
             "ratio": seconds / TARGET_SECONDS, "vs_reference": seconds / reference},
            {"what": "one global-shuffle plan in-process (reference)", "seconds": reference,
             "ratio": reference / TARGET_SECONDS, "vs_reference": 1.0}]
    text = table(rows, [("what", "run", "s"), ("seconds", "seconds", ".2f"), ("ratio", "of the 60 s target", ".2f"),
                        ("vs_reference", "x reference", ".1f")])
    scores = table([{"mode": m["shuffle"] if m["shuffle"] != "partial" else f"partial Q={m['exchange_fraction']:g}",
                     **m} for m in advice["scores"]],
                   [("mode", "shuffle", "s"), ("batch_skew", "batch skew", ".3f"), ("rank_skew", "rank skew", ".3f"),
                    ("step_skew", "step skew", ".3f"), ("gap_closed", "batch-skew gap closed", ".2f")])
    doc = {"benchmark": "plan", "command": f"python benchmarks/plan.py --world-size {args.world_size} "
           f"--batch-size {args.batch_size}", "machine": machine(), "samples": SAMPLES, "shards": SHARDS,
           "rows": rows, "advice": advice, "summary_table": text, "table": scores,
           "note": f"Chosen (the smallest Q closing {100 * (1 - advice['within']):.0f}% of the batch-skew gap): "
                   f"Q = {advice['chosen_exchange_fraction']}; limited by the shuffle buffer (step skew over twice "
                   f"a global shuffle's): {'yes' if advice['buffer_bound'] else 'no'}."}
    path = save("plan", doc)
    print(text)
    print()
    print(scores)
    print(f"chosen Q: {advice['chosen_exchange_fraction']}")
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
