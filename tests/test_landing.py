"""The ring a landing zone takes its places from (ddpipe/comm/landing.py): places taken are never
shared with a place still held, stay inside the zone, and come back once freed, in whatever order
they were freed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.comm.landing import PlaceRing

CAPACITY = 1000
# an operation: take that many bytes, or free the held place at that index (modulo how many are held)
operations = st.lists(st.one_of(st.tuples(st.just("take"), st.integers(1, CAPACITY)),
                                st.tuples(st.just("free"), st.integers(0, 50))), max_size=200)


@given(operations)
@settings(max_examples=300, deadline=None)
def test_places_held_never_overlap_and_all_space_comes_back(ops: list[tuple[str, int]]) -> None:
    ring = PlaceRing(CAPACITY)
    held: list[tuple[int, int]] = []
    for op, n in ops:
        if op == "take":
            start = ring.take(n)
            if start is None:
                continue
            assert start >= 0 and start + n <= CAPACITY
            assert all(start + n <= a or b <= start for a, b in held), (start, n, held)
            held.append((start, start + n))
        elif held:
            a, _ = held.pop(n % len(held))
            ring.free(a)
    for a, _ in held:
        ring.free(a)
    assert ring.take(CAPACITY) == 0  # everything freed: the whole zone is one place again


def test_a_place_held_blocks_the_ring_behind_it_until_freed() -> None:
    ring = PlaceRing(300)
    assert [ring.take(100) for _ in range(3)] == [0, 100, 200]
    ring.free(100)
    ring.free(200)
    assert ring.take(100) is None  # the oldest place still held: nothing behind it comes back
    ring.free(0)
    assert ring.take(250) == 0
    assert ring.take(60) is None and ring.take(50) == 250
