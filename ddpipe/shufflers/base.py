"""What a shuffle mode decides, step by step, for :func:`ddpipe.plan.plan_epoch`.

A mode is one object in the registry (``ddpipe.shufflers.SHUFFLERS``); the plan consults it at
each step and never tests a mode's name. Every choice is a pure function of its arguments, with
randomness drawn from (seed, epoch, rank) streams (:mod:`ddpipe.seeding`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..seeding import SHARD_ORDER, derive_rng


class ShuffleMode:
    """The defaults: shards in an order fixed by the assignment, read and yielded as they come,
    nothing exchanged."""

    name: ClassVar[str]
    random_access: ClassVar[bool] = False  # reads sample by sample rather than scanning shards
    #: takes an exchange fraction Q: ``ddpipe plan`` scores it at each Q, ``ddpipe bench`` times its
    #: reading with and without the exchange, the projection counts its traffic between nodes
    exchanges: ClassVar[bool] = False
    #: the mode whose reading this one's is, less the exchange (``ddpipe bench``'s read phase)
    reads_as: ClassVar[str | None] = None
    #: its place when modes are compared (``ddpipe plan``, the projection): ``"start"`` (no mixing
    #: across ranks: where the gap to a global shuffle is measured from), ``"end"`` (a global
    #: shuffle: the best order), ``"between"`` (closes part of the gap), or None (not compared)
    compared: ClassVar[str | None] = None

    def sequence(self, counts: np.ndarray, starts: np.ndarray, keep: np.ndarray, seed: int, epoch: int,
                 assignment: str) -> np.ndarray:
        """Step 1: the epoch's global indices, before they are cut into the ranks' shares.
        ``sticky``: shards in an order fixed by the seed (each node reads the same shards every
        epoch, so node-local staging is reused); ``rotate``: a new order each epoch."""
        rng = derive_rng(seed, SHARD_ORDER) if assignment == "sticky" else derive_rng(seed, SHARD_ORDER, epoch)
        return shard_sequence(rng.permutation(len(counts)), counts, starts, keep)

    def reads(self, share: np.ndarray, shard_of_sample: np.ndarray, seed: int, epoch: int, rank: int) -> np.ndarray:
        """Step 4: the order in which ``rank`` reads its share."""
        return share

    def exchange(self, reads: list[np.ndarray], per_rank: int, seed: int, epoch: int, fraction: float,
                 round_size: int) -> tuple[list[tuple[Any, ...]], list[np.ndarray]]:
        """Step 5: every rank's exchange rounds, and the stream each rank holds after them."""
        return [() for _ in reads], reads

    def yield_positions(self, n: int, seed: int, epoch: int, rank: int, buffer_size: int) -> np.ndarray:
        """Step 6: the order in which ``rank`` yields its stream (``n`` samples long), as positions in it."""
        return np.arange(n)


def shard_sequence(shards: np.ndarray, counts: np.ndarray, starts: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The samples of ``shards``, in that order and each shard's stored order, that ``keep`` keeps."""
    if len(shards) == 0:
        return np.zeros(0, dtype=np.int64)
    seq = np.concatenate([np.arange(starts[s], starts[s] + counts[s]) for s in shards])
    kept: np.ndarray = seq[keep[seq]]
    return kept
