"""The GPU path on one GPU: decoding against DALI's own pipeline and torchvision, and a ResNet-50 epoch.

    python benchmarks/gpu.py [--n 10000] [--epochs 4] [--repeats 2] [--only NAME ...] [--skip-train]
    python benchmarks/gpu.py --probe    # where ddpipe's dali-gpu path loses time: each piece alone

Needs a CUDA GPU and DALI (CI has neither; run on a GPU machine).

Decoding: every pipeline does the training transform (random-resized crop to 224x224, scale
0.08-1, ratio 3/4-4/3, flip, ImageNet normalisation to float32 NCHW on the GPU) in batches of 256
on the same synth ImageNet-like JPEGs. Each runs in a process of its own for ``--epochs`` epochs;
the first is a warm-up and the median of the others, each ended by a device synchronisation, is
its rate; beside it, each epoch's wait for its first batch and its rate from that batch on (an epoch
here is a few dozen batches, a training epoch thousands: the two tell an epoch's start from the
rest). References in the same run: the GPU's own JPEG decode rate (DALI's ``mixed`` decoder on the
images held in memory, full images, nothing else done), DALI's own webdataset and file
readers with ``mixed`` region-of-interest decoding, and torchvision's GPU ``decode_jpeg`` with its
v2 transforms over the same tars. Published anchor: an A100's hardware JPEG decoder does about
5,000-7,000 img/s.

Training (gpu_train.py): ResNet-50, AMP (float16) and channels-last, batch 256, fed by the
``Loader`` (``dali-gpu``, float16 channels-last batches) through ddpipe's own training loop, and
in a plain loop fed by the Loader, by the Loader reading in a process of its own, and by DALI's
own webdataset pipeline; images/s and the share of each step spent waiting for data
(stall), against the same step on one batch held on the GPU (the model alone: the most any loader
could let it do).
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import DATA, save, synth_images, synth_shards
from gpu_timing import BATCH, CORES, SIZE, timed_epochs
from gpu_train import PLAIN_FEEDS, run_plain, run_trainer

from ddpipe.bench.harness import machine, median, table


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- the pipelines ----------------------------------------------------------------------------

def run_decoder_limit(images: Path, epochs: int) -> dict[str, list[float]]:
    """DALI's mixed decoder alone on the images held in memory: full decode, no transform."""
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    datas = [np.fromfile(p, dtype=np.uint8) for p in sorted(images.rglob("*.jpg"))]
    batches = [datas[i : i + BATCH] for i in range(0, len(datas) - BATCH + 1, BATCH)]

    @pipeline_def(batch_size=BATCH, num_threads=CORES, device_id=0, prefetch_queue_depth=2)
    def pipe():  # type: ignore[no-untyped-def]
        # a cycling source lets DALI run ahead, as the pipelines measured against it do
        encoded = fn.external_source(source=batches, cycle=True, dtype=types.UINT8)
        return fn.decoders.image(encoded, device="mixed", output_type=types.RGB)

    p = pipe()
    p.build()

    def epoch():  # type: ignore[no-untyped-def]
        for _ in batches:
            (out,) = p.run()
            yield range(len(out))  # decoded: its length is all that is counted

    return timed_epochs(epoch, epochs)


def run_peer(name: str, images: Path, shards: Path, epochs: int) -> dict[str, list[float]]:
    from ddpipe.bench.peers import PeerInputs, PeerOptions, make_peer

    inputs = PeerInputs(images, sorted(shards.glob("*.tar")))
    options = PeerOptions(batch_size=BATCH, size=SIZE, dtype="float32", workers=CORES, device="cuda")
    return timed_epochs(make_peer(name, inputs, options), epochs)


def run_ddpipe(root: Path, shuffle: str, dtype: str, epochs: int, decoder: str = "dali-gpu",
               device: str = "cuda", read_in: str = "thread") -> dict[str, list[float]]:
    import ddpipe

    loader = ddpipe.Loader(root, BATCH, decoder=decoder, device=device, shuffle=shuffle, dtype=dtype, read_in=read_in)
    epoch = [0]

    def batches():  # type: ignore[no-untyped-def]
        loader.set_epoch(epoch[0])
        epoch[0] += 1
        return (x for x, _ in loader)

    return timed_epochs(batches, epochs)


def runs(data: Path) -> dict[str, list[str]]:
    """name -> arguments of --run."""
    out = {
        "GPU JPEG decode alone (DALI mixed, in memory, full images)": ["limit"],
        "DALI webdataset reader, mixed": ["dali-wds"],
        "DALI file reader, mixed": ["dali-file"],
        "torchvision decode_jpeg on the GPU + v2 transforms": ["torchvision"],
    }
    for fmt in ("wds", "hdf5", "lmdb"):
        out[f"ddpipe {fmt}, dali-gpu, local"] = ["ddpipe", str(data / fmt), "local", "float32"]
    for fmt in ("wds", "hdf5", "lmdb"):  # the batches read and prepared in a process of their own
        out[f"ddpipe {fmt}, dali-gpu, local, read in a process"] = ["ddpipe", str(data / fmt), "local", "float32",
                                                                    "dali-gpu", "cuda", "process"]
    out["ddpipe wds, dali-gpu, none"] = ["ddpipe", str(data / "wds"), "none", "float32"]
    out["ddpipe wds, dali-gpu, local, float16"] = ["ddpipe", str(data / "wds"), "local", "float16"]
    out["ddpipe wds, dali-gpu, local, uint8"] = ["ddpipe", str(data / "wds"), "local", "uint8"]
    # CPU decoding feeding the GPU (pinned memory, copies that do not wait) against feeding the CPU
    for device in ("cpu", "cuda"):
        out[f"ddpipe wds, dali-cpu, local, to {device}"] = ["ddpipe", str(data / "wds"), "local", "float32",
                                                             "dali-cpu", device]
    return out


def child(args: list[str], images: Path, data: Path, epochs: int, out: Path) -> None:
    kind = args[0]
    result: dict[str, Any]
    if kind == "limit":
        result = {**run_decoder_limit(images, epochs)}
    elif kind in ("dali-wds", "dali-file", "torchvision"):
        result = {**run_peer(kind, images, data / "wds", epochs)}
    elif kind == "train":
        result = run_trainer(Path(args[1]), epochs, int(args[2]))
    elif kind == "plain":
        result = run_plain(args[1], Path(args[2]), epochs, int(args[3]))
    else:
        result = {**run_ddpipe(Path(args[1]), args[2], args[3], epochs, *args[4:])}
    result["peak_mb"] = peak_mb()
    out.write_text(json.dumps(result))


def run_child(args: argparse.Namespace, run_args: list[str], epochs: int) -> dict[str, Any] | None:
    out = DATA / "gpu-run.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--n", str(args.n), "--epochs", str(epochs), "--out", str(out),
           "--run", *run_args]
    proc = subprocess.run(cmd, timeout=1200, stdout=subprocess.DEVNULL)
    if proc.returncode != 0:  # one pipeline failing (a peer not installed) leaves the others' figures
        print(f"  {' '.join(run_args)}: failed with {proc.returncode}", file=sys.stderr)
        return None
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def decoding_doc(names: list[str], figures: dict[str, dict[str, list[float]]], peaks: dict[str, float],
                 header: dict[str, Any]) -> dict[str, Any]:
    """The result file (``header``: its command and machine) for the decoding runs so far (each
    pipeline's :func:`~gpu_timing.timed_epochs` figures, every run's epochs together): each
    pipeline's median, against the best peer and the GPU's decode limit measured in the same run;
    its rate from each epoch's first batch on, and its wait for that batch."""
    rows: list[dict[str, Any]] = [{"pipeline": n, "img_s": median(figures[n]["rates"]),
                                   "steady_img_s": median(figures[n]["steady_rates"]),
                                   "first_batch_ms": median(figures[n]["first_batch_ms"]), "peak_mb": peaks[n]}
                                  for n in names if n in figures]
    limit = next((r["img_s"] for r in rows if r["pipeline"].startswith("GPU JPEG")), float("nan"))
    peer_rates = [r["img_s"] for r in rows if not r["pipeline"].startswith(("GPU JPEG", "ddpipe"))]
    best = max(peer_rates, default=float("nan"))
    for r in rows:
        r["vs_best_peer"], r["vs_limit"] = r["img_s"] / best, r["img_s"] / limit
    cols = [("pipeline", "pipeline", "s"), ("img_s", "img/s", ".0f"), ("vs_best_peer", "/ best peer", ".2f"),
            ("vs_limit", "/ GPU decode alone", ".2f"),
            ("steady_img_s", "img/s from each epoch's first batch on", ".0f"),
            ("first_batch_ms", "first batch ms", ".0f"), ("peak_mb", "host peak MB", ".0f")]
    return {**header, "rows": rows, "runs": figures, "table": table(rows, cols)}


def training(args: argparse.Namespace, data: Path) -> dict[str, Any]:
    """ResNet-50 fed by ddpipe's Trainer, and by each feed in a plain loop (gpu_train.py): the
    ``train`` and ``plain`` results and their table (the plain loops' stalls against DALI's feed's)."""
    epochs = max(args.epochs, 3)
    out: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    train = run_child(args, ["train", str(data / "wds"), str(args.classes)], epochs)
    if train is not None:
        train["vs_alone"] = train["fed_img_s"] / train["alone_img_s"]
        out["train"] = train
        print(f"  Trainer: {train['fed_img_s']:.0f} img/s, stall {100 * train['stall']:.1f}%; model alone "
              f"{train['alone_img_s']:.0f} img/s", file=sys.stderr)
        rows += [{"run": "ResNet-50, AMP, channels-last, fed by the Loader (dali-gpu)", "img_s": train["fed_img_s"],
                  "stall": train["stall"], "vs": train["vs_alone"]},
                 {"run": "ResNet-50, AMP, channels-last, one batch held on the GPU (model alone)",
                  "img_s": train["alone_img_s"], "stall": None, "vs": 1.0}]
    plain: dict[str, Any] = {}
    for feed in PLAIN_FEEDS:
        r = run_child(args, ["plain", feed, str(data / "wds"), str(args.classes)], epochs)
        if r is not None:
            plain[feed] = r
            print(f"  plain loop, {feed}: {r['fed_img_s']:.0f} img/s, stall {100 * r['stall']:.1f}% "
                  f"({100 * r['stall_steady']:.1f}% after each epoch's first batch)", file=sys.stderr)
    alone = train["alone_img_s"] if train is not None else float("nan")
    for feed, r in plain.items():
        r["vs_alone"] = r["fed_img_s"] / alone
        r["stall_over_dali"] = r["stall"] / plain["dali-wds"]["stall"] if "dali-wds" in plain else float("nan")
        rows.append({"run": f"ResNet-50, AMP, channels-last, {PLAIN_FEEDS[feed]}", "img_s": r["fed_img_s"],
                     "stall": r["stall"], "vs": r["vs_alone"], "stall_steady": 100 * r["stall_steady"],
                     **{key: r[key] for key in ("first_wait_ms", "wait_p50_ms", "wait_p99_ms")}})
    if plain:
        out["plain"] = plain
    if not rows:
        return out
    for row in rows:
        row["stall"] = None if row["stall"] is None else 100 * row["stall"]
    # where a plain loop's waits fall: at each epoch's start (a benchmark's epochs are short) or between
    # its batches (gpu_train.plain_loop)
    out["train_table"] = table(rows, [("run", "training", "s"), ("img_s", "img/s", ".0f"),
                                      ("stall", "stall %", ".1f"), ("vs", "/ model alone", ".2f"),
                                      ("stall_steady", "stall after the first batch %", ".1f"),
                                      ("first_wait_ms", "first batch ms", ".0f"),
                                      ("wait_p50_ms", "wait p50 ms", ".1f"), ("wait_p99_ms", "wait p99 ms", ".1f")])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=4, help="epochs per pipeline, the first a warm-up")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=None, help="the pipelines whose names hold one of these")
    ap.add_argument("--exclude", nargs="*", default=[], help="less those whose names hold one of these")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--probe", action="store_true", help="time each piece of the dali-gpu path alone")
    ap.add_argument("--run", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    images = synth_images(args.n, args.classes)
    data = DATA / f"gpu-{args.n}"
    if args.run:
        child(args.run, images, data, args.epochs, Path(args.out))
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA GPU")
    for fmt in ("wds", "hdf5", "lmdb"):
        synth_shards(args.n, "gpu", fmt, shard_bytes=64_000_000, seed=0)
    if args.probe:
        from gpu_probe import probe

        probe(data / "wds", args.epochs)
        return
    todo = runs(data)
    names = [n for n in todo if (args.only is None or n.startswith("GPU JPEG") or any(o in n for o in args.only))
             and not any(x in n for x in args.exclude)]
    # the whole command line: a run of some pipelines (--only, --skip-train) must say so
    header = {"benchmark": "gpu", "command": shlex.join(["python", "benchmarks/gpu.py", *sys.argv[1:]]),
              "machine": machine(), "batch": BATCH, "size": SIZE}
    figures: dict[str, dict[str, list[float]]] = {}
    peaks: dict[str, float] = {}
    total = args.repeats * len(names) + (0 if args.skip_train else 1 + len(PLAIN_FEEDS))
    done = 0
    for rep in range(args.repeats):
        for name in names if rep % 2 == 0 else reversed(names):  # alternate the order: drift hits all alike
            r = run_child(args, todo[name], args.epochs)
            done += 1
            if r is None:
                continue
            for key in ("rates", "steady_rates", "first_batch_ms"):
                figures.setdefault(name, {}).setdefault(key, []).extend(r[key])
            peaks[name] = max(peaks.get(name, 0.0), r["peak_mb"])
            print(f"  {name}: {median(r['rates']):.0f} img/s, first batch {median(r['first_batch_ms']):.0f} ms",
                  file=sys.stderr)
            # written after every run: a run cut short (a GPU lease's time limit) keeps what it measured
            doc = decoding_doc(names, figures, peaks, header)
            doc["note"] = f"incomplete: cut short after {done} of {total} runs"
            save("gpu", doc)
    doc = decoding_doc(names, figures, peaks, header)
    text = doc["table"]
    print(text)
    if not args.skip_train:
        train_doc = training(args, data)
        if train_doc:
            doc.update(train_doc)
            doc["table"] = f"{text}\n\n{doc['train_table']}"  # both in the README's block
            print("\n" + doc["train_table"])
    path = save("gpu", doc)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
