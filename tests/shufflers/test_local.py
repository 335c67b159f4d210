"""The local shuffle buffer: a permutation that never needs more than ``buffer_size`` items held."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
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
