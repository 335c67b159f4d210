"""The local shuffle buffer: a permutation that never needs more than ``buffer_size`` items held."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ddpipe.shufflers.local import buffer_order, permute_runs


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 400), size=st.integers(0, 64), seed=st.integers(0, 2**32))
def test_buffer_order_is_a_permutation_within_its_buffer(n: int, size: int, seed: int) -> None:
    order = buffer_order(n, size, np.random.default_rng(seed))
    assert sorted(order.tolist()) == list(range(n))
    # emitting item k needs at most input items 0 .. k + size - 1: at most `size` held at any time
    held_max = max((int(order[: k + 1].max()) - k for k in range(n)), default=0)
    assert held_max < max(size, 1)


def stepped_buffer(n: int, size: int, rng: np.random.Generator) -> list[int]:
    """The buffer itself, stepped item by item: fill it, then emit a random slot's item and put the
    next item there, then emit what is left in random order (the same draws, in the same order)."""
    if size <= 1 or n <= 1:
        return list(range(n))
    size = min(size, n)
    held, out = list(range(size)), []
    for item, slot in zip(range(size, n), rng.integers(0, size, size=n - size).tolist(), strict=True):
        out.append(held[slot])
        held[slot] = item
    return out + [held[k] for k in rng.permutation(size).tolist()]


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 3000), size=st.sampled_from([0, 1, 2, 3, 7, 64, 1024]), seed=st.integers(0, 2**32))
@example(n=140_000, size=70_000, seed=1)  # more slots than 16 bits number
def test_buffer_order_is_what_the_buffer_emits(n: int, size: int, seed: int) -> None:
    # the plan computes the order without stepping through the buffer; stepping through it agrees
    order = buffer_order(n, size, np.random.default_rng(seed))
    assert order.tolist() == stepped_buffer(n, size, np.random.default_rng(seed))


@settings(max_examples=100, deadline=None)
@given(n=st.integers(50, 300), size=st.integers(8, 64))
def test_buffer_mixes_the_stream(n: int, size: int) -> None:
    orders = [buffer_order(n, size, np.random.default_rng(seed)) for seed in range(8)]
    assert any(not np.array_equal(o, np.arange(n)) for o in orders)
    assert len({o.tobytes() for o in orders}) > 1  # the seed decides


@settings(max_examples=200, deadline=None)
@given(shards=st.lists(st.integers(1, 6), min_size=1, max_size=12), seed=st.integers(0, 2**32))
def test_permute_runs_keeps_runs_whole(shards: list[int], seed: int) -> None:
    shard_of = np.repeat(np.arange(len(shards)), shards)
    positions = permute_runs(shard_of, np.random.default_rng(seed))
    assert sorted(positions.tolist()) == list(range(len(shard_of)))
    reordered = shard_of[positions]
    runs = [int(s) for k, s in enumerate(reordered) if k == 0 or reordered[k - 1] != s]
    assert sorted(runs) == list(range(len(shards)))  # each shard is still read in one run
