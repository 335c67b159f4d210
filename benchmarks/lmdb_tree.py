"""What walking an LMDB file's tree before LMDB reads it costs (ddpipe/formats/lmdb_tree.py).

    python benchmarks/lmdb_tree.py [--n 3000] [--repeats 7]

LMDB follows the page numbers its file holds without bounds, so every LMDB file ddpipe opens is
walked first, bounded (a damaged one is then an error, not a crash). The walk reads the tree's
pages; the reference is the read it guards, measured beside it on the same files. Warm: every
record read in order, unchecked, the files in the page cache (``read_samples(verify=False)``, which
walks each file once too). Cold (the files evicted from the page cache first): the walk of every
file, as ddpipe walks it (each level's pages asked for at once, each read alone) and a page at a
time through a plain mapping (as it walked before: each fault read the kernel's read-ahead window
around its page), with the megabytes each read from the disk; and an epoch's first batch of 64
read unchecked, with the walk and with no walk (the read it guards, unguarded); and every key
listed from the leaf pages the walk reads (``tree_keys``, what an adopted LMDB's random reads
start from) against LMDB's own cursor listing them. Three kinds of
file: ddpipe's own LMDB shards of the synth images; one LMDB of the same images, as
``folder2lmdb``-style scripts write a whole dataset, adopted in place; and one of small records (a
few hundred bytes each), the walk's worst case (most records to a page). Medians of ``--repeats``,
the ways alternated.
"""

from __future__ import annotations

import argparse
import mmap
import time
from pathlib import Path
from typing import Any
from unittest.mock import patch

import lmdb
import numpy as np
from _common import DATA, cold, read_ahead_kb, save, synth_images, synth_shards

import ddpipe
from ddpipe.bench.harness import machine, median, table
from ddpipe.convert.adopt_lmdb import index_lmdb
from ddpipe.formats import lmdb_env
from ddpipe.formats.lmdb_tree import check_tree, tree_keys, tree_pages
from ddpipe.reading import read_samples


def whole_dataset_lmdb(images: Path, out: Path, small: bool) -> Path:
    """One LMDB environment of every image under ``images`` (or of small records), then adopted."""
    if not (out / "index.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        env = lmdb.open(str(out), map_size=1 << 36)
        with env.begin(write=True) as txn:
            for i, path in enumerate(sorted(images.rglob("*.jpg"))):
                for copy in range(30 if small else 1):  # small records: many to a page
                    value = path.read_bytes()[:200] if small else path.read_bytes()
                    txn.put(f"{path.parent.name}/{i:07d}_{copy:02d}".encode(), value)
        env.close()
        classes = sorted({p.parent.name for p in images.rglob("*.jpg")})
        index_lmdb(out, label_regex=r"^(?P<label>[^/]+)/", classes=classes)
    return out


def walk_a_page_at_a_time(path: Path) -> list[int]:
    """The walk as it was: through a plain mapping, each page faulted in as the walk reaches it (a
    memoryview, so that no page is asked for ahead)."""
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(data)
    pages = tree_pages(view)
    view.release()
    data.close()
    return pages


def cursor_keys(path: Path) -> list[bytes]:
    """Every key of the LMDB file at ``path`` as LMDB's cursor lists them (without values)."""
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        keys = [bytes(key) for key in txn.cursor().iternext(keys=True, values=False)]
    env.close()
    return keys


def first_batch(dataset: Path) -> None:
    batches = iter(ddpipe.EncodedStream(dataset, 64, shuffle="none", verify=False))
    next(batches)
    batches.close()


def measure(dataset: Path, repeats: int) -> dict[str, Any]:
    ds = ddpipe.open_dataset(dataset)
    files = [ds.data_root / s.file for s in ds.manifest.shards]
    everything = np.arange(len(ds))
    sum(1 for _ in read_samples(ds, everything, verify=False))  # warm: the files in the page cache
    walks, reads = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        for f in files:
            check_tree(f)
        walks.append(time.perf_counter() - t)
        t = time.perf_counter()
        sum(1 for _ in read_samples(ds, everything, verify=False))
        reads.append(time.perf_counter() - t)
    ways: dict[str, list[tuple[float, int]]] = {"walk": [], "walk_page": [], "first": [], "first_unwalked": [],
                                                 "keys": [], "cursor_keys": []}
    for _ in range(repeats):
        ways["walk"].append(cold(files, lambda: [check_tree(f) for f in files]))
        ways["walk_page"].append(cold(files, lambda: [walk_a_page_at_a_time(f) for f in files]))
        ways["first"].append(cold(files, lambda: first_batch(dataset)))
        # the reference: the same read, unguarded (no walk, so LMDB finds the records)
        with patch.object(lmdb_env, "file_tree", lambda path, identity=None: None):
            ways["first_unwalked"].append(cold(files, lambda: first_batch(dataset)))
        ways["keys"].append(cold(files, lambda: [tree_keys(f) for f in files]))
        ways["cursor_keys"].append(cold(files, lambda: [cursor_keys(f) for f in files]))
    walk, read = median(walks), median(reads)
    pages = sum(len(tree_pages(f.read_bytes())) for f in files)
    size = sum(f.stat().st_size for f in files)
    row = {"files": len(files), "records": len(ds), "tree_pages": pages, "file_mb": size / 1e6,
           "walk_ms": walk * 1e3, "walk_us_record": walk / len(ds) * 1e6, "read_ms": read * 1e3,
           "walk_over_read": median([w / r for w, r in zip(walks, reads, strict=True)])}
    for way, runs in ways.items():
        row[f"cold_{way}_ms"] = median([s for s, _ in runs]) * 1e3
        row[f"cold_{way}_mb"] = median([float(b) for _, b in runs]) / 1e6
    row["cold_first_over_unwalked"] = median([w[0] / u[0] for w, u in zip(ways["first"], ways["first_unwalked"],
                                                                           strict=True)])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    images = synth_images(args.n)
    sets = {"ddpipe's LMDB shards": synth_shards(args.n, "loader", "lmdb"),  # feed.py's
            "one LMDB of the images, adopted": whole_dataset_lmdb(images, DATA / f"lmdb-whole-{args.n}", small=False),
            "one LMDB of small records, adopted": whole_dataset_lmdb(images, DATA / f"lmdb-small-{args.n}", small=True)}
    rows = []
    for name, path in sets.items():
        row = {"data": name, **measure(path, args.repeats)}
        rows.append(row)
        print(row, flush=True)
    text = table(rows, [("data", "data", "s"), ("files", "files", "d"), ("records", "records", ",d"),
                        ("file_mb", "MB", ".0f"), ("tree_pages", "tree pages", ",d"), ("walk_ms", "walk ms", ".1f"),
                        ("walk_us_record", "walk us a record", ".2f"), ("read_ms", "unchecked warm read ms", ".1f"),
                        ("walk_over_read", "walk / read", ".3f")])
    cold_text = table(rows, [("data", "data", "s"), ("cold_walk_ms", "cold walk ms", ".1f"),
                             ("cold_walk_mb", "MB it reads", ".1f"),
                             ("cold_walk_page_ms", "a page at a time: ms", ".1f"),
                             ("cold_walk_page_mb", "MB it reads", ".1f"),
                             ("cold_first_ms", "cold first batch ms", ".1f"),
                             ("cold_first_unwalked_ms", "no walk: ms", ".1f"),
                             ("cold_first_over_unwalked", "walked / not", ".2f"),
                             ("cold_keys_ms", "keys listed: ms", ".1f"), ("cold_keys_mb", "MB it reads", ".1f"),
                             ("cold_cursor_keys_ms", "by LMDB's cursor: ms", ".1f"),
                             ("cold_cursor_keys_mb", "MB it reads", ".1f")])
    text = f"{text}\n\nCold:\n\n{cold_text}"
    print(text)
    doc = {"benchmark": "lmdb_tree", "command": f"python benchmarks/lmdb_tree.py --n {args.n} --repeats {args.repeats}",
           "machine": machine(), "read_ahead_kb": read_ahead_kb(DATA), "rows": rows, "table": text}
    print(f"wrote {save('lmdb_tree', doc)}")


if __name__ == "__main__":
    main()
