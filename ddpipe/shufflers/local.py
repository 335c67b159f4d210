"""``local``: each rank mixes only what it reads, with bounded memory.

Two pure choices: the order in which a rank reads its runs of shards (permuted per epoch, so the
same shards are read but not in the same sequence), and the order a bounded shuffle buffer
emits a stream in. The buffer is simulated on indices, so the plan knows the exact yield order
and the loader only has to reproduce it.
"""

from __future__ import annotations

import numpy as np

from ..seeding import BUFFER, SEGMENTS, derive_rng
from .base import ShuffleMode


def permute_runs(shard_of: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Positions of a sequence reordered run by run, a run being consecutive items of one shard."""
    n = len(shard_of)
    if n == 0:
        return np.arange(0)
    cuts = np.flatnonzero(np.diff(shard_of)) + 1
    starts = np.concatenate([[0], cuts])
    stops = np.concatenate([cuts, [n]])
    order = rng.permutation(len(starts))
    return np.concatenate([np.arange(starts[k], stops[k]) for k in order])


def buffer_order(n: int, buffer_size: int, rng: np.random.Generator) -> np.ndarray:
    """The permutation of ``range(n)`` that a shuffle buffer of ``buffer_size`` produces.

    Fill the buffer; then for each new item emit a random buffered item and put the new one in
    its place; finally emit the rest in random order. Item ``k`` of the output entered the buffer
    no later than input position ``k + buffer_size``: memory stays bounded by the buffer.

    Computed without stepping through the buffer (a loop of Python took 0.17 s for ImageNet's
    1.28 M samples, on the thread that starts each epoch: benchmarks/plan_time.py): step ``t`` emits
    what its slot holds, which is the item the slot's previous step put there, or the slot's first item.
    """
    if buffer_size <= 1 or n <= 1:
        return np.arange(n)
    size = min(buffer_size, n)
    picks = rng.integers(0, size, size=n - size)  # the slot each step empties; step t puts item size + t there
    # each slot's steps together, in step order (a stable sort: radix, for slots that fit in 16 bits)
    by_slot = np.argsort(picks.astype(np.uint16) if size <= 1 << 16 else picks, kind="stable")
    slots = picks[by_slot]
    follows = np.zeros(len(slots), dtype=bool)  # the same slot's step is just before it in by_slot
    follows[1:] = slots[1:] == slots[:-1]
    out = picks.copy()
    out[by_slot[follows]] = size + by_slot[:-1][follows[1:]]
    # what each slot holds after the last step, emitted at random at the end
    last = np.ones(len(slots), dtype=bool)
    last[:-1] = ~follows[1:]
    held = np.arange(size, dtype=np.int64)
    held[slots[last]] = size + by_slot[last]
    return np.concatenate([out, held[rng.permutation(size)]]).astype(np.int64)


class LocalShuffle(ShuffleMode):
    name = "local"
    compared = "start"

    def reads(self, share: np.ndarray, shard_of_sample: np.ndarray, seed: int, epoch: int, rank: int) -> np.ndarray:
        if not len(share):
            return share
        out: np.ndarray = share[permute_runs(shard_of_sample[share], derive_rng(seed, SEGMENTS, epoch, rank))]
        return out

    def yield_positions(self, n: int, seed: int, epoch: int, rank: int, buffer_size: int) -> np.ndarray:
        return buffer_order(n, buffer_size, derive_rng(seed, BUFFER, epoch, rank))
