"""``partial``: every rank sends a fraction Q of its samples to other ranks each epoch.

(Nguyen et al., "Why Globally Re-shuffle? Revisiting Data Shuffling in Large Scale Deep
Learning", IPDPS 2022.) Pure choices only: which read positions a rank sends, to whom, in which
round. The exchange runs in rounds of consecutive read positions, so a round can go out as soon
as it has been read. In round ``j`` every rank sends the same count to each partner slot ``t``,
to rank ``(r + shift_t) % W``, and receives that count from ``(r - shift_t) % W``: every rank
sends and receives exactly as many samples as it reads, so counts stay equal (invariant 2).

A round is planned for all ranks at once with array operations, and a rank's round keeps its sends
and receipts as one array each, split by slot only when asked: at W = 2,048 a round has 2,047 slots
per rank, and a tuple of arrays per slot and rank made planning an epoch take minutes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..seeding import EXCHANGE, SEND, derive_rng
from .local import LocalShuffle


@dataclass(frozen=True)
class RoundShape:
    """What all ranks share about round ``j``: its read positions and the per-slot counts and shifts."""

    start: int
    stop: int
    counts: np.ndarray  # samples each rank sends through slot t (and receives through it)
    shifts: np.ndarray  # slot t sends to rank (r + shifts[t]) % W

    @cached_property
    def bounds(self) -> np.ndarray:
        """Where each slot's samples begin and end in a rank's ``sent`` and ``received``."""
        return np.concatenate([[0], np.cumsum(self.counts)])


@dataclass(frozen=True, eq=False)
class ExchangeRound:
    """Round ``j`` for one rank: reads ``[start, stop)`` of its reads, sends and receives by slot."""

    shape: RoundShape
    rank: int
    world_size: int
    sent: np.ndarray  # positions in ``reads`` sent, slot after slot, each slot's in read order
    received: np.ndarray  # global indices received, slot after slot, each in arrival order

    @property
    def start(self) -> int:
        return self.shape.start

    @property
    def stop(self) -> int:
        return self.shape.stop

    @property
    def dests(self) -> tuple[int, ...]:
        return tuple(((self.rank + self.shape.shifts) % self.world_size).tolist())

    @property
    def sources(self) -> tuple[int, ...]:
        return tuple(((self.rank - self.shape.shifts) % self.world_size).tolist())

    @property
    def send(self) -> tuple[np.ndarray, ...]:
        """Per slot: positions in ``reads``, in send order."""
        return tuple(np.split(self.sent, self.shape.bounds[1:-1]))

    @property
    def recv(self) -> tuple[np.ndarray, ...]:
        """Per slot: global indices received, in arrival order."""
        return tuple(np.split(self.received, self.shape.bounds[1:-1]))


def round_shapes(per_rank: int, world_size: int, fraction: float, round_size: int, seed: int,
                 epoch: int) -> list[RoundShape]:
    if world_size < 2 or fraction <= 0 or per_rank == 0:
        return []
    partners = world_size - 1
    shifts = 1 + derive_rng(seed, EXCHANGE, epoch).permutation(partners)
    slots = np.arange(partners)
    shapes = []
    for j, start in enumerate(range(0, per_rank, round_size)):
        stop = min(start + round_size, per_rank)
        k = int(fraction * (stop - start) + 0.5)
        counts = k // partners + (slots < k % partners)
        # rotate the pairing each round, so a rank's partners vary within the epoch
        shapes.append(RoundShape(start, stop, counts.astype(np.int64), shifts[(slots + j) % partners]))
    return shapes


def send_positions(shape: RoundShape, world_size: int, seed: int, epoch: int, round_index: int) -> np.ndarray:
    """Read positions (within each rank's reads) every rank sends: row ``r`` is rank ``r``'s, slot
    after slot, each slot's in read order."""
    length, k = shape.stop - shape.start, int(shape.counts.sum())
    chosen = np.stack([derive_rng(seed, SEND, epoch, r, round_index).permutation(length)[:k]
                       for r in range(world_size)])
    slot_of = np.repeat(np.arange(len(shape.counts)), shape.counts)
    # sort each row by (slot, position): positions stay grouped by slot, each slot's in read order
    ordered = np.sort(slot_of * length + chosen, axis=1) % length
    return ordered + shape.start


class PartialShuffle(LocalShuffle):
    """``local``, after exchanging a fraction of each rank's reads with the other ranks."""

    name = "partial"
    exchanges = True
    reads_as = "local"
    compared = "between"

    def exchange(self, reads: list[np.ndarray], per_rank: int, seed: int, epoch: int, fraction: float,
                 round_size: int) -> tuple[list[tuple[ExchangeRound, ...]], list[np.ndarray]]:
        world_size = len(reads)
        shapes = round_shapes(per_rank, world_size, fraction, round_size, seed, epoch)
        if not shapes:
            return [() for _ in range(world_size)], reads
        table = np.stack(reads)  # (W, per_rank): every rank reads as many samples
        ranks = np.arange(world_size)
        rounds: list[list[ExchangeRound]] = [[] for _ in range(world_size)]
        pieces = []
        for j, shape in enumerate(shapes):
            sent = send_positions(shape, world_size, seed, epoch, j)
            # column c of what rank r receives comes from the rank that sends to r through c's slot
            shift_of_column = np.repeat(shape.shifts, shape.counts)
            sources = (ranks[:, None] - shift_of_column[None, :]) % world_size
            columns = np.arange(sent.shape[1])[None, :]
            received = table[sources, sent[sources, columns]]
            kept = np.ones((world_size, shape.stop - shape.start), dtype=bool)
            kept[ranks[:, None], sent - shape.start] = False
            own = np.nonzero(kept)[1].reshape(world_size, -1) + shape.start  # row-major: each row in read order
            pieces.append(np.concatenate([np.take_along_axis(table, own, axis=1), received], axis=1))
            for r in range(world_size):
                rounds[r].append(ExchangeRound(shape, r, world_size, sent[r], received[r]))
        streams = np.concatenate(pieces, axis=1).astype(np.int64)
        return [tuple(x) for x in rounds], list(streams)


def exchange_leads(positions: list[np.ndarray], rounds: list[tuple[ExchangeRound, ...]],
                   batch_size: int) -> list[int]:
    """For each rank, the most samples its exchange may have to hand its consumer beyond what the
    consumer has taken, so that the ranks never wait on each other in a circle. A training step
    ends in a collective (the gradients' allreduce): a rank that has taken batch ``k`` waits there
    for every rank to take it; a rank still taking batch ``k`` may wait for an exchange round, which
    every rank enters only once it has handed on all it holds from the rounds before. A hand-over
    holding fewer stops the waiting rank's exchange short of that round, and the job hangs.
    ``positions``: each rank's yields as positions in its stream (the consumer takes arrivals up to
    the furthest its batch needs); ``rounds``: each rank's exchange rounds (their read positions,
    the same on every rank, are positions in the stream too: each round hands on as many as it reads)."""
    if not rounds or not rounds[0]:
        return [0] * len(positions)
    starts = np.array([r.start for r in rounds[0]], dtype=np.int64)
    # arrivals each rank has taken once it has taken batch k (positions are a permutation of the stream)
    taken = np.stack([np.maximum.accumulate(np.maximum.reduceat(p, np.arange(0, len(p), batch_size))) + 1
                      for p in positions])
    # where the round that completes batch k begins, for the rank whose batch k needs the furthest one
    waited_for = starts[np.searchsorted(starts, taken - 1, side="right") - 1].max(axis=0)
    leads: list[int] = np.maximum(waited_for[None, :] - taken, 0).max(axis=1).tolist()
    return leads


@dataclass(frozen=True)
class ReceiptLifetimes:
    """How long a rank holds the samples it receives, known from its plan before any byte moves."""

    rounds_held: int  # the most rounds whose receive buffers may be held at once
    copy_out: tuple[np.ndarray, ...]  # per round, over its received samples: those to copy out of the buffer


def receipt_lifetimes(positions: np.ndarray, rounds: tuple[ExchangeRound, ...], ahead: int,
                      copy_beyond: int) -> ReceiptLifetimes:
    """A round's received samples arrive in one buffer, which lives until the last of them is yielded.
    A shuffle buffer's tail is unbounded (one of B items keeps an item k·B positions longer with
    probability about e^-k), so a single sample could keep a whole round's buffer for the rest of the
    epoch: samples yielded more than ``copy_beyond`` positions after they arrive are copied out
    instead (a few percent at twice the buffer). ``rounds_held`` then counts the buffers held at once
    at most, each taken one round before its round arrives (a landing zone's offer) and freed once the
    consumer, at most ``ahead`` samples behind the exchange, has yielded the last sample kept in it.
    ``positions``: where in the rank's stream each sample it yields arrives (``RankPlan.positions``)."""
    if not rounds:
        return ReceiptLifetimes(0, ())
    arrivals = np.arange(len(positions))
    yielded_at = np.empty_like(positions)  # for each arrival, when it is yielded
    yielded_at[positions] = arrivals
    # samples the consumer has taken from the exchange once it has yielded p + 1
    taken_to_yield = np.maximum.accumulate(positions) + 1
    copy_out, last_kept = [], []
    for r in rounds:
        at = slice(r.stop - len(r.received), r.stop)  # each round emits what it keeps, then what it received
        far = yielded_at[at] - arrivals[at] > copy_beyond
        copy_out.append(far)
        last_kept.append(int(yielded_at[at][~far].max(initial=-1)))
    last = np.array(last_kept)
    held = 0
    for k, r in enumerate(rounds):
        # offering round k + 1's buffer during round k, every sample before round k emitted
        yielded = int(np.searchsorted(taken_to_yield, max(r.start - ahead, 0), side="right"))
        held = max(held, int((last[: k + 2] >= yielded).sum()))
    return ReceiptLifetimes(held, tuple(copy_out))
