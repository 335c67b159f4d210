from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpipe.errors import DdpipeError
from ddpipe.loader_stats import ReadStats
from ddpipe.reorder import batches_in_order, stream_positions
from ddpipe.sample import KEY, Sample


@st.composite
def stream_and_order(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """A stream with repeated samples (as padding makes), and an order yielding some of it."""
    stream = np.array(draw(st.lists(st.integers(0, 12), max_size=60)), dtype=np.int64)
    keep = draw(st.lists(st.booleans(), min_size=len(stream), max_size=len(stream)))
    order = draw(st.permutations(stream[np.array(keep, dtype=bool)].tolist()))
    return stream, np.array(order, dtype=np.int64)


@given(stream_and_order())
def test_each_yielded_sample_is_found_at_its_own_place_in_the_stream(case: tuple[np.ndarray, np.ndarray]) -> None:
    stream, order = case
    at = stream_positions(stream, order)
    assert stream[at].tolist() == order.tolist()
    assert len(set(at.tolist())) == len(order)  # a sample yielded twice arrives twice


def test_a_sample_the_stream_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="does not hold"):
        stream_positions(np.array([1, 2, 3]), np.array([3, 3]))


def arrivals(stream: np.ndarray, group: int) -> Iterator[list[tuple[int, Sample]]]:
    items = [(g, {KEY: f"{g}@{i}"}) for i, g in enumerate(stream.tolist())]
    return iter([items[i : i + group] for i in range(0, len(items), group)])


@given(stream_and_order(), st.integers(1, 7), st.integers(1, 9))
def test_batches_hold_the_plans_samples_in_its_order(case: tuple[np.ndarray, np.ndarray], batch_size: int,
                                                       group: int) -> None:
    stream, order = case
    num_batches = -(-len(order) // batch_size)
    stats = ReadStats()
    batches = list(batches_in_order(arrivals(stream, group), stream, order, batch_size, num_batches, stats))
    assert [i for indices, _ in batches for i in indices.tolist()] == order.tolist()
    keys = [s[KEY] for _, batch in batches for s in batch]
    assert [int(k.split("@")[0]) for k in keys] == order.tolist()
    assert len(set(keys)) == len(keys)  # each arrival taken once: a repeated sample's copies in turn
    assert all(len(batch) == len(indices) for indices, batch in batches)


def test_arrivals_out_of_the_plans_order_are_an_error() -> None:
    stream = np.arange(8)
    swapped = stream.copy()
    swapped[[2, 5]] = swapped[[5, 2]]
    with pytest.raises(DdpipeError, match="out of the plan's order"):
        list(batches_in_order(arrivals(swapped, 3), stream, stream, 4, 2, ReadStats()))


def test_arrivals_that_end_early_are_an_error() -> None:
    stream = np.arange(8)
    with pytest.raises(DdpipeError, match="ended early"):
        list(batches_in_order(arrivals(stream[:5], 3), stream, stream, 4, 2, ReadStats()))
