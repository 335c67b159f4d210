"""The exchange's wire format, without MPI: what one rank packs, another unpacks unchanged."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.comm import Comm
from ddpipe.exchange import pack_segments, unpack_segment

from .formats.conformance import samples


@settings(max_examples=60, deadline=None)
@given(st.lists(samples, min_size=1, max_size=4))
def test_segments_round_trip(per_dest: list[list[dict]]) -> None:
    outgoing = [[(1000 * d + i, s) for i, s in enumerate(items)] for d, items in enumerate(per_dest)]
    outgoing.append([])  # a rank this one sends nothing to
    buffer, counts = pack_segments(outgoing)
    assert sum(counts) <= len(buffer) and counts[-1] == 0
    at = 0
    for items, count in zip(outgoing, counts, strict=True):
        if count:
            assert unpack_segment(buffer.data[at : at + count]) == items
        at += count


def test_world_of_one_exchanges_with_itself() -> None:
    buffer, counts = pack_segments([[(7, {"__key__": "a", "jpg": b"xyz"})]])
    (segment,) = Comm().alltoallv(buffer, counts)
    assert unpack_segment(segment) == [(7, {"__key__": "a", "jpg": b"xyz"})]
