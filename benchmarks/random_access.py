"""What a rank's random reads (``shuffle="global"``) take from a cold disk, against the same samples
read in shard order.

    python benchmarks/random_access.py [--n 3000] [--share 8] [--repeats 5] [--reference CHECKOUT ...] [--name NAME]
                                       [--first-epoch]

One rank's share of a global shuffle, a random ``1/share`` of the dataset's samples, read cold
(the files out of the page cache) with ``read_samples(random_access=True)``, checked as ddpipe
checks by default and unchecked (``verify=False``); the reference, in the same run: the same
samples, read in shard order (a sequential scan that skips the samples between them). Each way's
time and the megabytes it had read from the disk (the kernel's count: read-ahead included), against
the megabytes the samples hold. A checked random read of a share of each ddpipe shard checks each
sample against the digest its manifest records, as it does for adopted HDF5 files (h5py's
variable-length rows) and an adopted LMDB; the same shards under a manifest without digests (as
ddpipe wrote them before it recorded digests: hard links to the files, the digests taken out) are
hashed whole first, so read whole either way: each checked random read is set against that one,
``vs_no_digests``, cold and warm (the files in the page cache; its mappings, kept from one read to
the next as a loader's epochs keep them, too). Medians of ``--repeats``, the ways alternated.
``--reference`` (repeatable) measures an earlier commit's ddpipe on the same files, each tree in a
process of its own, the trees alternated from one data set to the next; each row of this tree's
gives its ratio to each reference (``vs_at_<commit>``, cold and warm). ``--first-epoch``: each read
opens the dataset anew, so that none follows what an earlier one learnt of the files or kept open (a
job's first epoch); by default the dataset stays open from one read to the next, as a loader's does.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import DATA, cold, commit_of, env_of, read_ahead_kb, save, synth_images, synth_shards, trees_to_measure
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


def without_digests(path: Path) -> Path:
    """The dataset at ``path`` as ddpipe wrote it before it recorded sample digests: hard links to its
    files (the same pages in the cache), beside a manifest without them."""
    out = path.parent / f"{path.name}-no-digests"
    if not (out / "index.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        for f in path.iterdir():
            if f.is_file() and f.name != "index.json":
                os.link(f, out / f.name)
        doc = json.loads((path / "index.json").read_text())
        for shard in doc["shards"]:
            shard.pop("digests", None)
        (out / "index.json").write_text(json.dumps(doc))
    return out


def measure(path: Path, share: int, repeats: int, verify: bool, first_epoch: bool = False) -> dict[str, Any]:
    opened = ddpipe.open_dataset(path)
    files = [opened.data_root / s.file for s in opened.manifest.shards]
    mine = np.random.default_rng(0).permutation(len(opened))[: len(opened) // share]

    def ds() -> ddpipe.Dataset:
        return ddpipe.open_dataset(path) if first_epoch else opened

    ways = {"random": lambda: collections.deque(read_samples(ds(), mine, random_access=True, verify=verify), 0),
            "in_order": lambda: collections.deque(read_samples(ds(), np.sort(mine), verify=verify), 0)}
    runs: dict[str, list[tuple[float, int]]] = {way: [] for way in ways}
    for _ in range(repeats):
        for way, work in ways.items():
            runs[way].append(cold(files, work))
    warm = []  # after the cold ones: a mapping kept would keep its file's pages in the cache
    for _ in range(repeats + 1):  # the first brings the files in, and makes the mappings a loader keeps
        t = time.perf_counter()
        collections.deque(read_samples(ds(), mine, random_access=True, verify=verify, keep_mapped=True), 0)
        warm.append(time.perf_counter() - t)
    row: dict[str, Any] = {"samples": len(mine), "sample_mb": sample_bytes(opened, mine) / 1e6,
                           "file_mb": sum(f.stat().st_size for f in files) / 1e6}
    for way, measured in runs.items():
        row[f"{way}_ms"] = median([s for s, _ in measured]) * 1e3
        row[f"{way}_mb"] = median([float(b) for _, b in measured]) / 1e6
    row["random_over_in_order"] = median([r[0] / o[0] for r, o in zip(runs["random"], runs["in_order"], strict=True)])
    row["random_read_over_samples"] = row["random_mb"] / row["sample_mb"]
    row["warm_random_ms"] = median(warm[1:]) * 1e3
    return row


def measured_in(tree: Path, path: Path, share: int, repeats: int, check: str, first_epoch: bool) -> dict[str, Any]:
    """:func:`measure` in a process of its own, importing ``tree``'s ddpipe."""
    command = [sys.executable, __file__, "--share", str(share), "--repeats", str(repeats), "--run", str(path), check]
    command += ["--first-epoch"] if first_epoch else []
    out = subprocess.run(command, capture_output=True, text=True, env=env_of(tree), cwd=tree, timeout=1200)
    if out.returncode != 0:
        sys.exit(f"random_access.py: {tree} {path.name} {check} exited {out.returncode}:\n{out.stderr[-4000:]}")
    got: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--share", type=int, default=8, help="the rank's share: 1/share of the samples")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reference", type=Path, action="append", default=[],
                    help="a checkout of an earlier commit, measured beside this one (repeatable)")
    ap.add_argument("--name", default="random_access", help="the result's name: benchmarks/results/NAME.json")
    ap.add_argument("--first-epoch", action="store_true",
                    help="open the dataset anew for each read: nothing learnt or kept from an earlier one")
    ap.add_argument("--run", nargs=2, metavar=("PATH", "CHECK"), help=argparse.SUPPRESS)  # a child's one measure
    args = ap.parse_args()
    if args.run:
        print(json.dumps(measure(Path(args.run[0]), args.share, args.repeats, args.run[1] == "checked",
                                 args.first_epoch)))
        return
    trees = trees_to_measure(args.reference)
    sets: dict[str, Path] = {}
    for fmt in ("wds", "hdf5", "lmdb"):
        sets[f"ddpipe {fmt}"] = synth_shards(args.n, "loader", fmt)
        sets[f"ddpipe {fmt}, no digests"] = without_digests(sets[f"ddpipe {fmt}"])
    sets["HDF5 files of the images, adopted"] = adopted_hdf5(args.n)
    sets["one LMDB of the images, adopted"] = whole_dataset_lmdb(synth_images(args.n), DATA / f"lmdb-whole-{args.n}",
                                                                 small=False)
    rows = []
    for k, (name, path) in enumerate(sets.items()):
        for verify in (True, False) if not name.endswith("no digests") else (True,):  # unchecked reads no digest
            check = "checked" if verify else "unchecked"
            for tree in list(trees) if k % 2 == 0 else list(trees)[::-1]:  # alternated: drift hits all alike
                row = {"data": name, "check": check, **({"tree": tree} if len(trees) > 1 else {}),
                       **(measure(path, args.share, args.repeats, verify, args.first_epoch) if len(trees) == 1
                          else measured_in(trees[tree], path, args.share, args.repeats, check, args.first_epoch))}
                rows.append(row)
                print(row, flush=True)
    mine = [r for r in rows if r.get("tree", "this") == "this"]
    for row in mine:
        whole = [r for r in mine if r["data"] == f"{row['data']}, no digests" and r["check"] == row["check"]]
        if whole:
            row["vs_no_digests"] = row["random_ms"] / whole[0]["random_ms"]
            row["warm_vs_no_digests"] = row["warm_random_ms"] / whole[0]["warm_random_ms"]
        for ref in (t for t in trees if t != "this"):
            theirs = next(r for r in rows
                          if r["tree"] == ref and r["data"] == row["data"] and r["check"] == row["check"])
            row[f"vs_at_{ref}"] = row["random_ms"] / theirs["random_ms"]
            row[f"warm_vs_at_{ref}"] = row["warm_random_ms"] / theirs["warm_random_ms"]
    by_tree = [("tree", "tree", "s")] if len(trees) > 1 else []
    text = table(rows, [("data", "data", "s"), ("check", "read", "s"), *by_tree, ("samples", "samples", ",d"),
                        ("sample_mb", "their MB", ".1f"), ("file_mb", "files' MB", ".0f"),
                        ("random_mb", "random: MB read", ".1f"), ("random_ms", "ms", ".0f"),
                        ("in_order_mb", "in order: MB read", ".1f"), ("in_order_ms", "ms", ".0f"),
                        ("random_over_in_order", "random / in order", ".2f"),
                        ("random_read_over_samples", "random MB read / their MB", ".2f"),
                        ("vs_no_digests", "random / without digests", ".2f"),
                        ("warm_random_ms", "warm: random ms", ".0f"),
                        ("warm_vs_no_digests", "random / without digests", ".2f"),
                        *[(f"{when}vs_at_{ref}", f"{label}random / at {ref}", ".2f") for ref in trees if ref != "this"
                          for when, label in (("", "cold: "), ("warm_", "warm: "))]])
    print(text)
    command = f"python benchmarks/random_access.py --n {args.n} --share {args.share} --repeats {args.repeats}"
    command += "".join(f" --reference <checkout of {ref}>" for ref in trees if ref != "this")
    if args.name != "random_access":
        command += f" --name {args.name}"
    if args.first_epoch:
        command += " --first-epoch"
    doc = {"benchmark": "random_access", "command": command, "commit": commit_of(trees["this"]),
           "machine": machine(), "read_ahead_kb": read_ahead_kb(DATA), "rows": rows, "table": text}
    print(f"wrote {save(args.name, doc)}")


if __name__ == "__main__":
    main()
