"""What a rank's random reads (``shuffle="global"``) take from a cold disk, against the same samples
read in shard order.

    python benchmarks/random_access.py [--n 3000] [--share 8] [--repeats 5]

One rank's share of a global shuffle, a random ``1/share`` of the dataset's samples, read cold
(the files out of the page cache) with ``read_samples(random_access=True)``, checked as ddpipe
checks by default and unchecked (``verify=False``); the reference, in the same run: the same
samples, read in shard order (a sequential scan that skips the samples between them). Each way's
time and the megabytes it had read from the disk (the kernel's count: read-ahead included), against
the megabytes the samples hold. A checked read of a ddpipe shard hashes all of it first, so reads
it whole either way; adopted HDF5 files (h5py's variable-length rows) and an adopted LMDB are checked
sample by sample against their digests. Medians of
``--repeats``, the ways alternated.
"""

from __future__ import annotations

import argparse
import collections
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from _common import DATA, cold, read_ahead_kb, save, synth_images, synth_shards
from formats import foreign_datasets
from lmdb_tree import whole_dataset_lmdb

import ddpipe
from ddpipe.bench.harness import machine, median, table
from ddpipe.reading import read_samples
from ddpipe.sample import KEY


def adopted_hdf5(n: int) -> Path:
    """HDF5 files of the synth images as plain h5py writes them (variable-length rows), adopted in
    place: formats.py's, made once."""
    work = DATA / f"foreign-{n}"
    if not (work / "hdf5-foreign" / "index.json").exists():
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        foreign_datasets(synth_images(n), work, 16_000_000)
    return work / "hdf5-foreign"


def sample_bytes(dataset: Any, indices: np.ndarray) -> int:
    """The bytes the samples' fields hold (keys aside)."""
    return sum(len(value) for sample in read_samples(dataset, indices, verify=False)
               for name, value in sample.items() if name != KEY and isinstance(value, bytes | memoryview))


def measure(path: Path, share: int, repeats: int, verify: bool) -> dict[str, Any]:
    ds = ddpipe.open_dataset(path)
    files = [ds.data_root / s.file for s in ds.manifest.shards]
    mine = np.random.default_rng(0).permutation(len(ds))[: len(ds) // share]
    ways = {"random": lambda: collections.deque(read_samples(ds, mine, random_access=True, verify=verify), 0),
            "in_order": lambda: collections.deque(read_samples(ds, np.sort(mine), verify=verify), 0)}
    runs: dict[str, list[tuple[float, int]]] = {way: [] for way in ways}
    for _ in range(repeats):
        for way, work in ways.items():
            runs[way].append(cold(files, work))
    row: dict[str, Any] = {"samples": len(mine), "sample_mb": sample_bytes(ds, mine) / 1e6,
                           "file_mb": sum(f.stat().st_size for f in files) / 1e6}
    for way, measured in runs.items():
        row[f"{way}_ms"] = median([s for s, _ in measured]) * 1e3
        row[f"{way}_mb"] = median([float(b) for _, b in measured]) / 1e6
    row["random_over_in_order"] = median([r[0] / o[0] for r, o in zip(runs["random"], runs["in_order"], strict=True)])
    row["random_read_over_samples"] = row["random_mb"] / row["sample_mb"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--share", type=int, default=8, help="the rank's share: 1/share of the samples")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sets = {f"ddpipe {fmt}": synth_shards(args.n, "loader", fmt) for fmt in ("wds", "hdf5", "lmdb")}
    sets["HDF5 files of the images, adopted"] = adopted_hdf5(args.n)
    sets["one LMDB of the images, adopted"] = whole_dataset_lmdb(synth_images(args.n), DATA / f"lmdb-whole-{args.n}",
                                                                 small=False)
    rows = []
    for name, path in sets.items():
        for verify in (True, False):
            row = {"data": name, "check": "checked" if verify else "unchecked",
                   **measure(path, args.share, args.repeats, verify)}
            rows.append(row)
            print(row, flush=True)
    text = table(rows, [("data", "data", "s"), ("check", "read", "s"), ("samples", "samples", ",d"),
                        ("sample_mb", "their MB", ".1f"), ("file_mb", "files' MB", ".0f"),
                        ("random_mb", "random: MB read", ".1f"), ("random_ms", "ms", ".0f"),
                        ("in_order_mb", "in order: MB read", ".1f"), ("in_order_ms", "ms", ".0f"),
                        ("random_over_in_order", "random / in order", ".2f"),
                        ("random_read_over_samples", "random MB read / their MB", ".2f")])
    print(text)
    doc = {"benchmark": "random_access",
           "command": f"python benchmarks/random_access.py --n {args.n} --share {args.share} --repeats {args.repeats}",
           "machine": machine(), "read_ahead_kb": read_ahead_kb(DATA), "rows": rows, "table": text}
    print(f"wrote {save('random_access', doc)}")


if __name__ == "__main__":
    main()
