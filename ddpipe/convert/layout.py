"""Which source items go into which shard: pure functions of the ordered item sizes."""

from __future__ import annotations

from collections.abc import Sequence

from ..seeding import derive_rng
from ..units import parse_size

DEFAULT_SHARD_BYTES = 256 * 1000 * 1000
# tar spends a 512-byte header and up to 511 bytes of padding per field; two fields per sample
_PER_SAMPLE_OVERHEAD = 2 * 768


def sample_order(num_items: int, seed: int | None) -> list[int]:
    """Source order, or a permutation drawn from ``seed`` alone (the same on every machine)."""
    if seed is None:
        return list(range(num_items))
    return [int(i) for i in derive_rng(seed, 0x5EED).permutation(num_items)]


def pack_shards(
    sizes: Sequence[int], *, shard_bytes: int | None = None, samples_per_shard: int | None = None
) -> list[tuple[int, int]]:
    """Split items (in write order) into contiguous ``[start, stop)`` shards.

    With ``samples_per_shard`` every shard but the last holds exactly that many; with
    ``shard_bytes`` a shard closes before the item that would take it past the target.
    """
    n = len(sizes)
    if samples_per_shard is not None:
        if samples_per_shard < 1:
            raise ValueError("samples_per_shard must be at least 1")
        return [(i, min(i + samples_per_shard, n)) for i in range(0, n, samples_per_shard)]
    target = DEFAULT_SHARD_BYTES if shard_bytes is None else shard_bytes
    if target < 1:
        raise ValueError("shard_bytes must be positive")
    ranges: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        cost = size + _PER_SAMPLE_OVERHEAD
        if i > start and total + cost > target:
            ranges.append((start, i))
            start, total = i, 0
        total += cost
    if start < n:
        ranges.append((start, n))
    return ranges

__all__ = ["DEFAULT_SHARD_BYTES", "pack_shards", "parse_size", "sample_order"]
