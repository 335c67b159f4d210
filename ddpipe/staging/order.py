"""Which shards a node stages, and in what order: pure, from the epoch plan."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..plan import EpochPlan


def node_shard_order(plan: EpochPlan, node_ranks: Sequence[int],
                     shard_starts: Sequence[int]) -> tuple[list[int], dict[int, int]]:
    """The shards the ranks of one node read this epoch, ordered by how early any of them needs it
    (its first position in a rank's reads, as a fraction of that rank's reads), and for each shard
    how many of the node's ranks read it."""
    starts = np.asarray(shard_starts, dtype=np.int64)
    first: dict[int, float] = {}
    readers: dict[int, int] = {}
    for r in node_ranks:
        reads = plan.ranks[r].reads
        if len(reads) == 0:
            continue
        shards = np.searchsorted(starts, reads, side="right") - 1
        seen, where = np.unique(shards, return_index=True)
        for s, w in zip(seen.tolist(), where.tolist(), strict=True):
            first[s] = min(first.get(s, 1.0), w / len(reads))
            readers[s] = readers.get(s, 0) + 1
    return sorted(first, key=lambda s: (first[s], s)), readers
