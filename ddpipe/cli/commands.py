"""What each ``ddpipe`` subcommand does, given its parsed arguments: each returns the exit status."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import NoBatchWarning

if TYPE_CHECKING:
    from ..bench import BenchReport
    from ..comm import Comm
    from ..dataset import Dataset


def _writable_later(path: str | Path | None, flag: str, comm: Comm) -> None:
    """A file rank 0 writes after the command's work: a file, in a directory that exists and takes one,
    before the work starts (a checkpoint that could not be written was found at the end of the first
    epoch). Rank 0 checks and every rank takes its answer: a path local to rank 0's node is as good as
    a shared one, and a rank elsewhere that had failed its own check alone left the others waiting."""
    if path is None:
        return
    from ..errors import DdpipeError

    mine = _not_writable(Path(path), flag) if comm.world.rank == 0 else (Path(path), "")
    where, why = comm.allgather(mine)[0]  # rank 0's answer, on every rank
    if why:
        raise DdpipeError(why, path=where).everywhere()


def _not_writable(path: Path, flag: str) -> tuple[Path, str]:
    """Where and why ``path`` cannot be written as a file; why is "" where it can."""
    import tempfile

    if path.is_dir():
        return path, f"is a directory: give {flag} a file's name"
    where = path.resolve().parent
    if not where.is_dir():  # a file where its directory goes was said not to exist
        if where.exists():
            return where, f"not a directory: {flag} cannot be written under it"
        return where, f"the directory for {flag} does not exist"
    try:  # what writing it later does, in the same directory: a file made, then removed
        with tempfile.NamedTemporaryFile(dir=where, prefix=".ddpipe-probe-"):
            pass
    except OSError as e:
        # a directory that is there and says a new file in it "does not exist" (/proc, /sys) takes none
        why = "it takes no new files" if e.errno == errno.ENOENT else e.strerror or str(e)
        return where, f"the directory for {flag} cannot be written to: {why}"
    return where, ""


def cmd_synth(args: argparse.Namespace) -> int:
    from ..synth import SynthOptions, synth

    if args.classes > args.n:  # said in the command's words (the library's are its keywords')
        from ..errors import DdpipeError

        raise DdpipeError(f"--classes {args.classes} needs --n {args.classes} at least (an image a class), "
                          f"not --n {args.n}")
    t0 = time.perf_counter()
    total = synth(args.out, SynthOptions(n=args.n, classes=args.classes, seed=args.seed, quality=args.quality,
                                         workers=args.workers, progress=not args.quiet))
    dt = time.perf_counter() - t0
    print(f"wrote {args.n} JPEGs in {args.classes} classes to {args.out}: {total / 1e6:.1f} MB, "
          f"{total / args.n / 1e3:.1f} KB each on average, {dt:.1f} s")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from ..comm import init_comm
    from ..convert import ConvertOptions, convert

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


def cmd_serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    from ..service import DecodeServer, ServeOptions

    server = DecodeServer(ServeOptions(listen=args.listen, workers=args.workers, queue=args.queue,
                                       max_request_bytes=args.max_request, log_every=args.log_every))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # finish the loop, join the workers, close the socket
        signal.signal(sig, lambda *_: stop.set())
    print(f"ddpipe serve: listening on {server.endpoint} with {args.workers} worker(s)", flush=True)
    server.serve(stop)
    print(f"ddpipe serve: stopped after {server.counters.total_images} images", flush=True)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from ..stats import format_stats, inspect_dataset

    stats = inspect_dataset(args.dataset, scan=not args.no_scan)
    print(json.dumps(stats.to_dict(), indent=1) if args.json else format_stats(stats))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from ..verify import verify_dataset

    report = verify_dataset(args.dataset, decode=args.decode, progress=not args.quiet, stage_dir=args.stage_dir)
    for problem in report.problems:
        print(f"ddpipe: {problem}", file=sys.stderr)
    status = "OK" if report.ok else f"FAILED ({len(report.problems)} problem(s))"
    decoded = f", {report.decoded} images decoded" if args.decode else ""
    print(f"{args.dataset}: {status}: {report.shards} shards, {report.samples} samples checked{decoded}")
    return 0 if report.ok else 1


def cmd_stage(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..comm import init_comm
    from ..stream import EncodedStream

    comm = init_comm()
    stream = EncodedStream(args.dataset, 1, shuffle=args.shuffle, seed=args.seed,
                           shard_assignment=args.shard_assignment, stage_dir=args.local_dir,
                           stage_capacity=args.capacity, source_limits=args.source_throttle, comm=comm)
    stager = stream.stager
    assert stager is not None
    show = stager.is_leader and not args.quiet
    stager.fill_only = True  # no rank reads here: with a capacity, stage what fits and stop
    t0 = time.perf_counter()
    try:
        for epoch in range(args.epochs):
            stream.set_epoch(epoch)
            with tqdm(desc=f"stage epoch {epoch}", unit="shard", disable=not show, dynamic_ncols=True) as bar:
                stager.on_staged = lambda _: bar.update(1)
                stream.start_staging(stream.plan())
                stager.wait()
            if any(comm.allgather(stager.stats["not_fitted"])):
                break  # the next epoch's first shards would take the room of this one's, which the job reads first
    finally:  # Ctrl-C or SIGTERM: the copy under way is given up and removed
        stager.close()
    seconds = time.perf_counter() - t0
    totals = comm.allgather(dict(stager.stats))
    comm.barrier()
    if comm.world.rank == 0:
        copied = sum(t["copied"] for t in totals)
        nbytes = sum(t["bytes"] for t in totals)
        print(f"{stager.dir}: staged {copied} shards ({nbytes / 1e6:.1f} MB) in {seconds:.1f} s, "
              f"{nbytes / 1e6 / max(seconds, 1e-9):.1f} MB/s; {sum(t['reused'] for t in totals)} already staged; "
              f"{comm.world.num_nodes} node(s)")
        not_fitted = sum(t["not_fitted"] for t in totals)
        if not_fitted:
            print(f"{not_fitted} shard(s) of epoch {epoch} did not fit in the capacity: the job stages them as its "
                  "ranks read")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import signal

    import torch

    from ..decode import DecodeOptions
    from ..pipeline import Loader
    from ..train import distributed
    from ..train.held_out import held_out_labels
    from ..train.loop import Trainer, TrainOptions
    from ..train.models import build_model

    job = distributed.init(args.device)
    _writable_later(args.checkpoint, "--checkpoint", job.comm)
    torch.manual_seed(args.seed)
    size = DecodeOptions(decoder=args.decode, device=str(job.device), size=args.image_size,
                         resize_shorter=max(args.image_size, round(args.image_size * 8 / 7)), dtype=args.dtype,
                         service=tuple(args.decode_service), read_in=args.read_in, require_labels=True)
    loader = Loader(args.dataset, args.batch_size, decode=size, shuffle=args.shuffle,
                    exchange_fraction=args.exchange_fraction, shard_assignment=args.shard_assignment, drop_last=True,
                    stage_dir=args.stage_dir, stage_capacity=args.stage_capacity, on_error=args.on_error,
                    seed=args.seed, comm=job.comm)
    evaluate = None
    if args.eval:
        # pad=False: top-1 over each held-out image once, however many ranks share them
        evaluate = Loader(args.eval, args.batch_size, decode=dataclasses.replace(size, train=False), shuffle="none",
                          pad=False, on_error=args.on_error, seed=args.seed, comm=job.comm)
        held_out_labels(loader.dataset.classes, evaluate.dataset)  # a class it cannot score: refused before training
    dataset_classes = len(loader.dataset.classes)
    # given beside named classes, it was passed over: the model took the dataset's count
    if dataset_classes and args.num_classes not in (None, dataset_classes):
        from ..errors import DdpipeError

        error = DdpipeError(f"--num-classes {args.num_classes}, but the dataset names {dataset_classes} classes, "
                            "which set the model's outputs: leave --num-classes out", path=loader.dataset.where)
        raise error.everywhere()
    classes = dataset_classes or args.num_classes or 1000
    for data in (loader.dataset, evaluate.dataset if evaluate is not None else None):
        if data is not None:
            _check_labelled(data)
            _check_labels_fit(data, classes, numbered=not loader.dataset.classes)
    model = build_model(args.model, classes)
    with warnings.catch_warnings():  # said below as the command's error, in its own words
        warnings.simplefilter("ignore", NoBatchWarning)
        no_batch = loader.batches_per_epoch == 0
    if no_batch:  # every rank plans alike: each leaves, rank 0 says why
        from ..errors import DdpipeError

        share = len(loader.dataset) // job.size
        error = DdpipeError(f"--batch-size {args.batch_size} is more than a rank's share of the dataset ({share} of "
                            f"{len(loader.dataset)} samples on {job.size} rank(s)), so an epoch has no full batch: "
                            f"use a smaller batch size or fewer ranks", path=loader.dataset.where)
        raise error.everywhere()
    options = TrainOptions(epochs=args.epochs, allreduce=args.allreduce, lr=args.lr, warmup_epochs=args.warmup_epochs,
                           amp=args.amp, channels_last=args.channels_last, checkpoint=args.checkpoint,
                           checkpoint_every=args.checkpoint_every, max_steps=args.max_steps, log_every=args.log_every)
    if job.is_main:
        served = f" (on decode servers {', '.join(args.decode_service)})" if args.decode_service else ""
        print(f"training {args.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters) on "
              f"{job.size} rank(s), {loader.decoding.decoder} decoding{served} on {loader.device}, global batch "
              f"{args.batch_size * job.size}, allreduce {args.allreduce}", flush=True)
        if args.amp and loader.device.type != "cuda":  # the Trainer autocasts on CUDA only
            print(f"ddpipe: warning: --amp: mixed precision is for CUDA devices; training on {loader.device} in "
                  "float32", file=sys.stderr, flush=True)
    try:
        # a scheduler's SIGTERM (or Slurm's --signal=USR1@...) stops every rank after one step, saved
        with distributed.stop_on_signals(job) as stop:
            trainer = Trainer(model, loader, job, options, evaluate, stop=stop)
            trainer.fit()
        stats = loader.stats
        if stats.skipped and job.is_main:
            corrupt = stats.read.corrupt_shards
            shards = f" (including every sample of corrupt shard(s) {', '.join(corrupt)})" if corrupt else ""
            named = stats.skipped_samples
            example = f", e.g. {named[0].key} in {named[0].shard}: {named[0].reason}" if named else ""
            print(f"skipped {stats.skipped} samples in the last epoch{shards}{example}", flush=True)
    finally:
        loader.close()
        if evaluate is not None:
            evaluate.close()
    distributed.shutdown(job)
    # as a process its signal ended would: not done, though nothing was lost (a rank the signal did not
    # reach says SIGTERM's, a scheduler's usual one)
    return 128 + (stop.request.signum or signal.SIGTERM) if trainer.stopped_by_signal else 0


def _check_labelled(data: Dataset) -> None:
    """Refuse, before training, a dataset whose samples hold no label (no ``cls`` field): each would
    come with label -1, which the loss refuses at the first batch (a traceback here, a device-side
    assert on a GPU)."""
    from ..sample import unlabelled

    wrong = unlabelled(data.manifest.fields)
    if wrong is None:
        return
    from ..errors import DdpipeError

    error = DdpipeError(f"{wrong}: ddpipe train learns each image's class from its cls", path=data.where)
    raise error.everywhere()  # every rank read the same manifest: each leaves, rank 0 says why


def _check_labels_fit(data: Dataset, classes: int, *, numbered: bool) -> None:
    """Refuse, before training, a dataset whose recorded labels run past the model's classes (a dataset that
    names none takes its count from --num-classes): the loss would fail on the first such sample, on a GPU
    with a device-side assert that names none. Labels the manifest does not record are left to the loss."""
    top = max((c for s in data.manifest.shards for c, _ in s.labels), default=-1)
    if top < classes:
        return
    from ..errors import DdpipeError

    model = (f"--num-classes {classes} (the training dataset names no classes): give {top + 1} or more" if numbered
             else f"the training dataset's {classes} classes")
    error = DdpipeError(f"a sample's label is {top}, but the model has {model}", path=data.where)
    raise error.everywhere()  # every rank read the same manifest: each leaves, rank 0 says why


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench import BenchOptions, format_report, plot_report, run_bench
    from ..bench.harness import machine
    from ..comm import init_comm
    from ..decode.spec import DecodeOptions
    from ..options import ReadOptions
    from ..plan import PlanOptions
    from ..staging import StageOptions

    comm = init_comm()
    _writable_later(args.json, "--json", comm)
    _writable_later(args.plot, "--plot", comm)
    if args.compare_dir is not None and Path(args.compare_dir).exists() and not Path(args.compare_dir).is_dir():
        from ..errors import DdpipeError  # found after ddpipe's whole run, as mkdir's "File exists"

        raise DdpipeError("is not a directory: --compare-dir names one under which the peers' inputs are written",
                          path=args.compare_dir)
    from ..bench.peers import PEERS, available_peers

    compare: tuple[str, ...] = ()
    if args.compare is not None:  # --compare alone: every peer installed here
        compare = tuple(args.compare) or tuple(p for p in PEERS if p in available_peers())
    size = args.image_size
    options = BenchOptions(plan=PlanOptions(batch_size=args.batch_size, shuffle=args.shuffle,
                                            exchange_fraction=args.exchange_fraction),
                           read=ReadOptions(source_limits=args.source_throttle),
                           decode=DecodeOptions(decoder=args.decode, size=size, dtype="uint8",
                                                resize_shorter=max(size, round(size * 8 / 7)),
                                                service=tuple(args.decode_service), read_in=args.read_in),
                           stage=StageOptions(args.stage_dir) if args.stage_dir else None, seed=args.seed,
                           step_time=args.step_time, model=args.model, epochs=args.epochs, cold=args.cold,
                           compare=compare, compare_dir=args.compare_dir, progress=not args.no_progress)
    report = run_bench(args.dataset, options, comm)
    if comm.world.rank == 0:
        print(format_report(report))
        if args.project:
            print_projection(args, report)
        if args.json:
            doc = {"dataset": str(args.dataset), "options": vars(args) | {"func": None, "json": str(args.json)},
                   **report.to_dict(), "machine": machine()}
            Path(args.json).write_text(json.dumps(doc, indent=1, default=str) + "\n")
            print(f"wrote {args.json}")
        if args.plot:
            plot_report(report, args.plot)
            print(f"wrote {args.plot}")
    return 0


def print_projection(args: argparse.Namespace, report: BenchReport) -> None:
    from ..bench.projection import Cluster, Workload, projection_table

    stages = {s.name: s for s in report.stages}
    decode = stages["read+decode"]
    nodes = list(args.project)
    cluster = Cluster(nodes=1, gpus_per_node=args.gpus_per_node, fs_bandwidth=args.fs_bandwidth,
                      local_bandwidth=args.local_bandwidth, local_capacity=args.local_capacity,
                      link_bandwidth=args.link_bandwidth, link_latency=args.link_latency)
    images = args.project_images or decode.images
    work = Workload(images=images, image_bytes=decode.bytes / decode.images, batch_size=args.batch_size,
                    step_time=args.step_time if args.model_step_time is None else args.model_step_time,
                    decode_rate=args.decode_rate or decode.images_per_s / report.world_size,
                    exchange_fraction=args.exchange_fraction)
    _, text = projection_table(cluster, work, nodes)
    print(f"\nprojection (ddpipe/bench/projection.py): {images:,} images of {work.image_bytes / 1e3:.0f} KB, "
          f"{args.gpus_per_node} GPUs per node, step {work.step_time * 1e3:.0f} ms per batch of {args.batch_size}, "
          f"decode {work.decode_rate:.0f} images/s per rank")
    print(text)
