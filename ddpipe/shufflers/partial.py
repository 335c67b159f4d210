"""``partial``: every rank sends a fraction Q of its samples to other ranks each epoch.

(Nguyen et al., "Why Globally Re-shuffle? Revisiting Data Shuffling in Large Scale Deep
Learning", IPDPS 2022.) Pure choices only: which read positions a rank sends, to whom, in which
round. The exchange runs in rounds of consecutive read positions, so a round can go out as soon
as it has been read. In round ``j`` every rank sends the same count to each partner slot ``t``,
to rank ``(r + shift_t) % W``, and receives that count from ``(r - shift_t) % W``: every rank
sends and receives exactly as many samples as it reads, so counts stay equal (invariant 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..seeding import EXCHANGE, SEND, derive_rng
from .local import LocalShuffle


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
class RoundShape:
    """What all ranks share about round ``j``: its read positions and the per-slot counts and shifts."""

    start: int
    stop: int
    counts: tuple[int, ...]  # samples each rank sends through slot t (and receives through it)
    shifts: tuple[int, ...]  # slot t sends to rank (r + shifts[t]) % W


def round_shapes(per_rank: int, world_size: int, fraction: float, round_size: int, seed: int,
                 epoch: int) -> list[RoundShape]:
    if world_size < 2 or fraction <= 0 or per_rank == 0:
        return []
    partners = world_size - 1
    shifts = (1 + derive_rng(seed, EXCHANGE, epoch).permutation(partners)).tolist()
    shapes = []
    for j, start in enumerate(range(0, per_rank, round_size)):
        stop = min(start + round_size, per_rank)
        k = int(fraction * (stop - start) + 0.5)
        counts = tuple(k // partners + (1 if t < k % partners else 0) for t in range(partners))
        # rotate the pairing each round, so a rank's partners vary within the epoch
        shapes.append(RoundShape(start, stop, counts, tuple(shifts[(t + j) % partners] for t in range(partners))))
    return shapes


def send_positions(shape: RoundShape, rank: int, seed: int, epoch: int, round_index: int) -> list[np.ndarray]:
    """Read positions (within the rank's reads) this rank sends through each slot, each in read order."""
    length = shape.stop - shape.start
    chosen = derive_rng(seed, SEND, epoch, rank, round_index).permutation(length)[: sum(shape.counts)]
    out, at = [], 0
    for count in shape.counts:
        out.append(np.sort(chosen[at : at + count]) + shape.start)
        at += count
    return out


class PartialShuffle(LocalShuffle):
    """``local``, after exchanging a fraction of each rank's reads with the other ranks."""

    name = "partial"

    def exchange(self, reads: list[np.ndarray], per_rank: int, seed: int, epoch: int, fraction: float,
                 round_size: int) -> tuple[list[tuple[ExchangeRound, ...]], list[np.ndarray]]:
        world_size = len(reads)
        shapes = round_shapes(per_rank, world_size, fraction, round_size, seed, epoch)
        if not shapes:
            return [() for _ in range(world_size)], reads
        sends = [[send_positions(shape, r, seed, epoch, j) for j, shape in enumerate(shapes)]
                 for r in range(world_size)]
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
