"""Measuring an I/O-bound epoch stage by stage, and where the training step's waiting comes from.

Stages, each one epoch on every rank: ``read`` (encoded samples, no exchange), ``read+exchange``
(the partial exchange), ``read+decode`` (into tensors), and ``full``: the whole pipeline feeding a
simulated step of ``step_time`` seconds. Stalls are split in the manner of DS-Analyzer (Mohan et al.,
VLDB 2021): the full pipeline runs twice, once reading from storage and once fed from memory (the
epoch's encoded batches read beforehand), so that

- compute = steps x step_time; prep stall = (from memory) - compute: waiting on decoding;
- fetch stall = (from storage) - (from memory): waiting on storage.

The bottleneck is the slowest of reading, exchange, decoding and the step; the most images/s the
pipeline could feed is the slowest of the data stages.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..comm import Comm
from ..decode.spec import DecodeOptions
from ..pipeline import Loader
from ..sample import KEY, Sample


@dataclass(frozen=True)
class BenchOptions:
    batch_size: int = 64
    shuffle: str = "partial"
    exchange_fraction: float = 0.3
    decode: str = "auto"
    image_size: int = 224
    step_time: float = 0.05  # seconds a simulated training step takes
    cold: bool = False  # evict the dataset from the page cache before each epoch
    stage_dir: str | None = None
    source_limits: str | None = None  # a slow source, e.g. "100MB/s,5ms"
    seed: int = 0


@dataclass
class StageFigures:
    """One stage's epoch, and the images and seconds its rate is taken over."""

    name: str
    images: int
    bytes: int
    seconds: float  # the slowest rank's epoch, start-up included
    steady_images: int = 0
    steady_seconds: float = 0.0

    @property
    def images_per_s(self) -> float:
        return self.steady_images / self.steady_seconds if self.steady_seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.images_per_s * (self.bytes / self.images) / 1e6 if self.images else 0.0


@dataclass
class BenchReport:
    world_size: int
    stages: list[StageFigures]
    epoch_seconds: float
    compute_seconds: float
    memory_seconds: float
    images: int
    per_rank: list[dict[str, Any]] = field(default_factory=list)

    @property
    def stall(self) -> float:
        return max(0.0, self.epoch_seconds - self.compute_seconds) / self.epoch_seconds if self.epoch_seconds else 0.0

    @property
    def prep_stall(self) -> float:
        """Waiting on decoding: the epoch fed from memory beyond pure compute (at most the whole stall)."""
        if not self.epoch_seconds:
            return 0.0
        return min(self.stall, max(0.0, self.memory_seconds - self.compute_seconds) / self.epoch_seconds)

    @property
    def fetch_stall(self) -> float:
        """Waiting on storage: the rest of the stall, so that fetch + prep = stall."""
        return self.stall - self.prep_stall

    @property
    def step_images_per_s(self) -> float:
        return self.images / self.compute_seconds if self.compute_seconds else float("inf")

    @property
    def max_feed_images_per_s(self) -> float:
        data = [s.images_per_s for s in self.stages if s.name != "full"]
        return min(data) if data else 0.0

    @property
    def bottleneck(self) -> str:
        rates = {s.name: s.images_per_s for s in self.stages if s.name != "full"}
        rates["step"] = self.step_images_per_s
        return min(rates, key=lambda k: rates[k])

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "images": self.images, "epoch_seconds": self.epoch_seconds,
                "compute_seconds": self.compute_seconds, "memory_seconds": self.memory_seconds,
                "stall": self.stall, "fetch_stall": self.fetch_stall, "prep_stall": self.prep_stall,
                "bottleneck": self.bottleneck, "max_feed_images_per_s": self.max_feed_images_per_s,
                "step_images_per_s": self.step_images_per_s,
                "stages": [{**asdict(s), "images_per_s": s.images_per_s, "mb_per_s": s.mb_per_s} for s in self.stages],
                "per_rank": self.per_rank}


def _encoded_bytes(batch: list[Sample]) -> int:
    return sum(len(v) for s in batch for k, v in s.items() if k != KEY)


def evict_page_cache(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Drop files from the page cache, so that the next read comes from the device (a cold read)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _evict(loader: Loader) -> None:
    if loader.comm.world.local_rank == 0:  # once per node
        evict_page_cache(loader.dataset.root / info.file for info in loader.dataset.manifest.shards)


def _timed(comm: Comm, loader: Loader, cold: bool, body: Any) -> tuple[float, dict[str, float]]:
    if cold:
        _evict(loader)
    comm.barrier()
    t0 = time.perf_counter()
    mine = body()
    seconds = time.perf_counter() - t0
    return max(comm.allgather(seconds)), {"seconds": seconds, **mine}


def run_bench(dataset: str | os.PathLike[str], options: BenchOptions, comm: Comm) -> BenchReport:
    o = options
    decode_options = DecodeOptions(size=o.image_size, resize_shorter=max(o.image_size, round(o.image_size * 8 / 7)),
                                   dtype="uint8")

    def loader(shuffle: str, decode: str) -> Loader:
        return Loader(Path(dataset), o.batch_size, shuffle=shuffle, exchange_fraction=o.exchange_fraction,
                      decode=decode, decode_options=decode_options, seed=o.seed, stage_dir=o.stage_dir,
                      source_limits=o.source_limits, comm=comm)

    stages: list[StageFigures] = []
    per_rank: list[dict[str, Any]] = []
    base = "local" if o.shuffle == "partial" else o.shuffle

    def stage(name: str, ld: Loader, steady: bool) -> None:
        if not o.cold:  # warm: the page cache holds the dataset, as in every later epoch
            for _ in ld:
                pass
        mine = {"images": 0, "bytes": 0, "first": 0.0, "after_first": 0}

        def body() -> dict[str, float]:
            t0 = time.perf_counter()
            for b, batch in enumerate(ld):
                n = len(batch[1]) if isinstance(batch, tuple) else len(batch)
                mine["images"] += n
                if isinstance(batch, list):
                    mine["bytes"] += _encoded_bytes(batch)
                if b == 0:
                    mine["first"] = time.perf_counter() - t0
                else:
                    mine["after_first"] += n
            return {k: float(v) for k, v in mine.items()}

        seconds, figures = _timed(comm, ld, o.cold, body)
        timings = comm.allgather((int(mine["after_first"]), figures["seconds"] - figures["first"]))
        total_bytes = sum(comm.allgather(int(mine["bytes"]))) or (stages[0].bytes if stages else 0)
        images = sum(comm.allgather(int(mine["images"])))
        # decoding's rate excludes building its pipeline; reading's producer runs ahead of the first
        # batch, so after it the queue only drains: reading is timed whole
        if steady:
            rate_images, rate_seconds = sum(n for n, _ in timings), max(t for _, t in timings)
        else:
            rate_images, rate_seconds = images, seconds
        stages.append(StageFigures(name, images, total_bytes, seconds, rate_images, rate_seconds))
        per_rank.append({"stage": name, **figures})

    stage("read", loader(base, "none"), steady=False)
    if o.shuffle == "partial" and comm.world.size > 1:
        stage("read+exchange", loader("partial", "none"), steady=False)
    stage("read+decode", loader(base, o.decode), steady=True)

    # the full pipeline feeding a simulated step, from storage; then the same epoch fed from memory
    full = loader(o.shuffle, o.decode)
    steps: dict[str, Any] = {"n": 0, "wait": 0.0, "waits": []}

    def full_body() -> dict[str, Any]:
        t = time.perf_counter()
        for _ in full:
            waited = time.perf_counter() - t
            steps["wait"] += waited
            steps["waits"].append(waited)
            steps["n"] += 1
            time.sleep(o.step_time)
            t = time.perf_counter()
        return {"steps": steps["n"], "wait": steps["wait"], "waits": steps["waits"]}

    epoch_seconds, mine = _timed(comm, full, o.cold, full_body)
    stages.append(StageFigures("full", stages[-1].images, stages[0].bytes, epoch_seconds, stages[-1].images,
                               epoch_seconds))
    per_rank.append({"stage": "full", **mine})

    memory_seconds = _from_memory(comm, loader(o.shuffle, "none"), full, o.step_time)
    compute_seconds = max(comm.allgather(steps["n"] * o.step_time))
    everyone = [dict(r, rank=rank) for rank, rows in enumerate(comm.allgather(per_rank)) for r in rows]
    return BenchReport(comm.world.size, stages, epoch_seconds, compute_seconds, memory_seconds, stages[-1].images,
                       everyone)


def _from_memory(comm: Comm, encoded: Loader, decoding: Loader, step_time: float) -> float:
    """The full epoch again, fed from memory: its encoded batches are read first, untimed."""
    from ..decode.batches import EncodedBatch
    from ..decode.output import make_decoder

    plan = encoded.plan()
    batches = [(plan.batch(encoded.rank, b), batch) for b, batch in enumerate(encoded)]
    assert decoding.device is not None
    decoder = make_decoder(decoding.decode, decoding.decode_options, decoding.options.batch_size, decoding.device)

    def skip(index: int, sample: Sample, reason: str) -> None:
        return None

    def stream() -> Iterator[EncodedBatch]:
        for indices, batch in batches:
            yield EncodedBatch.of(np.asarray(indices), batch, skip)

    comm.barrier()
    t0 = time.perf_counter()
    for _ in decoder.decode(stream(), 0, 0, skip):
        time.sleep(step_time)
    decoder.close()
    return max(comm.allgather(time.perf_counter() - t0))


def format_report(report: BenchReport) -> str:
    lines = [f"{'stage':<16}{'images/s':>10}{'MB/s':>9}{'seconds':>9}",
             *(f"{s.name:<16}{s.images_per_s:>10.0f}{s.mb_per_s:>9.1f}{s.seconds:>9.2f}" for s in report.stages),
             "",
             f"epoch {report.epoch_seconds:.2f} s on {report.world_size} rank(s), {report.images} images: "
             f"stall {100 * report.stall:.0f}% (fetch {100 * report.fetch_stall:.0f}%, "
             f"prep {100 * report.prep_stall:.0f}%)",
             f"bottleneck: {report.bottleneck}; the pipeline could feed {report.max_feed_images_per_s:.0f} images/s, "
             f"the step takes {report.step_images_per_s:.0f}"]
    full = [r for r in report.per_rank if r.get("stage") == "full"]
    for r in full:
        wait = 100 * r["wait"] / r["seconds"] if r["seconds"] else 0.0
        lines.append(f"  rank {int(r['rank'])}: {int(r['steps'])} steps, {r['seconds']:.2f} s, data wait {wait:.0f}%")
    return "\n".join(lines)


def plot_report(report: BenchReport, path: str | os.PathLike[str]) -> None:
    """Throughput by stage, against what the step consumes; and each rank's data wait through the epoch."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        from ..errors import DdpipeError

        raise DdpipeError("--plot needs matplotlib: pip install matplotlib") from e
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = [s.name for s in report.stages]
    rates = [s.images_per_s for s in report.stages]
    left.barh(names, rates, color=["#4c72b0" if n != report.bottleneck else "#c44e52" for n in names])
    left.axvline(report.step_images_per_s, color="black", linestyle="--", label="the step consumes")
    left.set_xlabel("images/s (whole job)")
    left.set_title(f"throughput by stage (bottleneck: {report.bottleneck})")
    left.legend(loc="lower right")
    for r in report.per_rank:
        if r.get("stage") == "full" and r.get("waits"):
            waits = [1000 * w for w in r["waits"]]
            right.plot(range(1, len(waits) + 1), waits, marker=".", label=f"rank {int(r['rank'])}")
    right.xaxis.get_major_locator().set_params(integer=True)
    right.set_xlabel("step")
    right.set_ylabel("data wait per step (ms)")
    right.set_title(f"stall over the epoch: {100 * report.stall:.0f}% (fetch {100 * report.fetch_stall:.0f}%, "
                    f"prep {100 * report.prep_stall:.0f}%)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
