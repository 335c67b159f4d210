"""``global``: one permutation of the whole epoch; each rank reads its slice by random access."""

from __future__ import annotations

import numpy as np

from ..seeding import GLOBAL, derive_rng
from .base import ShuffleMode


def global_order(samples: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``samples`` (global indices) in a uniformly random order."""
    return samples[rng.permutation(len(samples))]


class GlobalShuffle(ShuffleMode):
    name = "global"
    random_access = True
    compared = "end"

    def sequence(self, counts: np.ndarray, starts: np.ndarray, keep: np.ndarray, seed: int, epoch: int,
                 assignment: str) -> np.ndarray:
        return global_order(np.flatnonzero(keep), derive_rng(seed, GLOBAL, epoch))
