"""The exchange's wire format, without MPI: what one rank packs, another unpacks unchanged."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.comm import Comm
from ddpipe.exchange import segment_parts, unpack_segment

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


def test_world_of_one_exchanges_with_itself() -> None:
    sample = {"__key__": "a", "jpg": b"xyz"}
    received = Comm().alltoallv([segment_parts([(7, sample)])])
    assert received is not None
    (segment,) = received
    assert unpack_segment(segment) == ([7], [(7, {"__key__": "a", "jpg": b"xyz"})])
    assert Comm().alltoallv([[b"x"]], wanted=False) is None
