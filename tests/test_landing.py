"""How a landing zone hands out its places (ddpipe/comm/landing.py): places taken are never shared
with a place still held, stay inside the zone, come back once freed, in whatever order they were
freed, and are taken lowest first."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.comm.landing import Places

CAPACITY = 1000
# an operation: take that many bytes, or free the held place at that index (modulo how many are held)
operations = st.lists(st.one_of(st.tuples(st.just("take"), st.integers(1, CAPACITY)),
                                st.tuples(st.just("free"), st.integers(0, 50))), max_size=200)


@given(operations)
@settings(max_examples=300, deadline=None)
def test_places_held_never_overlap_and_all_space_comes_back(ops: list[tuple[str, int]]) -> None:
    places = Places(CAPACITY)
    held: list[tuple[int, int]] = []
    for op, n in ops:
        if op == "take":
            start = places.take(n)
            if start is None:
                continue
            assert start >= 0 and start + n <= CAPACITY
            assert all(start + n <= a or b <= start for a, b in held), (start, n, held)
            held.append((start, start + n))
        elif held:
            a, _ = held.pop(n % len(held))
            places.free(a)
    for a, _ in held:
        places.free(a)
    assert places.take(CAPACITY) == 0  # everything freed: the whole zone is one place again


def test_places_are_taken_lowest_first_so_freed_memory_is_used_again() -> None:
    places = Places(300)
    assert [places.take(100) for _ in range(3)] == [0, 100, 200]
    assert places.take(1) is None  # full
    places.free(100)
    assert places.take(101) is None and places.take(60) == 100 and places.take(40) == 160
    places.free(0)
    places.free(200)
    assert places.take(100) == 0 and places.take(100) == 200
