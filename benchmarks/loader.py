"""Images per second into training, against the tools users would otherwise use, in one run.

    python benchmarks/loader.py [--n 3000] [--repeats 3] [--warmup 4] [--only NAME ...]
    python benchmarks/loader.py --retable   # the recorded run's ratios and table again, measuring nothing

Every pipeline does the same training transform (random-resized crop to 224x224, scale 0.08-1,
ratio 3/4-4/3, horizontal flip, ImageNet normalisation to float32 NCHW; or uint8 where named) in
batches of 256, on the same synth ImageNet-like JPEGs, on the same cores. Each runs in a process
of its own (its peak resident memory and its threads once the timed epoch is under way, with its
worker processes', are reported; for several ranks, the largest rank's) for five epochs: four warm
up (--warmup), the last is timed. ddpipe's partial-shuffling rows run 1, 2, 4 and 8 ranks on the
same cores, as a node runs one rank per GPU, and so does DALI's webdataset reader (each rank its
1/world of the shards, the cores shared among the ranks alike). References in the same run: the
raw decode limit (simplejpeg full decode of the images in memory, one process per core at once),
the PyTorch DataLoader over the ImageFolder with PIL, the webdataset library's pipeline over the
same tars, and DALI's own file and webdataset readers (ddpipe/bench/peers.py, as ``ddpipe bench
--compare`` runs them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import DATA, RESULTS, save, synth_images, synth_shards

from ddpipe.bench.figures import rank_latency
from ddpipe.bench.harness import drain, evict_page_cache, machine, median, table

BATCH, SIZE = 256, 224
CORES = os.cpu_count() or 1
PEAKS: list[float] = []  # the ranks' peak memory, gathered by a multi-rank child
# epochs before the timed one: a process's heap grows to its steady size over the first few (8 ranks
# on 2 cores: the second epoch ran at 0.7 of the fifth), and training runs for many
WARMUP = 4


def peak_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


def threads_now(pid: int | str = "self") -> int:
    """Threads of a process and its descendants (a DataLoader's workers are processes of their own)."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        ids = os.listdir(tasks)
    except OSError:  # the process ended meanwhile
        return 0
    total = len(ids)
    for t in ids:
        try:
            children = (tasks / t / "children").read_text().split()
        except OSError:
            continue
        total += sum(threads_now(c) for c in children)
    return total


def timed_epochs(batches_of_epoch, warmup: int, start_together=lambda: None,  # type: ignore[no-untyped-def]
                 started: float | None = None) -> dict[str, Any]:
    """Run the warm-up epochs, then time one: images, seconds, threads once its first batch is out
    (every stage then running), and the latency a training step feels: the wait for the first batch
    cold (from ``started``, before the pipeline was made with its inputs out of the page cache, to
    the first epoch's first batch), the wait for the timed epoch's first batch (warm), and the waits
    for the batches after it (p50, p99, max). Several ranks start the timed epoch together: without
    an allreduce per step they drift apart, and a rank that finished its warm-up early would time the
    others' warm-up as part of its epoch."""
    first_cold = None
    for e in range(warmup):
        batches = iter(batches_of_epoch())
        if e == 0 and started is not None:
            next(batches, None)
            first_cold = time.perf_counter() - started
        drain(batches)
    start_together()
    t0, n, threads, waits = time.perf_counter(), 0, 0, []
    t = t0
    for b in batches_of_epoch():
        waits.append(time.perf_counter() - t)
        n += len(b)
        threads = threads or threads_now()  # a few /proc reads, once
        t = time.perf_counter()
    seconds = time.perf_counter() - t0
    felt = rank_latency(waits, 1)  # what ddpipe bench reports, over the one timed epoch
    ms = {f"wait_{k}_ms": None if (v := felt[f"wait_{k}_s"]) is None else 1e3 * v for k in ("p50", "p99", "max")}
    return {"images": n, "seconds": seconds, "threads": threads, "first_cold_s": first_cold,
            "first_warm_s": felt["first_batch_s"], **ms}


# ---- the peers (ddpipe/bench/peers.py: the same ones ``ddpipe bench --compare`` runs) -------------

def run_peer(name: str, images: Path, shards: Path, dtype: str, warmup: int) -> dict[str, Any]:
    """A peer on this rank's 1/world of the data, the node's cores shared among the ranks as ddpipe's are."""
    import ddpipe
    from ddpipe.bench.peers import PeerInputs, PeerOptions, input_files, make_peer

    comm = ddpipe.init_comm()  # the harness's: start together, gather the figures
    world = comm.world
    inputs = PeerInputs(images, sorted(shards.glob("*.tar")))
    if world.local_rank == 0:  # its first batch cold
        evict_page_cache(input_files(inputs))
    comm.barrier()
    started = time.perf_counter()
    options = PeerOptions(batch_size=BATCH, size=SIZE, dtype=dtype, workers=world.cores_per_rank, rank=world.rank,
                          world=world.size)
    return job_figures(comm, timed_epochs(make_peer(name, inputs, options), warmup, comm.barrier, started=started))


def run_ddpipe(root: Path, shuffle: str, decode: str, dtype: str, warmup: int, antialias: bool = True,
               verify: bool = True) -> dict[str, Any]:
    import ddpipe

    comm = ddpipe.init_comm()
    if comm.world.local_rank == 0:  # its first batch cold
        evict_page_cache(root / s.file for s in ddpipe.load_manifest(root).shards)
    comm.barrier()
    started = time.perf_counter()
    loader = ddpipe.Loader(root, BATCH, decoder=decode, device="cpu", shuffle=shuffle, exchange_fraction=0.3,
                           dtype=dtype, antialias=antialias, verify=verify, comm=comm)
    epoch = [0]

    def batches():  # type: ignore[no-untyped-def]
        loader.set_epoch(epoch[0])
        epoch[0] += 1
        return (x for x, _ in loader)

    return job_figures(comm, timed_epochs(batches, warmup, comm.barrier, started=started))


def job_figures(comm: Any, mine: dict[str, Any]) -> dict[str, Any]:
    """The job's figures from each rank's: every rank's images, and the slowest rank's time and
    waits (a data-parallel step waits for the slowest)."""
    ranks = comm.allgather(mine)
    PEAKS.extend(comm.allgather(peak_mb()))  # every rank's, for the largest per rank
    out: dict[str, Any] = {k: max((r[k] for r in ranks if r[k] is not None), default=None) for k in mine}
    out["images"] = sum(r["images"] for r in ranks)
    return out


def _decode_all(paths: list[Path]) -> float:
    import simplejpeg

    datas = [p.read_bytes() for p in paths]
    for d in datas[:20]:
        simplejpeg.decode_jpeg(d)
    t0 = time.perf_counter()
    for d in datas:
        simplejpeg.decode_jpeg(d)
    return time.perf_counter() - t0


def raw_decode(images: Path) -> tuple[int, float]:
    """simplejpeg full decode of images held in memory, one process per core at once (so that the
    limit is what these cores do together, not one core's rate times their number)."""
    from concurrent.futures import ProcessPoolExecutor

    paths = sorted(images.rglob("*.jpg"))[:600]
    with ProcessPoolExecutor(CORES) as pool:
        seconds = list(pool.map(_decode_all, [paths] * CORES))
    return len(paths) * CORES, max(seconds)


# ---- the harness ------------------------------------------------------------------------------

def runs(images: Path, data: Path) -> dict[str, tuple[int, list[str]]]:
    """name -> (ranks, arguments of --run)."""
    out: dict[str, tuple[int, list[str]]] = {
        "raw decode limit (simplejpeg, every core at once)": (1, ["raw"]),
        "PyTorch DataLoader + PIL (ImageFolder)": (1, ["torch"]),
        "webdataset library + PIL (same tars)": (1, ["webdataset"]),
        "DALI file reader": (1, ["dali-file"]),
        "DALI webdataset reader": (1, ["dali-wds"]),
        "DALI webdataset reader, uint8": (1, ["dali-wds", "uint8"]),
    }
    for fmt in ("wds", "hdf5", "lmdb"):
        out[f"ddpipe {fmt}, dali-cpu, none"] = (1, ["ddpipe", str(data / fmt), "none", "dali-cpu", "float32"])
    out["ddpipe wds, dali-cpu, none, uint8"] = (1, ["ddpipe", str(data / "wds"), "none", "dali-cpu", "uint8"])
    out["ddpipe wds, dali-cpu, none, uint8, no antialias"] = (1, ["ddpipe", str(data / "wds"), "none", "dali-cpu",
                                                                  "uint8", "noaa"])
    out["ddpipe wds, dali-cpu, none, no integrity check"] = (1, ["ddpipe", str(data / "wds"), "none", "dali-cpu",
                                                                 "float32", "nocheck"])
    out["ddpipe wds, pil, none"] = (1, ["ddpipe", str(data / "wds"), "none", "pil", "float32"])
    for ranks in (1, 2, 4, 8):  # lean ranks: the node's same cores shared by more ranks (one per GPU)
        out[f"ddpipe wds, dali-cpu, partial, {ranks} rank{'s' if ranks > 1 else ''}"] = (
            ranks, ["ddpipe", str(data / "wds"), "partial", "dali-cpu", "float32"])
        if ranks > 1:  # the best peer on as many ranks, for the latency of a job's first batch
            out[f"DALI webdataset reader, {ranks} ranks"] = (ranks, ["dali-wds"])
    out["ddpipe wds, dali-cpu, partial, 2 ranks, uint8"] = (2, ["ddpipe", str(data / "wds"), "partial", "dali-cpu",
                                                                "uint8"])
    return out


def child(args: list[str], images: Path, data: Path, out: Path, warmup: int) -> None:
    kind = args[0]
    figures: dict[str, Any]
    if kind == "raw":
        n, s = raw_decode(images)
        figures = {"images": n, "seconds": s, "threads": 0}
    elif kind in ("torch", "webdataset", "dali-file", "dali-wds"):
        figures = run_peer(kind, images, data / "wds", args[1] if len(args) > 1 else "float32", warmup)
    else:
        figures = run_ddpipe(Path(args[1]), args[2], args[3], args[4], warmup,
                             antialias="noaa" not in args[5:], verify="nocheck" not in args[5:])
    if os.environ.get("PMI_RANK", "0") == "0":
        out.write_text(json.dumps({**figures, "peak_mb": max(PEAKS, default=peak_mb())}))


LIKE = {"float32": "DALI webdataset reader", "uint8": "DALI webdataset reader, uint8"}
LATENCY = ("first_cold_s", "first_warm_s", "wait_p50_ms", "wait_p99_ms", "wait_max_ms")


def tabulate(rows: list[dict[str, Any]]) -> str:
    """The ratios and the table. *Like for like*: a ddpipe row that shuffles against DALI's webdataset
    reader (which shuffles) with the same output type, on as many ranks where it ran on them; a row
    with ``none`` shuffling has no such peer."""
    raw = next(r["img_s"] for r in rows if r["pipeline"].startswith("raw"))
    peers = {r["pipeline"]: r["img_s"] for r in rows if not r["pipeline"].startswith(("raw", "ddpipe"))}
    best = max(peers.values()) if peers else math.nan  # no peer measured (--only): ratios to it are NaN
    for r in rows:
        r["vs_best_peer"], r["vs_raw"] = r["img_s"] / best, r["img_s"] / raw
        name = r["pipeline"]
        parts = name.split(", ")
        base = LIKE["uint8" if "uint8" in parts else "float32"]
        ranks = next((p for p in parts if p.endswith("ranks")), None)
        like = peers.get(f"{base}, {ranks}") or peers.get(base)
        shuffles = name.startswith("ddpipe") and "none" not in parts
        r["vs_like"] = r["img_s"] / like if shuffles and like else None
    cols = [("pipeline", "pipeline", "s"), ("img_s", "img/s", ".0f"),
            ("vs_like", "/ DALI wds reader, same output, both shuffling", ".2f"),
            ("vs_best_peer", "/ best peer", ".2f"), ("vs_raw", "/ raw limit", ".2f"), ("peak_mb", "peak MB", ".0f"),
            ("threads", "threads", "d")]
    return table(rows, cols)


def latency_table(rows: list[dict[str, Any]]) -> str:
    """The waits a training step feels, per pipeline: the slowest rank's (medians over repeats)."""
    for r in rows:
        p50, p99 = r.get("wait_p50_ms"), r.get("wait_p99_ms")
        r["p99_over_p50"] = p99 / p50 if p50 and p99 is not None else None
    cols = [("pipeline", "pipeline", "s"), ("first_cold_s", "first batch, cold s", ".2f"),
            ("first_warm_s", "first batch, warm s", ".2f"), ("wait_p50_ms", "batch wait p50 ms", ".0f"),
            ("wait_p99_ms", "p99 ms", ".0f"), ("wait_max_ms", "max ms", ".0f"), ("p99_over_p50", "p99 / p50", ".2f")]
    return table([r for r in rows if not r["pipeline"].startswith("raw")], cols)


def retable() -> None:
    """Rebuild results/loader.json's ratios and table from its measurements, measuring nothing."""
    path = RESULTS / "loader.json"
    doc = json.loads(path.read_text())
    doc["table"] = tabulate(doc["rows"])
    if any(r.get("first_warm_s") is not None for r in doc["rows"]):
        doc["latency_table"] = latency_table(doc["rows"])
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(doc["table"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--warmup", type=int, default=WARMUP, help="untimed epochs before the timed one")
    ap.add_argument("--run", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--retable", action="store_true", help="rebuild the ratios and table of the recorded run")
    args = ap.parse_args()
    if args.retable:
        retable()
        return
    images = synth_images(args.n)
    data = DATA / f"loader-{args.n}"
    if args.run:
        child(args.run, images, data, Path(args.out), args.warmup)
        return
    for fmt in ("wds", "hdf5", "lmdb"):
        synth_shards(args.n, "loader", fmt, shard_bytes=32_000_000, seed=0)
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    results: dict[str, list[dict[str, float]]] = {}
    todo = runs(images, data)
    # the raw limit is every ratio's reference: always measured
    names = [n for n in todo if args.only is None or n.startswith("raw") or any(o in n for o in args.only)]
    for rep in range(args.repeats):
        for name in names if rep % 2 == 0 else reversed(names):  # alternate the order: drift hits all alike
            ranks, run_args = todo[name]
            out = DATA / "loader-run.json"
            out.unlink(missing_ok=True)
            cmd = [sys.executable, __file__, "--n", str(args.n), "--warmup", str(args.warmup), "--out", str(out),
                   "--run", *run_args]
            if ranks > 1:
                cmd = [mpiexec, "-n", str(ranks), *cmd]
            subprocess.run(cmd, check=True, timeout=1200, stdout=subprocess.DEVNULL)
            results.setdefault(name, []).append(json.loads(out.read_text()))
            print(f"  {name}: {results[name][-1]['images'] / results[name][-1]['seconds']:.0f} img/s", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for name in names:
        rate = median([r["images"] / r["seconds"] for r in results[name]])
        row = {"pipeline": name, "img_s": rate, "peak_mb": median([r["peak_mb"] for r in results[name]]),
               "threads": max(r["threads"] for r in results[name])}
        for k in LATENCY:
            measured = [r[k] for r in results[name] if r.get(k) is not None]
            row[k] = median(measured) if measured else None
        rows.append(row)
    for r in rows:
        if r["pipeline"].startswith("raw"):
            r["peak_mb"] = r["threads"] = None
    text = tabulate(rows)
    latency = latency_table(rows)
    command = f"python benchmarks/loader.py --n {args.n} --repeats {args.repeats} --warmup {args.warmup}"
    if args.only is not None:  # a probe says what it ran
        command += " --only " + " ".join(f'"{o}"' for o in args.only)
    # a partial run (--only) is a probe: it must not replace the full record the README's table shows
    doc = {"benchmark": "loader", "command": command, "machine": machine(), "batch": BATCH, "size": SIZE,
           "warmup_epochs": args.warmup,
           "rows": rows, "runs": results, "table": text, "latency_table": latency}
    path = save("loader" if args.only is None else "loader-only", doc)
    print(text)
    print("\n" + latency)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
