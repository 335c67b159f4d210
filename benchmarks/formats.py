"""Conversion and sequential-read throughput of each shard format, against raw reads of the same bytes.

    python benchmarks/formats.py [--n 3000] [--repeats 5] [--shard-size 64MB]

For every format: conversion MB/s (ImageFolder -> shards, one writer), then sequential read MB/s
of the whole dataset, cold (evicted from the page cache) and warm, as a ratio to a plain
``open().readinto()`` of the same shard files measured in the same run, right before; and the
``webdataset`` library reading the same tar shards. Medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import webdataset as wds  # noqa: E402
from _common import DATA, evict, machine, median, save, synth_images, table, timed  # noqa: E402

import ddpipe  # noqa: E402
from ddpipe.convert import ConvertOptions, convert, parse_size  # noqa: E402

FORMATS = ["wds", "hdf5", "lmdb"]


def shard_files(root: Path) -> list[Path]:
    return [root / s.file for s in ddpipe.load_manifest(root).shards]


def raw_read(files: list[Path]) -> int:
    """The reference: plain reads of the same files into one reused 8 MB buffer (no per-read allocation,
    which would make the reference slower than the subject)."""
    buf = bytearray(8 << 20)
    n = 0
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while k := f.readinto(buf):
                n += k
    return n


def ddpipe_read(root: Path) -> int:
    n = 0
    for sample in ddpipe.open_dataset(root):
        n += len(sample["jpg"]) + len(sample["cls"])
    return n


def webdataset_read(files: list[Path]) -> int:
    n = 0
    for sample in wds.WebDataset([str(p) for p in files], shardshuffle=False):
        n += len(sample["jpg"]) + len(sample["cls"])
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shard-size", default="64MB")
    args = ap.parse_args()

    images = synth_images(args.n)
    image_bytes = sum(p.stat().st_size for p in images.rglob("*.jpg"))
    work = DATA / "formats"
    shutil.rmtree(work, ignore_errors=True)
    rows = []
    for fmt in FORMATS:
        out = work / fmt
        convert_times = []
        for r in range(max(1, args.repeats // 2)):
            shutil.rmtree(out, ignore_errors=True)
            raw_read(sorted(images.rglob("*.jpg")))  # source warm: measure the writer, not the source disk
            t, manifest = timed(lambda out=out: convert(
                images, out, ConvertOptions(format=fmt, shard_bytes=parse_size(args.shard_size), progress=False)))
            convert_times.append(t)
        files = shard_files(out)
        nbytes = manifest.num_bytes
        cold, cold_raw, warm, warm_raw, peer_cold, peer_warm = [], [], [], [], [], []
        for _ in range(args.repeats):
            # reference and subject alternate within each repeat, so drift in the machine hits both
            evict(files)
            cold_raw.append(nbytes / timed(lambda: raw_read(files))[0])
            evict(files)
            cold.append(nbytes / timed(lambda out=out: ddpipe_read(out))[0])
            warm_raw.append(nbytes / timed(lambda: raw_read(files))[0])
            warm.append(nbytes / timed(lambda out=out: ddpipe_read(out))[0])
            if fmt == "wds":
                evict(files)
                peer_cold.append(nbytes / timed(lambda: webdataset_read(files))[0])
                peer_warm.append(nbytes / timed(lambda: webdataset_read(files))[0])
        row = {
            "format": fmt, "shards": len(files), "bytes": nbytes, "samples": manifest.num_samples,
            "convert_mb_s": image_bytes / 1e6 / median(convert_times),
            "cold_mb_s": median(cold) / 1e6, "cold_raw_mb_s": median(cold_raw) / 1e6,
            "cold_ratio": median([a / b for a, b in zip(cold, cold_raw, strict=True)]),
            "warm_mb_s": median(warm) / 1e6, "warm_raw_mb_s": median(warm_raw) / 1e6,
            "warm_ratio": median([a / b for a, b in zip(warm, warm_raw, strict=True)]),
        }
        rows.append(row)
        if fmt == "wds":
            rows.append({"format": "webdataset lib (same tars)", "shards": len(files), "bytes": nbytes,
                         "samples": manifest.num_samples, "convert_mb_s": None,
                         "cold_mb_s": median(peer_cold) / 1e6, "cold_raw_mb_s": row["cold_raw_mb_s"],
                         "cold_ratio": median([a / b for a, b in zip(peer_cold, cold_raw, strict=True)]),
                         "warm_mb_s": median(peer_warm) / 1e6, "warm_raw_mb_s": row["warm_raw_mb_s"],
                         "warm_ratio": median([a / b for a, b in zip(peer_warm, warm_raw, strict=True)])})
        print(f"  {fmt}: done", file=sys.stderr)
    cols = [("format", "reader", "s"), ("convert_mb_s", "convert MB/s", ".0f"), ("cold_mb_s", "cold MB/s", ".0f"),
            ("cold_raw_mb_s", "raw cold MB/s", ".0f"), ("cold_ratio", "cold / raw", ".2f"),
            ("warm_mb_s", "warm MB/s", ".0f"), ("warm_raw_mb_s", "raw warm MB/s", ".0f"),
            ("warm_ratio", "warm / raw", ".2f")]
    text = table(rows, cols)
    command = f"python benchmarks/formats.py --n {args.n} --repeats {args.repeats} --shard-size {args.shard_size}"
    doc = {"benchmark": "formats", "command": command, "machine": machine(), "images": args.n,
           "image_bytes": image_bytes, "repeats": args.repeats, "rows": rows, "table": text}
    path = save("formats", doc)
    print(text)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
