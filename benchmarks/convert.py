"""What making shards costs: ``ddpipe convert`` of an ImageFolder of JPEGs into tar shards, against
the limits of the same cores and disk measured in the same run, and against the webdataset library's
own writer.

    python benchmarks/convert.py [--n 3000] [--workers 2] [--repeats 3] [--shard-size 16MB]

Data: synth ImageNet-like JPEGs (about 110 KB each) in class directories, read warm (from the page
cache: every row reads the same files, the first run brings them in), written to the benchmark's data
directory, emptied before each run, as shards of ``--shard-size`` (16 MB: a few thousand images make
enough shards for every worker, as ImageNet's 140 GB make of 256 MB, the default for a folder of
images). Rows, each the median of the repeats:

- ddpipe convert, with its check (every image decoded whole, at 1/8 scale, so that one cut short is
  found before training; the default), and without it (``--no-decode-check``), ``--workers`` each,
  and without it in one worker, the default (the main process: no worker processes to start);
- the check's limit: the same check (every image decoded at 1/8 scale, decode_check) in as many
  processes, the files read, nothing written: what the check costs these cores by itself;
- the write's limit: as many bytes as the images hold, written by ``dd`` straight to the disk
  (``oflag=direct``, 16 MB at a time): ddpipe makes each shard durable before naming it, so no
  conversion ends before its bytes are on the disk;
- GNU ``tar`` packing the same files into one archive (C, one process, nothing else done), then
  flushed: the way by hand, writing first and flushing after (ddpipe flushes each shard while it
  writes the next, so it may beat it);
- the peers' way: the webdataset library's ``ShardWriter`` fed by one process reading the files (no
  check, no checksum, no index, and nothing flushed: its shards may still be in memory when it ends).

Then indexing the tars a conversion made, as ``ddpipe index`` does (DALI's index from each tar's
headers), by ddpipe and by DALI's own ``wds2idx`` (GNU tar's listing), in turns, the indexes
compared byte for byte.

*/ limit*: a conversion's rate over its limit's (with the check: the check's; without: the write's);
*/ tar*: over GNU tar's, then flushed; */ webdataset*: over the webdataset library's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from _common import DATA, save, synth_images

import ddpipe
from ddpipe.bench.harness import machine, median, table
from ddpipe.formats.tar_index import scan_tar_members, write_dali_index
from ddpipe.units import parse_size


def images_of(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))


def convert(src: Path, out: Path, shard_bytes: int, workers: int, check: bool) -> None:
    ddpipe.convert(src, out, ddpipe.ConvertOptions(format="wds", shard_bytes=shard_bytes, workers=workers,
                                                   decode_check=check, progress=False))


def check_some(paths: list[Path]) -> int:
    """The conversion's check on each file: read, then decoded whole at 1/8 scale."""
    from ddpipe.decode.spec import decode_check

    for path in paths:
        decode_check(path.read_bytes(), draft=True)
    return len(paths)


def check_limit(files: list[Path], workers: int) -> None:
    with ProcessPoolExecutor(workers) as pool:
        for _ in pool.map(check_some, [files[i::workers] for i in range(workers)]):
            pass


def disk_limit(out: Path, nbytes: int) -> None:
    """As many bytes as the images hold written straight to the disk, 16 MB at a time (``dd
    oflag=direct``): what the disk allows a conversion, which ends only once its shards are on it.
    (Written to the page cache and flushed after, as ``conv=fsync`` does, the flush waits for all of
    them at the end, as GNU tar's row does, and ddpipe, flushing each shard while it writes the
    next, beat it.)"""
    blocks = -(-nbytes // (16 << 20))
    subprocess.run(["dd", "if=/dev/zero", f"of={out / 'all'}", "bs=16M", f"count={blocks}", "oflag=direct",
                    "status=none"], check=True)


def tar_limit(src: Path, out: Path) -> None:
    """GNU tar packing the files, then its archive flushed to the disk, as ddpipe makes each shard
    durable before it names it."""
    subprocess.run(["tar", "-C", str(src), "-cf", str(out / "all.tar"), "."], check=True)
    fd = os.open(out / "all.tar", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def webdataset_writer(src: Path, out: Path, files: list[Path], shard_bytes: int) -> None:
    import webdataset as wds

    classes = {d.name: i for i, d in enumerate(sorted(p for p in src.iterdir() if p.is_dir()))}
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=shard_bytes, verbose=0) as sink:
        for path in files:
            sink.write({"__key__": f"{path.parent.name}/{path.stem}", "jpg": path.read_bytes(),
                        "cls": b"%d" % classes[path.parent.name]})


def index_shards(shards: list[Path], theirs: bool) -> None:
    """Each shard's DALI index made from its tar headers, by ddpipe or by DALI's own wds2idx (which
    lists the tar with GNU tar)."""
    for shard in shards:
        if theirs:
            import wds2idx  # ships with nvidia-dali

            with wds2idx.IndexCreator(str(shard), str(shard.with_suffix(".theirs.idx")), verbose=False) as creator:
                creator.create_index()
        else:
            write_dali_index(shard, shard.with_suffix(".ours.idx"))


def index_rows(src: Path, shard_bytes: int, repeats: int) -> list[dict[str, Any]]:
    """Indexing the tars a conversion made (``ddpipe index`` of a directory of tars, less the
    checksums), against DALI's wds2idx, in turns."""
    made = DATA / "convert-index"
    shutil.rmtree(made, ignore_errors=True)
    convert(src, made, shard_bytes, 1, False)
    shards = sorted(made.glob("*.tar"))
    samples = sum(len(scan_tar_members(shard)) for shard in shards)
    ways = {"ddpipe (tar_scan)": False, "DALI's wds2idx (GNU tar)": True}
    runs: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(repeats):
        for way, theirs in ways.items():
            t0 = time.perf_counter()
            index_shards(shards, theirs)
            runs[way].append(time.perf_counter() - t0)
    same = all(p.with_suffix(".ours.idx").read_bytes() == p.with_suffix(".theirs.idx").read_bytes() for p in shards)
    shutil.rmtree(made, ignore_errors=True)
    dali = samples / median(runs["DALI's wds2idx (GNU tar)"])
    return [{"way": way, "shards": len(shards), "samples_s": samples / median(seconds),
             "vs_dali": samples / median(seconds) / dali, "same_index": same, "runs": seconds}
            for way, seconds in runs.items()]


def timed(action: Any, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    action()
    seconds = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shard-size", default="16MB")
    args = ap.parse_args()
    shard_bytes = parse_size(args.shard_size)
    src = synth_images(args.n)
    files = images_of(src)
    megabytes = sum(p.stat().st_size for p in files) / 1e6
    out = DATA / "convert-out"
    w = args.workers
    ways = {
        f"ddpipe convert, check, {w} workers": lambda: convert(src, out, shard_bytes, w, True),
        f"ddpipe convert, no check, {w} workers": lambda: convert(src, out, shard_bytes, w, False),
        "ddpipe convert, no check, 1 worker": lambda: convert(src, out, shard_bytes, 1, False),
        f"the check alone (1/8 scale), {w} processes": lambda: check_limit(files, w),
        "GNU tar of the same files, then fsync": lambda: tar_limit(src, out),
        "the disk: dd of as many bytes, direct": lambda: disk_limit(out, int(megabytes * 1e6)),
        "webdataset ShardWriter, 1 process (no check)": lambda: webdataset_writer(src, out, files, shard_bytes),
    }
    check_some(files)  # the files into the page cache, for every row alike
    runs: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):  # the ways in turn, so that a slow moment of the machine is shared
        for name, action in ways.items():
            runs[name].append(timed(action, out))
    rate = {name: len(files) / median(seconds) for name, seconds in runs.items()}
    limit_of = {f"ddpipe convert, check, {w} workers": f"the check alone (1/8 scale), {w} processes",
                f"ddpipe convert, no check, {w} workers": "the disk: dd of as many bytes, direct",
                "ddpipe convert, no check, 1 worker": "the disk: dd of as many bytes, direct"}
    wds_rate = rate["webdataset ShardWriter, 1 process (no check)"]
    tar_rate = rate["GNU tar of the same files, then fsync"]
    rows = [{"way": name, "img_s": rate[name], "mb_s": megabytes * rate[name] / len(files),
             "of_limit": rate[name] / rate[limit_of[name]] if name in limit_of else None,
             "vs_tar": rate[name] / tar_rate if name in limit_of else None,
             "vs_webdataset": rate[name] / wds_rate if name in limit_of else None} for name in ways]
    text = table(rows, [("way", "way", "s"), ("img_s", "images/s", ".0f"), ("mb_s", "MB/s", ".0f"),
                        ("of_limit", "/ limit", ".2f"), ("vs_tar", "/ tar", ".2f"),
                        ("vs_webdataset", "/ webdataset", ".2f")])
    indexing = index_rows(src, shard_bytes, args.repeats)
    text += "\n\nIndexing the tars made (the same indexes, byte for byte: " + \
        ("yes" if all(r["same_index"] for r in indexing) else "NO") + "):\n\n" + \
        table(indexing, [("way", "way", "s"), ("shards", "shards", "d"), ("samples_s", "samples/s", ".0f"),
                         ("vs_dali", "/ DALI's", ".2f")])
    command = (f"python benchmarks/convert.py --n {args.n} --workers {w} --repeats {args.repeats} "
               f"--shard-size {args.shard_size}")
    path = save("convert", {"benchmark": "convert", "command": command, "machine": machine(), "images": len(files),
                            "megabytes": megabytes, "rows": rows, "runs": runs, "indexing": indexing,
                            "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
