"""``global``: one permutation of the whole epoch; each rank reads its slice by random access."""

from __future__ import annotations

import numpy as np


def global_order(samples: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``samples`` (global indices) in a uniformly random order."""
    return samples[rng.permutation(len(samples))]
