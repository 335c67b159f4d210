"""``make demo``: the main job end to end on a generated dataset.

synth an ImageNet-like ImageFolder -> convert it to every shard format -> verify each (checksums,
counts, every image decodes) -> one loader epoch of each on 2 MPI ranks with partial shuffling ->
one epoch decoded into training tensors (DALI on the GPU if there is one, else on the CPU) -> data-
parallel training on 2 MPI ranks, staged to node-local storage, with each way of averaging gradients ->
a `ddpipe bench` report of the demo dataset on 2 ranks, with the peer pipelines beside it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .convert import ConvertOptions, convert
from .formats import FORMAT_NAMES
from .stats import inspect_dataset
from .synth import SynthOptions, synth
from .verify import verify_dataset

DEMO_MARK = ".ddpipe-demo"  # what says a directory is a demo's, to be replaced by the next


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="demo-data")
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--load-worker", metavar="DATASET", help=argparse.SUPPRESS)  # run under mpiexec by step 4
    args = ap.parse_args()
    if args.load_worker:
        return _load_epoch(Path(args.load_worker))
    out = Path(args.out)
    # a demo's own output from before is replaced; anything else (--out $HOME, say) was removed whole
    if out.exists() and not (out / DEMO_MARK).exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"ddpipe demo: error: {out}: holds other files than an earlier demo's: give --out a new or empty "
              "directory", file=sys.stderr)
        return 1
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / DEMO_MARK).write_text("made by python -m ddpipe.demo: removed by its next run\n")

    print(f"== 1. synth: {args.n} ImageNet-like JPEGs in {args.classes} classes -> {out / 'raw'}")
    t0 = time.perf_counter()
    total = synth(out / "raw", SynthOptions(n=args.n, classes=args.classes, seed=0, workers=args.workers))
    print(f"   {total / 1e6:.1f} MB, {total / args.n / 1e3:.0f} KB per image, {time.perf_counter() - t0:.1f} s")

    rows = []
    print(f"== 2. convert to each format ({', '.join(FORMAT_NAMES)}), then verify it: checksums, counts, "
          "decode every image")
    for fmt in FORMAT_NAMES:
        dest = out / fmt
        print(f"-- {fmt}: convert -> {dest}")
        t0 = time.perf_counter()
        m = convert(out / "raw", dest, ConvertOptions(format=fmt, shard_bytes=16_000_000, workers=args.workers))
        convert_s = time.perf_counter() - t0
        print(f"-- {fmt}: verify")
        report = verify_dataset(dest, decode=True)
        if not report.ok:
            for problem in report.problems:
                print(f"   PROBLEM: {problem}")
            return 1
        rows.append((fmt, len(m.shards), m.num_samples, m.num_bytes, convert_s, report.decoded))

    launcher = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if launcher is None:
        print("mpiexec not found: pip install 'ddpipe[mpi]'")
        return 1
    print("== 3. load each format: one epoch on 2 MPI ranks, partial shuffle (Q = 0.3), batches of 64")
    for fmt in FORMAT_NAMES:
        print(f"-- {fmt}")
        proc = subprocess.run([launcher, "-n", "2", sys.executable, "-m", "ddpipe.demo", "--load-worker",
                               str(out / fmt)], timeout=600)
        if proc.returncode != 0:
            return proc.returncode

    print("== 4. decode: one epoch of (images, labels) with decode='auto', random-resized crops to 224, batches of 64")
    decode_report = _decode_epoch(out / "wds")

    print("== 5. train: smallcnn, 2 MPI ranks, staged shards, 2 epochs, with each way of averaging gradients")
    for path in ("mpi", "ddp"):
        print(f"-- --allreduce {path}")
        proc = subprocess.run([launcher, "-n", "2", sys.executable, "-m", "ddpipe", "train", str(out / "wds"),
                               "--model", "smallcnn", "--epochs", "2", "--batch-size", "32", "--image-size", "64",
                               "--allreduce", path, "--eval", str(out / "hdf5"), "--stage-dir", str(out / "stage")],
                              timeout=900)
        if proc.returncode != 0:
            return proc.returncode

    print("== 6. bench: each stage, the stall of a 50 ms step and its causes, against the peer pipelines, 2 MPI ranks")
    proc = subprocess.run([launcher, "-n", "2", sys.executable, "-m", "ddpipe", "bench", str(out / "wds"),
                           "--image-size", "128", "--json", str(out / "bench.json"), "--plot", str(out / "bench.png"),
                           "--compare", "--compare-dir", str(out / "peers")], timeout=900)
    if proc.returncode != 0:
        return proc.returncode

    print("\n== summary")
    print(f"{'format':<8}{'shards':>8}{'samples':>9}{'MB':>9}{'convert s':>11}{'MB/s':>8}{'decoded':>9}  verified")
    for fmt, shards, samples, nbytes, secs, decoded in rows:
        mb = nbytes / 1e6
        print(f"{fmt:<8}{shards:>8}{samples:>9}{mb:>9.1f}{secs:>11.1f}{mb / secs:>8.0f}{decoded:>9}  OK")
    jpg = inspect_dataset(out / "wds").fields["jpg"].to_dict()
    print(f"\njpg sizes: mean {jpg['mean'] / 1e3:.0f} KB, min {jpg['min'] / 1e3:.0f} KB, max {jpg['max'] / 1e3:.0f} KB")
    print("loaded: every format, 2 ranks, each sample exactly once (checked above)")
    print(decode_report)
    print(f"\ndatasets are in {out}/{{{','.join(FORMAT_NAMES)}}}; try: ddpipe inspect {out}/wds")
    return 0


def _decode_epoch(dataset: Path) -> str:
    from .pipeline import Loader

    loader = Loader(dataset, 64, shuffle="local", seed=0)  # decoder="auto", device="auto"
    first = next(iter(loader))  # builds and warms the decoder
    t0 = time.perf_counter()
    images = sum(len(labels) for _, labels in loader)
    seconds = time.perf_counter() - t0
    x, y = first
    return (f"decoded: {images} images in {seconds:.1f} s, {images / seconds:.0f} images/s with "
            f"{loader.decoding.decoder} on {loader.device}; batches of {tuple(x.shape)} {x.dtype}, labels {y.dtype}")


def _load_epoch(dataset: Path) -> int:
    from .comm import init_comm
    from .stream import EncodedStream

    comm = init_comm(timeout=120)
    loader = EncodedStream(dataset, 64, shuffle="partial", exchange_fraction=0.3, seed=0, comm=comm)
    comm.barrier()
    t0 = time.perf_counter()
    keys = [s["__key__"] for batch in loader for s in batch]
    seconds = max(comm.allgather(time.perf_counter() - t0))
    every = comm.allgather(keys)
    exchange = loader.stats.exchange
    sent = sum(comm.allgather(exchange.samples_sent if exchange is not None else 0))
    if comm.world.rank == 0:
        total = sum(len(k) for k in every)
        distinct = len({k for ks in every for k in ks})
        once = "exactly once" if distinct == len(loader.dataset) else f"WRONG: {distinct} distinct"
        print(f"   {len(loader)} batches per rank, {total} samples ({once}), {sent} exchanged, "
              f"{total / seconds:.0f} samples/s")
        if distinct != len(loader.dataset):
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
