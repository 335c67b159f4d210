"""What ``ddpipe bench`` measured: each stage's epoch, and the report's stalls and bottleneck."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


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


def rank_latency(waits: list[float], epochs: int) -> dict[str, float | None]:
    """What one rank's training step felt over ``epochs`` epochs of ``waits`` (seconds, step by
    step): the run's first batch (the loader new, its decoder built; its data cold with ``--cold``),
    the slowest first batch of the epochs after it (the loader warm), and the waits for every other
    batch (p50, p99, max). ``None`` where there is nothing to take it over."""
    per_epoch = max(len(waits) // max(epochs, 1), 1)
    firsts = waits[::per_epoch]
    rest = [w for i, w in enumerate(waits) if i % per_epoch]
    p50, p99 = (float(v) for v in np.percentile(rest, [50, 99])) if rest else (None, None)
    return {"first_batch_s": firsts[0] if firsts else None,
            "later_first_batch_s": max(firsts[1:]) if len(firsts) > 1 else None,
            "wait_p50_s": p50, "wait_p99_s": p99, "wait_max_s": max(rest) if rest else None}


@dataclass
class BenchReport:
    world_size: int
    stages: list[StageFigures]
    epoch_seconds: float
    compute_seconds: float
    memory_seconds: float
    images: int
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[float] = field(default_factory=list)  # each epoch of the full pipeline, slowest rank
    step: str = "simulated"  # or the model whose real step was timed
    compare: list[dict[str, Any]] = field(default_factory=list)  # the peers: pipeline, images, seconds
    service: dict[str, Any] = field(default_factory=dict)  # the decode service's totals, if one decoded

    @property
    def served_split(self) -> tuple[float, float]:
        """With a decode service: the prep stall (waiting on decoding) split into the servers'
        decoding and the rest of the round trips (transfer, queueing), in the round trips' proportion."""
        trips = self.service.get("round_trip_seconds", 0.0)
        if not trips:
            return self.prep_stall, 0.0
        decode = self.prep_stall * min(1.0, self.service["server_seconds"] / trips)
        return decode, self.prep_stall - decode

    @property
    def decode_images_per_s(self) -> float:
        return next((s.images_per_s for s in self.stages if s.name == "read+decode"), 0.0)

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
    def feed_seconds(self) -> float:
        """An epoch at the pipeline's own rate, with no step: its slowest stage's (max_feed_images_per_s)."""
        rate = self.max_feed_images_per_s
        return self.images / rate if rate else 0.0

    @property
    def side_by_side_seconds(self) -> float:
        """An epoch with the step and the pipeline wholly overlapped: the slower of the two alone."""
        return max(self.compute_seconds, self.feed_seconds)

    @property
    def in_turns_seconds(self) -> float:
        """An epoch with the step and the pipeline taking turns: the two alone, added."""
        return self.compute_seconds + self.feed_seconds

    @property
    def overlap(self) -> float:
        """How far the step and the pipeline ran side by side: 1 where the epoch took no longer than the
        slower of the two alone, 0 where it took them in turns (their sum) or longer. A stall with the
        step the slowest stage says they overlapped little: the rates alone named the step the bottleneck."""
        alone, turns = self.side_by_side_seconds, self.in_turns_seconds
        if turns <= alone:  # one of the two took no time
            return 1.0
        return min(1.0, max(0.0, (turns - self.epoch_seconds) / (turns - alone)))

    @property
    def latency(self) -> list[dict[str, Any]]:
        """Each rank's :func:`rank_latency` over the full pipeline's epochs."""
        return [{"rank": r["rank"], **rank_latency(r.get("waits") or [], len(self.epochs))}
                for r in self.per_rank if r.get("stage") == "full"]

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
                "step_images_per_s": self.step_images_per_s, "feed_seconds": self.feed_seconds,
                "overlap": self.overlap,
                "stages": [{**asdict(s), "images_per_s": s.images_per_s, "mb_per_s": s.mb_per_s} for s in self.stages],
                "epochs": self.epochs, "step": self.step, "service": self.service,
                "compare": [{**c, "ddpipe_over_peer": self.decode_images_per_s / c["images_per_s"]
                             if c["images_per_s"] else None} for c in self.compare],
                "latency": self.latency, "per_rank": self.per_rank}
