from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpipe.errors import DdpipeError
from ddpipe.loader_stats import ReadStats
from ddpipe.reorder import batches_in_order
from ddpipe.sample import KEY, Sample


@st.composite
def stream_and_positions(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """A stream with repeated samples (as padding makes), and the order its positions are yielded in."""
    stream = np.array(draw(st.lists(st.integers(0, 12), max_size=60)), dtype=np.int64)
    at = np.array(draw(st.permutations(range(len(stream)))), dtype=np.int64)
    return stream, at


def arrivals(stream: np.ndarray, group: int) -> Iterator[list[tuple[int, Sample]]]:
    items = [(g, {KEY: f"{g}@{i}"}) for i, g in enumerate(stream.tolist())]
    return iter([items[i : i + group] for i in range(0, len(items), group)])


@given(stream_and_positions(), st.integers(1, 7), st.integers(1, 9))
def test_batches_hold_the_plans_samples_in_its_order(case: tuple[np.ndarray, np.ndarray], batch_size: int,
                                                       group: int) -> None:
    stream, at = case
    order = stream[at]
    num_batches = -(-len(order) // batch_size)
    stats = ReadStats()
    batches = list(batches_in_order(arrivals(stream, group), order, at, batch_size, num_batches, stats))
    assert [i for indices, _ in batches for i in indices.tolist()] == order.tolist()
    keys = [s[KEY] for _, batch in batches for s in batch]
    # each yield is the very arrival the plan names, a repeated sample's copies included
    assert keys == [f"{g}@{i}" for g, i in zip(order.tolist(), at.tolist(), strict=True)]
    assert all(len(batch) == len(indices) for indices, batch in batches)


def test_arrivals_out_of_the_plans_order_are_an_error() -> None:
    stream = np.arange(8)
    swapped = stream.copy()
    swapped[[2, 5]] = swapped[[5, 2]]
    with pytest.raises(DdpipeError, match="out of the plan's order"):
        list(batches_in_order(arrivals(swapped, 3), stream, np.arange(8), 4, 2, ReadStats()))


def test_arrivals_that_end_early_are_an_error() -> None:
    stream = np.arange(8)
    with pytest.raises(DdpipeError, match="ended early"):
        list(batches_in_order(arrivals(stream[:5], 3), stream, np.arange(8), 4, 2, ReadStats()))
