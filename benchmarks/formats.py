"""Conversion and sequential-read throughput of each shard format, against raw reads of the same bytes.

    python benchmarks/formats.py [--n 3000] [--repeats 5] [--shard-size 64MB]

For every format: conversion MB/s (ImageFolder -> shards, one writer; every image decoded whole, as
``convert`` does by default, and with ``--no-decode-check``), then sequential read MB/s
of the whole dataset as a rank reads its share (each shard checked against the manifest before its
samples are used, as the Loader does, and without that check; the checked read against the
unchecked one beside it), cold (evicted from the page cache) and warm, as a ratio to a plain
``open().readinto()`` of the same shard files measured in the same run, right before; and the
``webdataset`` library reading the same tar shards. Then the same images as other tools store them
(HDF5 written with plain h5py, a Caffe LMDB), adopted in place with ``ddpipe index`` and read the
same way. Medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import webdataset as wds
from _common import DATA, raw_read, save, synth_images

import ddpipe

# benchmarks/ is on sys.path when a script here runs
from ddpipe.bench.harness import evict_page_cache, machine, median, table, timed
from ddpipe.convert import ConvertOptions, convert, parse_size
from ddpipe.reading import read_samples

FORMATS = ["wds", "hdf5", "lmdb"]


def shard_files(root: Path) -> list[Path]:
    return [root / s.file for s in ddpipe.load_manifest(root).shards]


def ddpipe_read(root: Path, verify: bool = True) -> int:
    """Every sample, in order, as a rank reads its share (``read_samples``); ``verify``: each shard
    checked against the manifest before its samples are used (the Loader's default)."""
    dataset = ddpipe.open_dataset(root)
    n = 0
    for sample in read_samples(dataset, np.arange(len(dataset)), verify=verify):
        n += len(sample["jpg"]) + len(sample["cls"])
    return n


def webdataset_read(files: list[Path]) -> int:
    n = 0
    for sample in wds.WebDataset([str(p) for p in files], shardshuffle=False):
        n += len(sample["jpg"]) + len(sample["cls"])
    return n


def ratio(subject: list[float], reference: list[float]) -> float:
    """Median of per-repeat ratios: each repeat's subject against the reference measured beside it."""
    return median([a / b for a, b in zip(subject, reference, strict=True)])


def bench_format(fmt: str, images: Path, image_bytes: int, out: Path, repeats: int,
                 shard_bytes: int) -> list[dict[str, Any]]:
    convert_times: list[float] = []
    unchecked_times: list[float] = []
    for _ in range(max(1, repeats // 2)):
        for check, times in ((False, unchecked_times), (True, convert_times)):  # the checked one is kept
            shutil.rmtree(out, ignore_errors=True)
            raw_read(sorted(images.rglob("*.jpg")))  # source warm: measure the writer, not the source disk
            seconds, _ = timed(convert, images, out, ConvertOptions(format=fmt, shard_bytes=shard_bytes,
                                                                    progress=False, decode_check=check))
            times.append(seconds)
    rows = read_rows(f"ddpipe {fmt}", out, repeats, peer=fmt == "wds")
    rows[0].update(convert_mb_s=image_bytes / 1e6 / median(convert_times),
                   convert_unchecked_mb_s=image_bytes / 1e6 / median(unchecked_times))
    return rows


def read_rows(name: str, root: Path, repeats: int, peer: bool = False) -> list[dict[str, Any]]:
    """Sequential reads of a dataset's every sample, cold and warm, checked and not, each against raw
    reads of the same files measured beside it."""
    files = shard_files(root)
    manifest = ddpipe.load_manifest(root)
    nbytes = manifest.num_bytes
    speed: dict[str, list[float]] = {k: [] for k in ("cold", "cold_raw", "warm", "warm_raw", "peer_cold", "peer_warm",
                                                     "cold_unchecked", "warm_unchecked")}
    for _ in range(repeats):
        # reference and subject alternate within each repeat, so drift in the machine hits both
        evict_page_cache(files)
        speed["cold_raw"].append(nbytes / timed(raw_read, files)[0] / 1e6)
        evict_page_cache(files)
        speed["cold"].append(nbytes / timed(ddpipe_read, root)[0] / 1e6)
        speed["warm_raw"].append(nbytes / timed(raw_read, files)[0] / 1e6)
        speed["warm"].append(nbytes / timed(ddpipe_read, root)[0] / 1e6)
        evict_page_cache(files)
        speed["cold_unchecked"].append(nbytes / timed(ddpipe_read, root, False)[0] / 1e6)
        speed["warm_unchecked"].append(nbytes / timed(ddpipe_read, root, False)[0] / 1e6)
        if peer:
            evict_page_cache(files)
            speed["peer_cold"].append(nbytes / timed(webdataset_read, files)[0] / 1e6)
            speed["peer_warm"].append(nbytes / timed(webdataset_read, files)[0] / 1e6)
    common = {"shards": len(files), "bytes": nbytes, "samples": manifest.num_samples,
              "cold_raw_mb_s": median(speed["cold_raw"]), "warm_raw_mb_s": median(speed["warm_raw"])}

    def row(reader: str, cold: list[float], warm: list[float]) -> dict[str, Any]:
        return {"format": reader, **common, "convert_mb_s": None, "convert_unchecked_mb_s": None,
                "cold_mb_s": median(cold), "cold_ratio": ratio(cold, speed["cold_raw"]),
                "warm_mb_s": median(warm), "warm_ratio": ratio(warm, speed["warm_raw"])}

    rows = [row(name, speed["cold"], speed["warm"]),
            row(f"{name}, no integrity check", speed["cold_unchecked"], speed["warm_unchecked"])]
    # what the check costs: each repeat's checked read against the unchecked one beside it
    rows[0].update(checked_cold=ratio(speed["cold"], speed["cold_unchecked"]),
                   checked_warm=ratio(speed["warm"], speed["warm_unchecked"]))
    if peer:
        rows.append(row("webdataset lib (same tars)", speed["peer_cold"], speed["peer_warm"]))
    return rows


def foreign_datasets(images: Path, work: Path, shard_bytes: int) -> list[tuple[str, Path]]:
    """The same images as other tools store them, adopted in place by ``ddpipe index``: HDF5 files
    of variable-length uint8 images and integer labels (one file per ~shard_bytes), and an LMDB of
    Caffe Datums (encoded), as ``convert_imageset`` writes it."""
    import h5py
    import lmdb
    import numpy as np

    from ddpipe.convert.adopt_hdf5 import index_hdf5
    from ddpipe.convert.adopt_lmdb import index_lmdb

    classes = sorted(p.name for p in images.iterdir() if p.is_dir())
    items = [(p, classes.index(p.parent.name)) for p in sorted(images.rglob("*.jpg"))]
    h5 = work / "hdf5-foreign"
    h5.mkdir(parents=True)
    groups: list[list[tuple[Path, int]]] = [[]]
    size = 0
    for item in items:
        if size >= shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += item[0].stat().st_size
    for g, group in enumerate(groups):
        with h5py.File(h5 / f"part-{g:03d}.h5", "w") as f:
            ds = f.create_dataset("images", (len(group),), dtype=h5py.vlen_dtype(np.uint8))
            for i, (p, _) in enumerate(group):
                ds[i] = np.frombuffer(p.read_bytes(), dtype=np.uint8)
            f.create_dataset("labels", data=np.array([label for _, label in group], dtype=np.int64))
    index_hdf5(h5)
    caffe = work / "caffe-lmdb"
    env = lmdb.open(str(caffe), map_size=1 << 32)
    with env.begin(write=True) as txn:
        for i, (p, label) in enumerate(items):
            txn.put(b"%08d_%s" % (i, p.name.encode()), caffe_datum(p.read_bytes(), label))
    env.close()
    index_lmdb(caffe)
    return [("adopted HDF5 (h5py vlen)", h5), ("adopted Caffe LMDB", caffe)]


def caffe_datum(data: bytes, label: int) -> bytes:
    """An encoded Caffe Datum: data (field 4), label (5), encoded (7)."""
    def varint(v: int) -> bytes:
        out = bytearray()
        while True:
            out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
            v >>= 7
            if not v:
                return bytes(out)

    return b"\x22" + varint(len(data)) + data + b"\x28" + varint(label) + b"\x38\x01"


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
        rows += bench_format(fmt, images, image_bytes, work / fmt, args.repeats, parse_size(args.shard_size))
        print(f"  {fmt}: done", file=sys.stderr)
    for name, root in foreign_datasets(images, work, parse_size(args.shard_size)):
        rows += read_rows(name, root, args.repeats)
        print(f"  {name}: done", file=sys.stderr)
    cols = [("format", "reader", "s"), ("convert_mb_s", "convert MB/s", ".0f"),
            ("convert_unchecked_mb_s", "convert, no decode check", ".0f"), ("cold_mb_s", "cold MB/s", ".0f"),
            ("cold_raw_mb_s", "raw cold MB/s", ".0f"), ("cold_ratio", "cold / raw", ".2f"),
            ("warm_mb_s", "warm MB/s", ".0f"), ("warm_raw_mb_s", "raw warm MB/s", ".0f"),
            ("warm_ratio", "warm / raw", ".2f"), ("checked_cold", "checked / unchecked, cold", ".2f"),
            ("checked_warm", "checked / unchecked, warm", ".2f")]
    text = table(rows, cols)
    command = f"python benchmarks/formats.py --n {args.n} --repeats {args.repeats} --shard-size {args.shard_size}"
    doc = {"benchmark": "formats", "command": command, "machine": machine(), "images": args.n,
           "image_bytes": image_bytes, "repeats": args.repeats, "rows": rows, "table": text}
    path = save("formats", doc)
    print(text)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
