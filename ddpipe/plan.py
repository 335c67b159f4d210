"""The epoch plan: which samples each rank reads, in what order, what it exchanges, and what it yields.

``plan_epoch`` is a pure function of (manifest, world size, seed, epoch, options): no I/O, no MPI.
Every rank computes the same plan, so ranks agree without talking, and the loader only carries it out.

How a plan is made:

1. **Sequence.** Shards in an order (manifest order for ``none``; a permutation fixed by the seed
   for ``sticky`` assignment, so each node reads the same shards every epoch and node-local staging
   is reused; a new permutation each epoch for ``rotate``), each shard's samples in stored order.
   For ``global`` shuffling the sequence is a permutation of all samples instead.
2. **Shares.** The sequence is cut into ``world_size`` contiguous ranges balanced by sample count
   (sizes differ by at most one), so ranks read whole shards sequentially except at range edges.
3. **Remainder.** Every rank must yield the same number of samples (invariant 2). ``drop_last``:
   each rank keeps ``per = floor(N / W)`` rounded down to whole batches, dropping a few samples
   chosen at random per (seed, epoch, rank). Otherwise ``pad``: ``per = ceil(N / W)``; a rank short
   of samples appends copies of the first samples of its own share (of the sequence if its share is
   empty). Padding is the only source of duplicates.
4. **Reads.** ``local`` and ``partial`` permute the order of a rank's runs of shards per epoch.
5. **Exchange** (``partial``): see :mod:`ddpipe.shufflers.partial`.
6. **Yield order.** ``local`` and ``partial`` pass the rank's stream (its kept samples of each
   round, then what it received, slot by slot) through a bounded shuffle buffer
   (:func:`ddpipe.shufflers.local.buffer_order`). ``none`` and ``global`` yield in read order.

``pending`` restricts the plan to samples not yet yielded in an interrupted epoch: resuming plans
them afresh over however many ranks the job now has.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .manifest import Manifest
from .seeding import BUFFER, DROP, GLOBAL, SEGMENTS, SHARD_ORDER, derive_rng
from .shufflers import SHUFFLE_MODES
from .shufflers.full import global_order
from .shufflers.local import buffer_order, permute_runs
from .shufflers.partial import round_shapes, send_positions

ASSIGNMENTS = ("sticky", "rotate")


@dataclass(frozen=True)
class PlanOptions:
    shuffle: str = "partial"
    exchange_fraction: float = 0.3
    assignment: str = "sticky"
    drop_last: bool = False
    batch_size: int = 1
    buffer_size: int = 1024
    round_size: int = 512

    def __post_init__(self) -> None:
        if self.shuffle not in SHUFFLE_MODES:
            raise ValueError(f"shuffle must be one of {', '.join(SHUFFLE_MODES)}, not {self.shuffle!r}")
        if self.assignment not in ASSIGNMENTS:
            raise ValueError(f"shard_assignment must be one of {', '.join(ASSIGNMENTS)}, not {self.assignment!r}")
        if not 0.0 <= self.exchange_fraction <= 1.0:
            raise ValueError(f"exchange_fraction must be in [0, 1], not {self.exchange_fraction}")
        if self.batch_size < 1 or self.round_size < 1 or self.buffer_size < 0:
            raise ValueError("batch_size and round_size must be at least 1, buffer_size at least 0")


@dataclass(frozen=True)
class ExchangeRound:
    """Round ``j`` for one rank: reads ``[start, stop)`` of its reads, sends and receives by slot."""

    start: int
    stop: int
    send: tuple[np.ndarray, ...]  # per slot: positions in ``reads``, in send order
    dests: tuple[int, ...]
    sources: tuple[int, ...]
    recv: tuple[np.ndarray, ...]  # per slot: global indices received, in arrival order


@dataclass(frozen=True)
class RankPlan:
    rank: int
    reads: np.ndarray  # global sample indices in the order this rank reads them
    order: np.ndarray  # global sample indices in the order this rank yields them
    rounds: tuple[ExchangeRound, ...] = ()


@dataclass(frozen=True)
class EpochPlan:
    epoch: int
    world_size: int
    options: PlanOptions
    ranks: tuple[RankPlan, ...]
    samples_per_rank: int
    random_access: bool = False
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def num_batches(self) -> int:
        """Batches every rank yields this epoch (the same on every rank)."""
        bs = self.options.batch_size
        return -(-self.samples_per_rank // bs)

    def batch(self, rank: int, index: int) -> np.ndarray:
        bs = self.options.batch_size
        return self.ranks[rank].order[index * bs : (index + 1) * bs]

    def yielded(self, batches: int) -> np.ndarray:
        """Global indices yielded by all ranks in their first ``batches`` batches."""
        bs = self.options.batch_size
        return np.concatenate([r.order[: batches * bs] for r in self.ranks])


def plan_epoch(
    manifest: Manifest,
    world_size: int,
    seed: int,
    epoch: int,
    options: PlanOptions | None = None,
    pending: np.ndarray | None = None,
) -> EpochPlan:
    """Plan one epoch for ``world_size`` ranks. ``pending``: a boolean mask of the samples still to
    yield (a resumed epoch); by default every sample."""
    opt = options or PlanOptions()
    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    counts = np.array([s.samples for s in manifest.shards], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])[:-1] if len(counts) else np.zeros(0, dtype=np.int64)
    total = int(counts.sum())
    keep = np.ones(total, dtype=bool) if pending is None else np.asarray(pending, dtype=bool)
    if keep.shape != (total,):
        raise ValueError(f"pending has {keep.shape[0]} entries, the dataset {total} samples")

    sequence = _sequence(counts, starts, keep, seed, epoch, opt)
    n = len(sequence)
    bounds = [r * n // world_size for r in range(world_size + 1)]
    if opt.drop_last:
        per = n // world_size
        per -= per % opt.batch_size
    else:
        per = -(-n // world_size)
    shard_of_sample = np.repeat(np.arange(len(counts)), counts)

    reads, dropped = [], []
    for r in range(world_size):
        share = sequence[bounds[r] : bounds[r + 1]]
        if len(share) > per:
            kept = np.sort(derive_rng(seed, DROP, epoch, r).choice(len(share), per, replace=False))
            dropped.append(np.delete(share, kept))
            share = share[kept]
        elif len(share) < per:
            source = share if len(share) else sequence
            share = np.concatenate([share, np.resize(source, per - len(share))])
        if opt.shuffle in ("local", "partial") and len(share):
            share = share[permute_runs(shard_of_sample[share], derive_rng(seed, SEGMENTS, epoch, r))]
        reads.append(share.astype(np.int64))

    rounds: list[tuple[ExchangeRound, ...]] = [() for _ in range(world_size)]
    streams = reads
    if opt.shuffle == "partial":
        rounds, streams = _exchange(reads, per, world_size, seed, epoch, opt)
    ranks = []
    for r in range(world_size):
        order = streams[r]
        if opt.shuffle in ("local", "partial"):
            order = order[buffer_order(len(order), opt.buffer_size, derive_rng(seed, BUFFER, epoch, r))]
        ranks.append(RankPlan(r, reads[r], order, rounds[r]))
    return EpochPlan(epoch, world_size, opt, tuple(ranks), per, random_access=opt.shuffle == "global",
                     dropped=np.concatenate(dropped) if dropped else np.zeros(0, dtype=np.int64))


def _sequence(counts: np.ndarray, starts: np.ndarray, keep: np.ndarray, seed: int, epoch: int,
              opt: PlanOptions) -> np.ndarray:
    """Step 1: the epoch's sequence of global indices, before it is cut into shares."""
    if opt.shuffle == "global":
        return global_order(np.flatnonzero(keep), derive_rng(seed, GLOBAL, epoch))
    if opt.shuffle == "none":
        shards = np.arange(len(counts))
    elif opt.assignment == "sticky":
        shards = derive_rng(seed, SHARD_ORDER).permutation(len(counts))
    else:
        shards = derive_rng(seed, SHARD_ORDER, epoch).permutation(len(counts))
    if len(shards) == 0:
        return np.zeros(0, dtype=np.int64)
    seq = np.concatenate([np.arange(starts[s], starts[s] + counts[s]) for s in shards])
    kept: np.ndarray = seq[keep[seq]]
    return kept


def _exchange(reads: list[np.ndarray], per: int, world_size: int, seed: int, epoch: int,
              opt: PlanOptions) -> tuple[list[tuple[ExchangeRound, ...]], list[np.ndarray]]:
    """Step 5: every rank's rounds, and the stream each rank holds after them."""
    shapes = round_shapes(per, world_size, opt.exchange_fraction, opt.round_size, seed, epoch)
    if not shapes:
        return [() for _ in range(world_size)], reads
    sends = [[send_positions(shape, r, seed, epoch, j) for j, shape in enumerate(shapes)] for r in range(world_size)]
    rounds: list[list[ExchangeRound]] = [[] for _ in range(world_size)]
    streams: list[list[np.ndarray]] = [[] for _ in range(world_size)]
    slots = range(len(shapes[0].shifts))
    for j, shape in enumerate(shapes):
        for r in range(world_size):
            dests = tuple((r + shape.shifts[t]) % world_size for t in slots)
            sources = tuple((r - shape.shifts[t]) % world_size for t in slots)
            recv = tuple(reads[sources[t]][sends[sources[t]][j][t]] for t in slots)
            sent = np.concatenate(sends[r][j]) if sends[r][j] else np.zeros(0, dtype=np.int64)
            own = np.setdiff1d(np.arange(shape.start, shape.stop), sent, assume_unique=True)
            rounds[r].append(ExchangeRound(shape.start, shape.stop, tuple(sends[r][j]), dests, sources, recv))
            streams[r].append(reads[r][own])
            streams[r].extend(recv)
    return [tuple(x) for x in rounds], [np.concatenate(s).astype(np.int64) for s in streams]
