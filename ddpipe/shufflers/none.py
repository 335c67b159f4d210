"""``none``: samples in stored order, shards in manifest order. The baseline."""

from __future__ import annotations

import numpy as np


def shard_order(num_shards: int) -> np.ndarray:
    return np.arange(num_shards)
