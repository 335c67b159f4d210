"""The exchange's wire format, without MPI: what one rank packs, another unpacks unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.comm import Comm
from ddpipe.comm.base import RELEASE_LOCK_AT, Written, pack_parts
from ddpipe.exchange import ReadsAhead, SegmentWriter, segment_parts, unpack_segment
from ddpipe.sample import KEY

from .formats.conformance import samples


@settings(max_examples=60, deadline=None)
@given(st.lists(samples, min_size=1, max_size=4))
def test_segments_round_trip(per_dest: list[list[dict[str, Any]]]) -> None:
    outgoing = [[(1000 * d + i, s) for i, s in enumerate(items)] for d, items in enumerate(per_dest)]
    outgoing.append([])  # a rank this one sends nothing to
    segments = [segment_parts(items) for items in outgoing]
    assert segments[-1] == []
    for items, parts in zip(outgoing, segments, strict=True):
        if items:
            assert unpack_segment(memoryview(b"".join(parts))) == ([g for g, _ in items], items)


@settings(max_examples=60, deadline=None)
@given(samples, st.integers(0, 2000))
def test_a_segment_written_in_its_place_reads_back_whole_or_goes_as_parts(items: list[dict[str, Any]],
                                                                          room: int) -> None:
    """A sender writes each sample into the place its receiver offered as it comes: the segment is
    the same whether it fitted there or outgrew it midway and went as parts."""
    numbered = [(10 + i, s) for i, s in enumerate(items)]
    place = bytearray(b"\xee" * (room + 16))  # bytes past the place must stay untouched
    writer = SegmentWriter(memoryview(place)[:room])
    for g, sample in numbered:
        writer.add(g, sample)
    segment = writer.finish()
    whole = b"".join(segment_parts(numbered))
    if isinstance(segment, Written):
        assert bytes(place[: segment.nbytes]) == whole
    else:
        assert b"".join(segment) == whole and len(whole) > room
    assert place[room:] == b"\xee" * 16
    assert unpack_segment(memoryview(whole)) == ([g for g, _ in numbered], numbered)


def test_a_segment_written_in_its_place_keeps_no_view_of_its_samples() -> None:
    """The bytes a sample was read into (a shard's mapping) are free once it is in its place, while a
    segment that goes as parts keeps them, uncopied, until it has gone."""
    shard = bytearray(b"x" * 300)
    writer = SegmentWriter(memoryview(bytearray(1000)))
    for i in range(3):
        writer.add(i, {KEY: f"k{i}", "jpg": memoryview(shard)[100 * i : 100 * i + 100]})
    shard.extend(b"y")  # a buffer cannot be resized while a view of it lives (BufferError)
    unplaced = SegmentWriter()
    unplaced.add(0, {KEY: "k0", "jpg": memoryview(shard)[:100]})
    with pytest.raises(BufferError):
        shard.extend(b"y")
    assert isinstance(writer.finish(), Written)


def test_world_of_one_exchanges_with_itself() -> None:
    sample = {"__key__": "a", "jpg": b"xyz"}
    received = Comm().alltoallv([segment_parts([(7, sample)])])
    assert received is not None
    (segment,) = received
    assert unpack_segment(segment) == ([7], [(7, {"__key__": "a", "jpg": b"xyz"})])
    assert Comm().alltoallv([[b"x"]], wanted=False) is None


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 30), st.lists(st.tuples(st.booleans(), st.integers(0, 8)), max_size=60),
       st.one_of(st.none(), st.integers(0, 29)))
def test_reading_ahead_gives_every_sample_in_order_and_an_error_where_it_was_met(
        n: int, steps: list[tuple[bool, int]], fails_at: int | None) -> None:
    """However reads ahead (while waiting, up to a limit) and reads taken interleave, the samples come
    in their order, none twice or lost, the read-ahead never holding more than its limit; a read that
    fails ahead of time raises where its sample would have been taken, after every sample before it."""
    read = []

    def reads() -> Iterator[dict[str, Any]]:
        for i in range(n):
            if i == fails_at:
                raise OSError(f"shard cut short at sample {i}")
            read.append(i)
            yield {KEY: str(i)}

    ahead = ReadsAhead(reads())
    taken: list[int] = []
    try:
        for wait, limit in steps:
            if wait:
                ahead.limit, held = limit, len(read) - len(taken)
                while ahead.read_one():
                    pass
                assert len(read) - len(taken) <= max(limit, held)
            else:
                taken.append(int(next(ahead)[KEY]))
        taken.extend(int(s[KEY]) for s in ahead)
    except OSError as e:
        assert fails_at is not None and fails_at < n and str(e).endswith(str(fails_at))
        assert taken == list(range(fails_at))
    except StopIteration:  # a step took one beyond the end
        assert taken == list(range(n))
    else:
        assert (fails_at is None or fails_at >= n) and taken == list(range(n))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2 * RELEASE_LOCK_AT), min_size=1, max_size=4), st.integers(0, 2**32 - 1))
def test_parts_packed_back_to_back_whatever_their_sizes(sizes: list[int], seed: int) -> None:
    """Pieces below and above the size NumPy copies (letting go of the interpreter lock) land alike:
    back to back, byte for byte, and nothing past them is touched."""
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    into = np.full(sum(sizes) + 7, 0xAB, dtype=np.uint8)
    pack_parts([memoryview(p) for p in parts], into)
    assert into[: sum(sizes)].tobytes() == b"".join(parts)
    assert (into[sum(sizes) :] == 0xAB).all()
