from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpipe.convert.layout import pack_shards, parse_size, sample_order

sizes = st.lists(st.integers(0, 10_000), max_size=200)


@given(sizes, st.integers(1, 50_000))
def test_pack_by_bytes_covers_every_item_once_in_order(items: list[int], target: int) -> None:
    ranges = pack_shards(items, shard_bytes=target)
    assert [i for a, b in ranges for i in range(a, b)] == list(range(len(items)))
    assert all(b > a for a, b in ranges)
    for a, b in ranges:  # a shard exceeds the target only when it holds a single item
        assert b - a == 1 or sum(items[a:b]) <= target


@given(sizes, st.integers(1, 30))
def test_pack_by_count(items: list[int], per: int) -> None:
    ranges = pack_shards(items, samples_per_shard=per)
    assert [i for a, b in ranges for i in range(a, b)] == list(range(len(items)))
    assert all(b - a == per for a, b in ranges[:-1])


@given(st.integers(0, 500), st.integers(0, 2**32))
def test_sample_order_is_a_seeded_permutation(n: int, seed: int) -> None:
    order = sample_order(n, seed)
    assert sorted(order) == list(range(n))
    assert order == sample_order(n, seed)
    assert sample_order(n, None) == list(range(n))


def test_seeds_differ() -> None:
    assert sample_order(100, 1) != sample_order(100, 2)


@pytest.mark.parametrize(("text", "value"), [("256MB", 256_000_000), ("1GiB", 2**30), ("1000", 1000),
                                             ("1.5 kb", 1500), ("64MiB", 64 * 2**20)])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "MB", "-5MB", "12XB", "abc", "+1MB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="cannot parse size"):
        parse_size(text)


@pytest.mark.parametrize(("text", "says"), [
    ("inf", "size 'inf' is not a number of bytes"),  # was OverflowError's traceback
    ("nanMB", "size 'nanMB' is not a number of bytes"),  # was "cannot convert float NaN to integer"
    ("0", "size '0' is less than one byte"),  # was "cannot parse": it parses, but holds nothing
    ("0.5", "size '0.5' is less than one byte"),  # was 0, then refused as "shard_bytes must be at least 1"
])
def test_a_size_that_parses_but_is_no_number_of_bytes_says_so(text: str, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_size(text)
    assert str(refused.value).startswith(says)
