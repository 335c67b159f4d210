"""The ``ddpipe`` command line. Expected errors print one line and exit 1; no tracebacks."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .decode.spec import DECODERS, DTYPES, ON_ERROR
from .errors import DdpipeError
from .formats import FORMAT_NAMES
from .plan import ASSIGNMENTS
from .shufflers import SHUFFLE_MODES
from .throttle import ENV_VAR as THROTTLE_ENV

if TYPE_CHECKING:
    from .bench import BenchReport


def _size(text: str) -> int:
    from .convert.layout import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _cmd_synth(args: argparse.Namespace) -> int:
    from .synth import SynthOptions, synth

    t0 = time.perf_counter()
    total = synth(args.out, SynthOptions(n=args.n, classes=args.classes, seed=args.seed, quality=args.quality,
                                         workers=args.workers, progress=not args.quiet))
    dt = time.perf_counter() - t0
    print(f"wrote {args.n} JPEGs in {args.classes} classes to {args.out}: {total / 1e6:.1f} MB, "
          f"{total / args.n / 1e3:.1f} KB each on average, {dt:.1f} s")
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from .comm import init_comm
    from .convert import ConvertOptions, convert

    options = ConvertOptions(format=args.format, shard_bytes=args.shard_size, samples_per_shard=args.samples_per_shard,
                             seed=args.seed, workers=args.workers, on_error=args.on_error, progress=not args.quiet,
                             decode_check=not args.no_decode_check, allow_empty=args.allow_empty,
                             val_labels=args.val_labels, synsets=args.synsets)
    comm = init_comm()
    t0 = time.perf_counter()
    manifest = convert(args.src, args.out, options, comm=comm)
    dt = time.perf_counter() - t0
    if comm.world.rank == 0:
        print(f"{args.out}: {manifest.format}, {len(manifest.shards)} shards, {manifest.num_samples} samples, "
              f"{manifest.num_bytes / 1e6:.1f} MB, {len(manifest.skipped)} skipped, {dt:.1f} s "
              f"({manifest.num_bytes / 1e6 / max(dt, 1e-9):.1f} MB/s)")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .stats import format_stats, inspect_dataset

    stats = inspect_dataset(args.dataset, scan=not args.no_scan)
    print(json.dumps(stats.to_dict(), indent=1) if args.json else format_stats(stats))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify_dataset

    report = verify_dataset(args.dataset, decode=args.decode, progress=not args.quiet, stage_dir=args.stage_dir)
    for problem in report.problems:
        print(f"ddpipe: {problem}", file=sys.stderr)
    status = "OK" if report.ok else f"FAILED ({len(report.problems)} problem(s))"
    decoded = f", {report.decoded} images decoded" if args.decode else ""
    print(f"{args.dataset}: {status}: {report.shards} shards, {report.samples} samples checked{decoded}")
    return 0 if report.ok else 1


def _cmd_stage(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .comm import init_comm
    from .pipeline import Loader

    comm = init_comm()
    loader = Loader(args.dataset, 1, decode="none", shuffle=args.shuffle, seed=args.seed,
                    shard_assignment=args.shard_assignment, stage_dir=args.local_dir, stage_capacity=args.capacity,
                    source_limits=args.source_throttle, comm=comm)
    stager = loader.stager
    assert stager is not None
    show = stager.is_leader and not args.quiet
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        with tqdm(desc=f"stage epoch {epoch}", unit="shard", disable=not show, dynamic_ncols=True) as bar:
            stager.on_staged = lambda _: bar.update(1)
            loader.start_staging(loader.plan())
            stager.wait()
    seconds = time.perf_counter() - t0
    totals = comm.allgather(dict(stager.stats))
    comm.barrier()
    if comm.world.rank == 0:
        copied = sum(t["copied"] for t in totals)
        nbytes = sum(t["bytes"] for t in totals)
        print(f"{stager.dir}: staged {copied} shards ({nbytes / 1e6:.1f} MB) in {seconds:.1f} s, "
              f"{nbytes / 1e6 / max(seconds, 1e-9):.1f} MB/s; {sum(t['reused'] for t in totals)} already staged; "
              f"{comm.world.num_nodes} node(s)")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    import torch

    from .decode import DecodeOptions
    from .pipeline import Loader
    from .train import distributed
    from .train.loop import Trainer, TrainOptions
    from .train.models import build_model

    job = distributed.init(args.device)
    torch.manual_seed(args.seed)
    size = DecodeOptions(decoder=args.decode, device=str(job.device), on_error=args.on_error, size=args.image_size,
                         resize_shorter=max(args.image_size, round(args.image_size * 8 / 7)), dtype=args.dtype)
    loader = Loader(args.dataset, args.batch_size, decode=size, shuffle=args.shuffle,
                    exchange_fraction=args.exchange_fraction, shard_assignment=args.shard_assignment, drop_last=True,
                    stage_dir=args.stage_dir, stage_capacity=args.stage_capacity, seed=args.seed, comm=job.comm)
    evaluate = None
    if args.eval:
        evaluate = Loader(args.eval, args.batch_size, decode=dataclasses.replace(size, train=False), shuffle="none",
                          seed=args.seed, comm=job.comm)
    classes = len(loader.dataset.classes) or args.num_classes
    model = build_model(args.model, classes)
    options = TrainOptions(epochs=args.epochs, allreduce=args.allreduce, lr=args.lr, warmup_epochs=args.warmup_epochs,
                           amp=args.amp, channels_last=args.channels_last, checkpoint=args.checkpoint,
                           checkpoint_every=args.checkpoint_every, max_steps=args.max_steps, log_every=args.log_every)
    if job.is_main:
        print(f"training {args.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters) on "
              f"{job.size} rank(s), {loader.decode} decoding on {loader.device}, global batch "
              f"{args.batch_size * job.size}, allreduce {args.allreduce}", flush=True)
    try:
        Trainer(model, loader, job, options, evaluate).fit()
        if loader.stats.get("skipped") and job.is_main:
            corrupt = loader.stats.get("corrupt_shards") or []
            shards = f" (including every sample of corrupt shard(s) {', '.join(corrupt)})" if corrupt else ""
            print(f"skipped {loader.stats['skipped']} images that do not decode in the last epoch{shards}, e.g. "
                  f"{', '.join(k for k, _, _ in loader.skipped[:3])}", flush=True)
    finally:
        loader.close()
        if evaluate is not None:
            evaluate.close()
    distributed.shutdown(job)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import BenchOptions, format_report, plot_report, run_bench
    from .bench.harness import machine
    from .comm import init_comm

    comm = init_comm()
    from .bench.peers import PEERS, available_peers

    compare: tuple[str, ...] = ()
    if args.compare is not None:  # --compare alone: every peer installed here
        compare = tuple(args.compare) or tuple(p for p in PEERS if p in available_peers())
    options = BenchOptions(batch_size=args.batch_size, shuffle=args.shuffle, exchange_fraction=args.exchange_fraction,
                           decode=args.decode, image_size=args.image_size, step_time=args.step_time, cold=args.cold,
                           stage_dir=args.stage_dir, source_limits=args.source_throttle, seed=args.seed,
                           epochs=args.epochs, model=args.model, compare=compare, compare_dir=args.compare_dir,
                           progress=sys.stderr.isatty() and not args.no_progress)
    report = run_bench(args.dataset, options, comm)
    if comm.world.rank == 0:
        print(format_report(report))
        if args.project:
            _print_projection(args, report)
        if args.json:
            doc = {"dataset": str(args.dataset), "options": vars(args) | {"func": None, "json": str(args.json)},
                   **report.to_dict(), "machine": machine()}
            Path(args.json).write_text(json.dumps(doc, indent=1, default=str) + "\n")
            print(f"wrote {args.json}")
        if args.plot:
            plot_report(report, args.plot)
            print(f"wrote {args.plot}")
    return 0


def _print_projection(args: argparse.Namespace, report: BenchReport) -> None:
    from .bench.projection import Cluster, Workload, projection_table

    stages = {s.name: s for s in report.stages}
    decode = stages["read+decode"]
    nodes = [int(n) for n in args.project.removeprefix("nodes=").split(",") if n]
    cluster = Cluster(nodes=1, gpus_per_node=args.gpus_per_node, fs_bandwidth=args.fs_bandwidth,
                      local_bandwidth=args.local_bandwidth, local_capacity=args.local_capacity,
                      link_bandwidth=args.link_bandwidth, link_latency=args.link_latency)
    images = args.project_images or decode.images
    work = Workload(images=images, image_bytes=decode.bytes / decode.images, batch_size=args.batch_size,
                    step_time=args.model_step_time or args.step_time,
                    decode_rate=args.decode_rate or decode.images_per_s / report.world_size,
                    exchange_fraction=args.exchange_fraction)
    _, text = projection_table(cluster, work, nodes)
    print(f"\nprojection (ddpipe/bench/projection.py): {images:,} images of {work.image_bytes / 1e3:.0f} KB, "
          f"{args.gpus_per_node} GPUs per node, step {work.step_time * 1e3:.0f} ms per batch of {args.batch_size}, "
          f"decode {work.decode_rate:.0f} images/s per rank")
    print(text)


def build_parser() -> argparse.ArgumentParser:
    from .bench.peers import PEERS
    parser = argparse.ArgumentParser(prog="ddpipe", description="Distributed data pipeline for deep-learning training.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("synth", help="write an ImageNet-like ImageFolder of real JPEGs")
    p.add_argument("out")
    p.add_argument("--n", type=_positive, default=1000, help="number of images")
    p.add_argument("--classes", type=_positive, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quality", type=int, default=90, help="JPEG quality")
    p.add_argument("--workers", type=_positive, default=1)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_synth)

    p = sub.add_parser("convert", help="convert an ImageFolder, a list file or a dataset into shards")
    p.add_argument("src", help="ImageFolder root, CSV/TSV list of 'path,label', or a ddpipe dataset")
    p.add_argument("out")
    p.add_argument("--format", choices=FORMAT_NAMES, default="wds")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--shard-size", type=_size, default=None, help="target shard size, e.g. 256MB (default)")
    size.add_argument("--samples-per-shard", type=_positive, default=None)
    p.add_argument("--seed", type=int, default=None, help="shuffle samples across shards (default: keep source order)")
    p.add_argument("--workers", type=_positive, default=1, help="parallel shard writers")
    p.add_argument("--on-error", choices=ON_ERROR, default="fail",
                   help="an unreadable or non-image input: stop (default) or skip and record it")
    p.add_argument("--allow-empty", action="store_true", help="write an empty dataset if every input is skipped")
    p.add_argument("--val-labels", help="ImageNet's validation ground truth (LOC_val_solution.csv or "
                   "ILSVRC2012_validation_ground_truth.txt) for SRC, its flat directory")
    p.add_argument("--synsets", help="the synset list (LOC_synset_mapping.txt, map_clsloc.txt)")
    p.add_argument("--no-decode-check", action="store_true",
                   help="check only each image's header, not that it decodes whole (faster; see README)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("index", help="adopt tar shards, HDF5 files or an LMDB in place: write their index.json")
    from .convert import index_command

    index_command.add_arguments(p)
    p.set_defaults(func=index_command.main)

    p = sub.add_parser("plan", help="score each shuffle at a world size from the manifest, and choose Q")
    from . import plan_command

    plan_command.add_arguments(p)
    p.set_defaults(func=plan_command.main)

    p = sub.add_parser("stage", help="copy this node's shards to node-local storage ahead of a job")
    p.add_argument("dataset")
    p.add_argument("--local-dir", required=True,
                   help="node-local directory (an SSD, or memory); {node} gives each node its own, "
                        "$VAR takes it from the node's environment")
    p.add_argument("--capacity", type=_size, default=None, help="bytes of local storage to use, e.g. 100GB")
    p.add_argument("--epochs", type=_positive, default=1, help="stage the shards of this many epochs")
    p.add_argument("--shuffle", choices=SHUFFLE_MODES, default="partial",
                   help="the training job's shuffle mode (decides which shards each node reads)")
    p.add_argument("--shard-assignment", choices=ASSIGNMENTS, default="sticky")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--source-throttle", default=os.environ.get(THROTTLE_ENV),
                   help=f"model a slow source, e.g. 100MB/s,5ms (default: ${THROTTLE_ENV})")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_stage)

    p = sub.add_parser("train", help="data-parallel training fed by the loader (under mpiexec, srun or torchrun)")
    p.add_argument("dataset")
    p.add_argument("--model", default="resnet50", help="resnet18, resnet34, resnet50, resnet101 or smallcnn")
    p.add_argument("--epochs", type=_positive, default=1)
    p.add_argument("--batch-size", type=_positive, default=64, help="per rank")
    p.add_argument("--allreduce", choices=["ddp", "mpi"], default="ddp")
    p.add_argument("--lr", type=float, default=0.1, help="for a global batch of 256, scaled linearly")
    p.add_argument("--warmup-epochs", type=float, default=0.0)
    p.add_argument("--eval", help="a held-out dataset: top-1 accuracy after each epoch")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--dtype", choices=DTYPES, default="uint8",
                   help="loader output; uint8 is normalised on the training device")
    p.add_argument("--decode", default="auto", choices=[d for d in DECODERS if d != "none"])
    p.add_argument("--device", default="auto")
    p.add_argument("--amp", action="store_true", help="mixed precision (GPU)")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--shuffle", choices=SHUFFLE_MODES, default="partial")
    p.add_argument("--exchange-fraction", type=float, default=0.3)
    p.add_argument("--shard-assignment", choices=ASSIGNMENTS, default="sticky")
    p.add_argument("--stage-dir", default=None,
                   help="node-local staging directory ('auto': $DDPIPE_LOCAL_DIR; {node} and $VAR are resolved "
                        "on each node)")
    p.add_argument("--stage-capacity", type=_size, default=None)
    p.add_argument("--checkpoint", type=Path, default=None, help="file to save to and resume from")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between mid-epoch checkpoints")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps, saving the checkpoint")
    p.add_argument("--log-every", type=int, default=50, help="a progress line every this many steps (0: epochs only)")
    p.add_argument("--on-error", choices=ON_ERROR, default="fail",
                   help="an image that does not decode: stop naming it, or skip and count it")
    p.add_argument("--num-classes", type=int, default=1000, help="when the dataset names no classes")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("bench", help="measure each stage and the data wait of a training step, on this dataset")
    p.add_argument("dataset")
    p.add_argument("--batch-size", type=_positive, default=64, help="per rank")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds of a simulated training step")
    p.add_argument("--model", default=None, help="time a real model's SGD step instead of a simulated one: "
                   "resnet18, resnet34, resnet50, resnet101 or smallcnn")
    p.add_argument("--epochs", type=_positive, default=1, help="epochs of the full pipeline feeding the step")
    p.add_argument("--compare", nargs="*", default=None, choices=list(PEERS), metavar="PEER",
                   help=f"also run these peers on the same data ({', '.join(PEERS)}; none named: every one installed)")
    p.add_argument("--compare-dir", default=None, help="where the peers' inputs are written once (default: temp dir)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--shuffle", choices=SHUFFLE_MODES, default="partial")
    p.add_argument("--exchange-fraction", type=float, default=0.3)
    p.add_argument("--decode", default="auto", choices=[d for d in DECODERS if d != "none"])
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--cold", action="store_true", help="evict the dataset from the page cache before each epoch")
    p.add_argument("--stage-dir", default=None)
    p.add_argument("--source-throttle", default=os.environ.get(THROTTLE_ENV),
                   help=f"model a slow source, e.g. 100MB/s,5ms (default: ${THROTTLE_ENV})")
    p.add_argument("--json", default=None, help="write every figure and the machine to this file")
    p.add_argument("--plot", default=None, help="write a PNG of throughput by stage and stall over the epoch")
    p.add_argument("--project", default=None, metavar="nodes=1,8,64,512", help="project to these cluster sizes")
    p.add_argument("--project-images", type=int, default=0, help="dataset size to project (default: this one)")
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--fs-bandwidth", type=_size, default=10 * 10**9, help="shared file system, aggregate, per second")
    p.add_argument("--local-bandwidth", type=_size, default=3 * 10**9, help="node-local storage, per second")
    p.add_argument("--local-capacity", type=_size, default=3800 * 10**9)
    p.add_argument("--link-bandwidth", type=_size, default=25 * 10**9, help="per node, per second")
    p.add_argument("--link-latency", type=float, default=5e-6, help="seconds per message")
    p.add_argument("--model-step-time", type=float, default=0.0, help="the real model's step (default: --step-time)")
    p.add_argument("--decode-rate", type=float, default=0.0,
                   help="images/s one rank decodes on the cluster (default: measured here)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("inspect", help="format, shards, samples, bytes, classes, per-field sizes")
    p.add_argument("dataset")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-scan", action="store_true", help="manifest only; skip per-field sizes")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("verify", help="check checksums and sample counts (and with --decode, every image)")
    p.add_argument("dataset")
    p.add_argument("--decode", action="store_true")
    p.add_argument("--stage-dir", default=None, help="check this dataset's copies staged in this directory instead")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_verify)
    return parser


def _end_the_job(code: int, error: BaseException | None = None) -> None:
    """After an error on one rank of an MPI job, end every rank now: the others would otherwise wait
    for it in their next collective until the watchdog's timeout. Not for an error every rank raises
    (``job_wide``): each reports it and leaves on its own."""
    if getattr(error, "job_wide", False):
        return
    from .comm.mpi import abort_mpi_job

    abort_mpi_job(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except DdpipeError as e:
        print(f"ddpipe: error: {e}", file=sys.stderr)
        _end_the_job(1, e)
        return 1
    except KeyboardInterrupt:
        print("ddpipe: interrupted", file=sys.stderr)
        _end_the_job(130)
        return 130
    except OSError as e:
        if e.filename is None:
            raise
        # a path the user gave that is not what it must be (a file where a directory goes, say)
        print(f"ddpipe: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        _end_the_job(1, e)
        return 1
    except Exception as e:
        traceback.print_exc()
        _end_the_job(1, e)
        raise
    return code


if __name__ == "__main__":
    sys.exit(main())
