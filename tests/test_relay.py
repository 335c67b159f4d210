"""The relay's protocol without MPI: a reading process's collectives, carried out by a relay thread
on a world of one, over a real socket pair and shared areas. The same relay under mpiexec, between
ranks and nodes, is tests/mpi/test_loader_mpi.py's."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.comm import Comm, World
from ddpipe.comm.base import Written
from ddpipe.comm.relay import RelayedComm, start_relay


@contextlib.contextmanager
def relayed(area: int, size: int = 1) -> Iterator[RelayedComm]:
    """A RelayedComm of a world of ``size`` whose collectives a relay thread carries out on a world
    of one, through areas of ``area`` bytes."""
    memory = memoryview(bytearray(2 * area))
    ours, theirs = socket.socketpair()
    thread = start_relay(Connection(theirs.detach()), Comm(World()), memory[:area], memory[area:])
    comm = RelayedComm(World(rank=0, size=size), [0], Connection(ours.detach()), memory[:area], memory[area:])
    try:
        yield comm
    finally:
        comm._conn.close()  # the relay's receive ends: its thread returns
        thread.join(timeout=10)
    assert not thread.is_alive()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=4), st.sampled_from([16, 1 << 12]))
def test_a_round_comes_back_whole_through_the_areas_or_the_socket(parts: list[bytes], area: int) -> None:
    """What a rank sends itself comes back byte for byte, rounds after rounds, whether the round
    fits the shared areas or goes through the connection (16 bytes: most do not)."""
    with relayed(area) as comm:
        for _ in range(3):
            got = comm.alltoallv([[memoryview(p) for p in parts]])
            assert got is not None and [bytes(g) for g in got] == [b"".join(parts)]


def test_no_rank_wanting_the_round_ends_it_and_what_was_received_outlives_the_next() -> None:
    with relayed(1 << 12) as comm:
        first = comm.alltoallv([[b"first round"]])
        second = comm.alltoallv([[b"second, longer round"]])
        assert first is not None and second is not None
        assert bytes(first[0]) == b"first round"  # copied out: the next round's answer did not overwrite it
        assert comm.alltoallv([[b"x"]], wanted=False) is None
        assert comm.allgather({"a": 1}) == [{"a": 1}]
        comm.barrier()


def test_an_error_in_the_relay_is_raised_in_the_reading_process() -> None:
    """A reading process told it is one of two ranks, relayed to a world of one: the parent's
    communicator refuses the round, and the reading process raises that error."""
    with relayed(1 << 12, size=2) as comm:
        with pytest.raises(ValueError, match="one segment per rank"):
            comm.alltoallv([[b"a"], [b"b"]])
        assert comm.allgather(7) == [7]  # the relay serves on


def test_segments_written_in_place_are_not_what_a_reading_process_sends() -> None:
    """A reading process offers no places (its rounds' segments are parts, packed into the area)."""
    with relayed(1 << 12) as comm:
        assert comm.places() == {}
        with pytest.raises(ValueError, match="no parts left to pack"):
            comm.alltoallv([Written(4)])
