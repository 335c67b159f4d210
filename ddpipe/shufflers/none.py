"""``none``: samples in stored order, shards in manifest order. The baseline."""

from __future__ import annotations

import numpy as np

from .base import ShuffleMode, shard_sequence


class NoShuffle(ShuffleMode):
    name = "none"

    def sequence(self, counts: np.ndarray, starts: np.ndarray, keep: np.ndarray, seed: int, epoch: int,
                 assignment: str) -> np.ndarray:
        return shard_sequence(np.arange(len(counts)), counts, starts, keep)
