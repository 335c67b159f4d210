"""The exchange's wire format, without MPI: what one rank packs, another unpacks unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.comm import Comm
from ddpipe.comm.base import Written
from ddpipe.exchange import SegmentWriter, segment_parts, unpack_segment
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
