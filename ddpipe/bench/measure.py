"""Measuring an I/O-bound epoch stage by stage, and where the training step's waiting comes from.

Stages, each one epoch on every rank: ``read`` (encoded samples, no exchange), ``read+exchange``
(the partial exchange), ``read+decode`` (into tensors), and ``full``: the whole pipeline feeding a
simulated step of ``step_time`` seconds. Stalls are split in the manner of DS-Analyzer (Mohan et al.,
VLDB 2021): the full pipeline runs twice, once reading from storage and once fed from memory (the
epoch's encoded batches read beforehand), so that

- compute = steps x step_time; prep stall = (from memory) - compute: waiting on decoding;
- fetch stall = (from storage) - (from memory): waiting on storage.

The bottleneck is the slowest of reading, exchange, decoding and the step; the most images/s the
pipeline could feed is the slowest of the data stages. Those rates say nothing of whether the step
and the pipeline ran side by side: the overlap does (figures.py), 1 where the epoch took only the
slower of the two alone, 0 where it took their sum.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..comm import Comm
from ..decode.spec import DecodeOptions
from ..errors import DdpipeError, NoBatchWarning, OptionError
from ..fields import local_path_option, number_option, refuse_non_boolean_flags, seed_option, whole_option
from ..options import ReadOptions
from ..pipeline import Loader
from ..plan import PlanOptions
from ..sample import KEY, Sample, SampleBatch
from ..shufflers import get_shuffler
from ..staging import StageOptions
from ..stream import EncodedStream
from .figures import BenchReport, StageFigures
from .harness import drain, evict_page_cache, phase_bar

if TYPE_CHECKING:
    from ..decode.output import Decoder


@dataclass(frozen=True)
class BenchOptions:
    """What to measure: the loader's own options objects (each stage is measured with its shuffle
    mode's reading alone, then with its exchange, then decoding), and the bench's own settings."""

    plan: PlanOptions = field(default_factory=lambda: PlanOptions(batch_size=64))
    read: ReadOptions = field(default_factory=ReadOptions)
    decode: DecodeOptions = field(default_factory=lambda: DecodeOptions(dtype="uint8"))
    stage: StageOptions | None = None
    seed: int = 0
    step_time: float = 0.05  # seconds a simulated training step takes
    model: str | None = None  # a real model's training step (ddpipe.train.models) instead of a simulated one
    epochs: int = 1  # epochs of the full pipeline feeding the step
    cold: bool = False  # evict the dataset from the page cache before each epoch
    compare: tuple[str, ...] = ()  # peers to run on the same data (bench/peers.py)
    compare_dir: str | None = None  # under which the peers' inputs are written once (default: the temp dir)
    progress: bool = False  # a progress bar on rank 0

    def __post_init__(self) -> None:
        refuse_non_boolean_flags(self)
        whole_option(self.epochs, "epochs", least=1)
        seed_option(self.seed)
        if number_option(self.step_time, "step_time") < 0:
            raise OptionError(f"step_time must be at least 0 seconds, not {self.step_time}")
        if self.model is not None:
            from ..train.models import MODELS

            if self.model not in MODELS:
                raise OptionError(f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        if isinstance(self.compare, str):  # each of its letters would be taken for a peer's name
            raise OptionError(f"compare is a tuple of peers' names, not the string {self.compare!r}")
        if self.compare:
            from .peers import PEERS

            unknown = [p for p in self.compare if p not in PEERS]
            if unknown:
                raise OptionError(f"compare names peers from {', '.join(PEERS)}, not {', '.join(map(repr, unknown))}")
        if self.compare_dir is not None:
            local_path_option(self.compare_dir, "compare_dir", "a directory on this machine")


def _encoded_bytes(batch: SampleBatch) -> int:
    return sum(len(v) for s in batch for k, v in s.items() if k != KEY)


def _evict(loader: Loader | EncodedStream) -> None:
    if loader.comm.world.local_rank == 0:  # once per node
        evict_page_cache(loader.dataset.data_root / info.file for info in loader.dataset.manifest.shards)


def _timed(comm: Comm, loader: Loader | EncodedStream, cold: bool, body: Any) -> tuple[float, dict[str, float]]:
    if cold:
        _evict(loader)
    comm.barrier()
    t0 = time.perf_counter()
    mine = body()
    seconds = time.perf_counter() - t0
    return max(comm.allgather(seconds)), {"seconds": seconds, **mine}


def run_bench(dataset: str | os.PathLike[str], options: BenchOptions, comm: Comm) -> BenchReport:
    o = options
    # cold: every epoch reads its shards from the device, none kept mapped (a mapped page is not evicted)
    read = dataclasses.replace(o.read, keep_mapped=False) if o.cold else o.read

    def stream(shuffle: str) -> EncodedStream:
        return EncodedStream(dataset, plan=dataclasses.replace(o.plan, shuffle=shuffle), read=read, stage=o.stage,
                             seed=o.seed, comm=comm)

    def loader(shuffle: str) -> Loader:
        return Loader(dataset, plan=dataclasses.replace(o.plan, shuffle=shuffle), read=read, stage=o.stage,
                      decode=o.decode, seed=o.seed, comm=comm)

    mode = get_shuffler(o.plan.shuffle)
    base = mode.reads_as or o.plan.shuffle  # the reading alone: the mode less its exchange
    exchanging = mode.exchanges and comm.world.size > 1
    phases = ["read", *(["read+exchange"] if exchanging else []), "read+decode",
              *(f"full, epoch {e}" for e in range(o.epochs)), "from memory", *(f"peer {p}" for p in o.compare)]
    bar = phase_bar(phases, o.progress and comm.world.rank == 0)
    first = stream(base)
    _refuse_one_batch(first, comm, bar)
    stages = _Stages(comm, o.cold)
    stages.measure("read", first, steady=False)
    bar.update()
    if exchanging:
        stages.measure("read+exchange", stream(o.plan.shuffle), steady=False)
        bar.update()
    stages.measure("read+decode", loader(base), steady=True)
    bar.update()

    # the full pipeline feeding the step (simulated, or a real model's), from storage; then the same
    # epoch fed from memory
    full = loader(o.plan.shuffle)
    step = _make_step(o, full.device, len(full.dataset.classes) or 1000)
    epochs, mine = _full_epochs(comm, full, step, o, bar)
    served = full.service_stats
    service = _service_totals(comm.allgather(asdict(served) if served is not None else None), o.epochs)
    full.close()
    epoch_seconds = sum(epochs) / len(epochs)
    figures = stages.figures
    figures.append(StageFigures("full", figures[-1].images, figures[0].bytes, epoch_seconds, figures[-1].images,
                                epoch_seconds))
    stages.per_rank.append({"stage": "full", **mine})

    memory_seconds = _from_memory(comm, stream(o.plan.shuffle), full, step)
    bar.update()
    compute_seconds = max(comm.allgather(mine["compute"] / o.epochs))
    compare = _run_peers(full, o, comm, bar) if o.compare else []
    bar.close()
    everyone = [dict(r, rank=rank) for rank, rows in enumerate(comm.allgather(stages.per_rank)) for r in rows]
    return BenchReport(comm.world.size, figures, epoch_seconds, compute_seconds, memory_seconds, figures[-1].images,
                       everyone, epochs, o.model or "simulated", compare, service)


def _refuse_one_batch(first: EncodedStream, comm: Comm, bar: Any) -> None:
    """A rate is timed after the first batch: a rank's share of fewer than two is refused, on every
    rank alike (each plans alike), said once by rank 0."""
    with warnings.catch_warnings():  # said below as the benchmark's error, in its own words
        warnings.simplefilter("ignore", NoBatchWarning)
        batches = first.batches_per_epoch
    if batches >= 2:
        return
    first.close()
    bar.close()
    share = len(first.dataset) // comm.world.size
    raise DdpipeError(f"--batch-size {first.options.batch_size} leaves each rank {batches} batch(es) of its share "
                      f"({share} of {len(first.dataset)} samples on {comm.world.size} rank(s)), and a rate is "
                      "timed after the first batch: use a smaller batch size or fewer ranks",
                      path=first.dataset.where).everywhere()


class _Stages:
    """The data stages, each measured for one epoch on every rank, one after another: their figures
    across the ranks, and each rank's own."""

    def __init__(self, comm: Comm, cold: bool) -> None:
        self.comm, self.cold = comm, cold
        self.figures: list[StageFigures] = []
        self.per_rank: list[dict[str, Any]] = []

    def measure(self, name: str, ld: Loader | EncodedStream, steady: bool) -> None:
        """One epoch of ``ld``; ``steady``: its rate taken after each rank's first batch."""
        comm = self.comm
        if not self.cold:  # warm: the page cache holds the dataset, as in every later epoch
            drain(ld)
            ld.set_epoch(ld.epoch)  # the same epoch again, timed, on purpose (epoch_repeats.py)
        mine = {"images": 0, "bytes": 0, "first": 0.0, "after_first": 0}

        def body() -> dict[str, float]:
            t0 = time.perf_counter()
            batches: Iterator[SampleBatch | tuple[Any, Any]] = iter(ld)
            for b, batch in enumerate(batches):
                if isinstance(batch, SampleBatch):
                    n = len(batch)
                    mine["bytes"] += _encoded_bytes(batch)
                else:
                    n = len(batch[1])
                mine["images"] += n
                if b == 0:
                    mine["first"] = time.perf_counter() - t0
                else:
                    mine["after_first"] += n
            return {k: float(v) for k, v in mine.items()}

        seconds, figures = _timed(comm, ld, self.cold, body)
        timings = comm.allgather((int(mine["after_first"]), figures["seconds"] - figures["first"]))
        total_bytes = sum(comm.allgather(int(mine["bytes"]))) or (self.figures[0].bytes if self.figures else 0)
        images = sum(comm.allgather(int(mine["images"])))
        # decoding's rate excludes building its pipeline; reading's producer runs ahead of the first
        # batch, so after it the queue only drains: reading is timed whole
        if steady:
            rate_images, rate_seconds = sum(n for n, _ in timings), max(t for _, t in timings)
        else:
            rate_images, rate_seconds = images, seconds
        self.figures.append(StageFigures(name, images, total_bytes, seconds, rate_images, rate_seconds))
        self.per_rank.append({"stage": name, **figures})
        # its threads (the next epoch read ahead, the decoder's) stopped now: left to the collector, they
        # ran on while a peer's DataLoader forked its workers, and one forked holding a lock hung
        ld.close()


def _full_epochs(comm: Comm, full: Loader, step: Any, o: BenchOptions, bar: Any) -> tuple[list[float], dict[str, Any]]:
    """The full pipeline's epochs feeding ``step``: each epoch's seconds (the slowest rank's), and
    this rank's steps, its waits for a batch and the step's time."""
    mine: dict[str, Any] = {"steps": 0, "wait": 0.0, "waits": [], "compute": 0.0, "seconds": 0.0}

    def epoch_body() -> dict[str, Any]:
        t = time.perf_counter()
        for batch in full:
            waited = time.perf_counter() - t
            mine["wait"] += waited
            mine["waits"].append(waited)
            mine["steps"] += 1
            t = time.perf_counter()
            step(batch)
            mine["compute"] += time.perf_counter() - t
            t = time.perf_counter()
        return {}

    epochs = []
    for e in range(o.epochs):
        full.set_epoch(e)
        seconds, figures = _timed(comm, full, o.cold, epoch_body)
        mine["seconds"] += figures["seconds"]
        epochs.append(seconds)
        bar.update()
    return epochs, mine


def _service_totals(ranks: list[dict[str, Any] | None], epochs: int) -> dict[str, Any]:
    """The decode service's figures over the full pipeline's epochs, summed over the ranks: what
    the servers and the ranks decoded, and the servers' decoding against the round trips."""
    mine = [r for r in ranks if r is not None]
    if not mine:
        return {}
    totals: dict[str, Any] = {k: sum(r[k] for r in mine) for k in ("remote_batches", "local_batches",
                                                                      "server_seconds", "round_trip_seconds",
                                                                      "bytes_received", "servers_lost")}
    totals["servers"] = sorted({s for r in mine for s in r["by_server"]})
    totals["transfer_seconds"] = max(0.0, totals["round_trip_seconds"] - totals["server_seconds"])
    totals["epochs"] = epochs
    return totals


def _make_step(o: BenchOptions, device: Any, num_classes: int) -> Any:
    """The training step the pipeline feeds: ``step_time`` of sleep, or one SGD step of a real model."""
    if o.model is None:
        return lambda batch: time.sleep(o.step_time)
    import torch

    from ..decode.output import normalize
    from ..train.models import build_model
    from ..train.step import train_step

    model = build_model(o.model, num_classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        images, labels = batch
        x = normalize(images) if images.dtype == torch.uint8 else images.float()
        train_step(model, optimizer, x, labels.clamp(0, num_classes - 1))
        if device.type == "cuda":  # the step is over when the GPU is done with it
            torch.cuda.synchronize(device)

    return step


def _from_memory(comm: Comm, encoded: EncodedStream, decoding: Loader, step: Any) -> float:
    """The full epoch again, fed from memory: its encoded batches are read first, untimed; the
    decoder's start-up (PIL's worker processes, DALI's pipeline) counted, as the full epoch counts it."""
    from ..decoding import make_decoder

    batches = held_batches(encoded)
    stage = decoding.decoding
    seconds, decoder = decode_held(comm, batches, step, lambda: make_decoder(
        stage.decoder, stage.options, decoding.stream.options.batch_size, stage.device))
    decoder.close()
    return seconds


def held_batches(encoded: EncodedStream) -> list[SampleBatch]:
    """An encoded stream's epoch on this rank, held in memory."""
    return list(encoded)


def decode_held(comm: Comm, batches: list[SampleBatch], step: Any,
                decoder_of: Callable[[], Decoder]) -> tuple[float, Decoder]:
    """Decoding ``batches`` (:func:`held_batches`) on every rank at once, each decoded batch passed to
    ``step``: the slowest rank's seconds, ``decoder_of()`` (the decoder to use) called inside them."""
    from ..decode.batches import EncodedBatch

    def skip(index: int, sample: Sample, reason: str) -> None:
        return None

    def stream() -> Iterator[EncodedBatch]:
        for batch in batches:
            yield EncodedBatch.of(batch.indices, batch.samples, skip)

    comm.barrier()
    t0 = time.perf_counter()
    decoder = decoder_of()
    for batch in decoder.decode(stream(), 0, 0, skip):
        step(batch)
    return max(comm.allgather(time.perf_counter() - t0)), decoder


def _run_peers(ld: Loader, o: BenchOptions, comm: Comm, bar: Any) -> list[dict[str, Any]]:
    """Each peer's epoch on this data, every rank on its share, as ddpipe's read+decode stage ran."""
    import tempfile

    import xxhash

    from . import peers

    name = f"ddpipe-peers-{xxhash.xxh3_64_hexdigest(str(ld.dataset.root.resolve()).encode())}"
    # a directory of their own under the one given: the inputs (an ImageFolder, tars rewritten after an
    # rmtree) went straight into it, beside or over what it held ("wds", "images": a user's own data)
    scratch = Path(o.compare_dir or tempfile.gettempdir()) / name
    if comm.world.local_rank == 0:  # written once per node
        peers.peer_inputs(ld.dataset, scratch)
    comm.barrier()
    inputs = peers.peer_inputs(ld.dataset, scratch)
    files = peers.input_files(inputs) if o.cold and comm.world.local_rank == 0 else []  # what evicting drops
    popts = peers.PeerOptions(batch_size=o.plan.batch_size, size=o.decode.size, dtype="uint8",
                              workers=ld.decoding.options.workers, rank=comm.world.rank, world=comm.world.size,
                              cold=o.cold, seed=o.seed)
    have = peers.available_peers()
    rows = []
    for name in o.compare:
        if name not in have:
            rows.append({"peer": name, "pipeline": peers.PEER_NAMES[name], "images": 0, "seconds": 0.0,
                         "images_per_s": 0.0, "note": "not installed"})
            bar.update()
            continue
        epoch = peers.make_peer(name, inputs, popts)
        if o.cold:
            if comm.world.local_rank == 0:
                evict_page_cache(files)
        else:
            for _ in epoch():  # warm-up: workers started, page cache filled, as ddpipe's stages had
                pass
        comm.barrier()
        t0 = time.perf_counter()
        n, after_first, first_at = 0, 0, 0.0
        for b, batch in enumerate(epoch()):
            n += len(batch)
            if b == 0:
                first_at = time.perf_counter()
            else:
                after_first += len(batch)
        end = time.perf_counter()
        # the rate as ddpipe's read+decode stage takes it: after the first batch (start-up excluded)
        steady = comm.allgather((after_first, end - first_at))
        rate_images, rate_seconds = sum(k for k, _ in steady), max(t for _, t in steady)
        rows.append({"peer": name, "pipeline": peers.PEER_NAMES[name], "images": sum(comm.allgather(n)),
                     "seconds": max(comm.allgather(end - t0)),
                     "images_per_s": rate_images / rate_seconds if rate_seconds else 0.0})
        del epoch
        bar.update()
    return rows
