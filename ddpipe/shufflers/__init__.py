"""Shuffle modes. Each module holds one algorithm's pure choice of indices; ``exchange`` carries out
``partial``'s plan over MPI.

- ``none``: stored order.
- ``local``: each rank permutes its runs of shards and streams through a bounded shuffle buffer.
- ``partial``: ``local``, after exchanging a fraction Q of the samples with other ranks.
- ``global``: a permutation of the whole epoch, read by random access.
"""

SHUFFLE_MODES = ("none", "local", "partial", "global")

__all__ = ["SHUFFLE_MODES"]
