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
   empty). Padding is the only source of duplicates. With ``pad=False`` the copies are planned all
   the same (reads, exchange and batch boundaries stay as they are), but marked (``RankPlan.copies``)
   and not yielded: every rank yields as many batches, a few of them short by the copies they would
   have held (fewer in all than there are ranks), and each sample exactly once across the job, as
   evaluation needs.
4. **Reads.** ``local`` and ``partial`` permute the order of a rank's runs of shards per epoch.
5. **Exchange** (``partial``): see :mod:`ddpipe.shufflers.partial`.

Each step asks the shuffle mode's entry in :data:`ddpipe.shufflers.SHUFFLERS`.
6. **Yield order.** ``local`` and ``partial`` pass the rank's stream (its kept samples of each
   round, then what it received, slot by slot) through a bounded shuffle buffer
   (:func:`ddpipe.shufflers.local.buffer_order`). ``none`` and ``global`` yield in read order.
   The plan keeps where in the stream each yielded sample is (``RankPlan.positions``), and, where
   ranks exchange, how far each rank's exchange may have to run ahead of its consumer for every rank
   to finish the batch in progress (``RankPlan.lead``: the loader's hand-over holds at least that).

``pending`` restricts the plan to samples not yet yielded in an interrupted epoch: resuming plans
them afresh over however many ranks the job now has.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import OptionError
from .fields import is_real, refuse_non_boolean_flags, seed_option, whole_option
from .manifest import Manifest
from .seeding import DROP, derive_rng
from .shufflers import ExchangeRound, exchange_leads, get_shuffler

ASSIGNMENTS = ("sticky", "rotate")


@dataclass(frozen=True)
class PlanOptions:
    shuffle: str = "partial"
    exchange_fraction: float = 0.3
    shard_assignment: str = "sticky"
    drop_last: bool = False
    # without drop_last: ranks short of samples yield copies of some (True), or a few short batches
    # (False: each sample once across the job, for evaluation); every rank yields as many batches
    pad: bool = True
    batch_size: int = 1
    buffer_size: int = 1024
    round_size: int = 512

    def __post_init__(self) -> None:
        refuse_non_boolean_flags(self)
        get_shuffler(self.shuffle)  # an OptionError naming the modes registered
        if self.shard_assignment not in ASSIGNMENTS:
            raise OptionError(f"shard_assignment must be one of {', '.join(ASSIGNMENTS)}, "
                              f"not {self.shard_assignment!r}")
        q = self.exchange_fraction  # None or a string was compared deep inside: TypeError's traceback
        if not is_real(q) or not 0.0 <= q <= 1.0:
            raise OptionError(f"exchange_fraction must be in [0, 1], not {self.exchange_fraction!r}")
        for name, least in (("batch_size", 1), ("round_size", 1), ("buffer_size", 0)):
            whole_option(getattr(self, name), name, least)


@dataclass(frozen=True)
class RankPlan:
    rank: int
    reads: np.ndarray  # global sample indices in the order this rank reads them
    order: np.ndarray  # global sample indices in the order this rank yields them
    rounds: tuple[ExchangeRound, ...] = ()
    # global sample indices in the order the exchange hands them on (what the shuffle buffer takes in)
    stream: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # for each sample of ``order``, its position in ``stream``: ``order == stream[positions]``
    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # with pad=False: True where ``order`` holds a padding copy of a sample yielded elsewhere (not yielded)
    copies: np.ndarray | None = None
    # the samples this rank's exchange may have to hand its consumer ahead of what it has taken, for
    # every rank to finish the batch in progress (:func:`ddpipe.shufflers.partial.exchange_leads`)
    lead: int = 0

    def yielded(self, start: int, stop: int) -> np.ndarray:
        """What this rank yields of ``order[start:stop]``: all of it, less the copies under pad=False."""
        part = self.order[start:stop]
        return part if self.copies is None else part[~self.copies[start:stop]]


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
        """The global indices ``rank`` yields in its batch ``index``."""
        bs = self.options.batch_size
        return self.ranks[rank].yielded(index * bs, (index + 1) * bs)

    def yielded(self, batches: int) -> np.ndarray:
        """Global indices yielded by all ranks in their first ``batches`` batches."""
        bs = self.options.batch_size
        return np.concatenate([r.yielded(0, batches * bs) for r in self.ranks])


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
    # a public pure function: a wrong kind is named here, not as numpy's or the seeding's TypeError
    whole_option(world_size, "world_size", least=1)
    seed_option(seed)
    whole_option(epoch, "epoch", least=0)
    if options is not None and not isinstance(options, PlanOptions):
        raise OptionError(f"options must be a PlanOptions, not {type(options).__name__}")
    opt = options or PlanOptions()
    counts = np.array([s.samples for s in manifest.shards], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])[:-1] if len(counts) else np.zeros(0, dtype=np.int64)
    total = int(counts.sum())
    keep = np.ones(total, dtype=bool) if pending is None else np.asarray(pending, dtype=bool)
    if keep.shape != (total,):
        raise ValueError(f"pending has {keep.shape[0]} entries, the dataset {total} samples")

    mode = get_shuffler(opt.shuffle)
    sequence = mode.sequence(counts, starts, keep, seed, epoch, opt.shard_assignment)
    n = len(sequence)
    bounds = [r * n // world_size for r in range(world_size + 1)]
    if opt.drop_last:
        per = n // world_size
        per -= per % opt.batch_size
    else:
        per = -(-n // world_size)
    shard_of_sample = np.repeat(np.arange(len(counts)), counts)

    reads, dropped, padding = [], [], []
    for r in range(world_size):
        share = sequence[bounds[r] : bounds[r + 1]]
        if len(share) > per:
            kept = np.sort(derive_rng(seed, DROP, epoch, r).choice(len(share), per, replace=False))
            dropped.append(np.delete(share, kept))
            share = share[kept]
        elif len(share) < per:
            source = share if len(share) else sequence
            padding.append(np.resize(source, per - len(share)))
            share = np.concatenate([share, padding[-1]])
        reads.append(mode.reads(share, shard_of_sample, seed, epoch, r).astype(np.int64))

    rounds, streams = mode.exchange(reads, per, seed, epoch, opt.exchange_fraction, opt.round_size)
    positions = [mode.yield_positions(len(streams[r]), seed, epoch, r, opt.buffer_size).astype(np.int64)
                 for r in range(world_size)]
    orders = [stream[at] for stream, at in zip(streams, positions, strict=True)]
    copies = _copies(orders, np.concatenate(padding)) if padding and not opt.pad else [None] * world_size
    leads = exchange_leads(positions, rounds, opt.batch_size)
    ranks = [RankPlan(r, reads[r], orders[r], rounds[r], streams[r], positions[r], copies[r], leads[r])
             for r in range(world_size)]
    return EpochPlan(epoch, world_size, opt, tuple(ranks), per, random_access=mode.random_access,
                     dropped=np.concatenate(dropped) if dropped else np.zeros(0, dtype=np.int64))


def _copies(orders: list[np.ndarray], padded: np.ndarray) -> list[np.ndarray]:
    """For each rank's yield order, where it holds a copy: of each sample padding repeated, every
    occurrence but the first (ranks in order, then positions) is one. Padding repeats fewer samples
    than there are ranks, so only their occurrences are walked."""
    repeated = np.unique(padded)
    seen: set[int] = set()
    marks = []
    for order in orders:
        mark = np.zeros(len(order), dtype=bool)
        at = np.flatnonzero(np.isin(order, repeated))
        for position, sample in zip(at.tolist(), order[at].tolist(), strict=True):
            if sample in seen:
                mark[position] = True
            seen.add(sample)
        marks.append(mark)
    return marks
