"""Every random choice in ddpipe derives from the user's seed and an explicit path of integers.

Never from time, process ids or ``hash()`` of strings (which differ per process), so that every
rank draws the same numbers without talking.
"""

from __future__ import annotations

import numpy as np

# What a draw is for: the first integer of its path, so that two purposes never share a stream.
SHARD_ORDER = 1
DROP = 2
SEGMENTS = 3
BUFFER = 4
EXCHANGE = 5
GLOBAL = 6
SEND = 7
AUGMENT = 8
DECODE = 9


# the seeds taken (ddpipe.fields.seed_option): numpy's and torch's int64, each its own 64-bit word
SEED_LEAST, SEED_BELOW = -(2**63), 2**63


def derive_rng(seed: int, *path: int) -> np.random.Generator:
    """A generator determined by ``(seed, *path)`` alone. A negative seed is taken as its 64-bit two's
    complement: distinct from every other seed of the range (masked to 63 bits, -1 was 2**63 - 1)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed & (2**64 - 1), *path])))
