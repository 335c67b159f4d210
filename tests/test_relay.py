"""The relay's protocol without MPI: a reading process's collectives, carried out by a relay thread
on a world of one, over real socket pairs and shared areas, and what a round received handed on as
places in the received area (its news on the batches' connection, as the reading process sends it).
The same relay under mpiexec, between ranks and nodes, is tests/mpi/test_read_apart_mpi.py's."""

from __future__ import annotations

import contextlib
import gc
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.comm import Comm, World
from ddpipe.comm.base import Written
from ddpipe.comm.relay import ReceivedRounds, RelayedComm, start_relay
from ddpipe.shard_places import IN_BUFFER, PlaceFinder, PlaceViews


@dataclass
class Relayed:
    comm: RelayedComm  # the reading process's
    finder: PlaceFinder  # the reading process's places, telling the parent on ``news``
    parent: PlaceViews  # the parent's rounds
    news: Connection  # the parent's end of the batches' connection

    def parent_takes_news(self) -> None:
        """The reading process tells its news, and the parent takes it in (as before a batch)."""
        self.finder.send_news()
        while self.news.poll():
            assert self.parent.receive(self.news.recv(), self.news)


@contextlib.contextmanager
def relayed(area: int, size: int = 1, received: int | None = None) -> Iterator[Relayed]:
    """A RelayedComm of a world of ``size`` whose collectives a relay thread carries out on a world
    of one, through a sent area of ``area`` bytes and a received one of ``received`` (``area``)."""
    received = area if received is None else received
    memory = memoryview(bytearray(area + received))
    ours, theirs = socket.socketpair()
    child, parent = socket.socketpair()
    with Connection(child.detach()) as news_out, Connection(parent.detach()) as news_in:
        finder, files = PlaceFinder(news_out, os.getpid()), PlaceViews()
        files.rounds = ReceivedRounds(memory[area:])
        thread = start_relay(Connection(theirs.detach()), Comm(World()), memory[:area], files.rounds)
        comm = RelayedComm(World(rank=0, size=size), [0], Connection(ours.detach()), memory[:area], memory[area:],
                           on_round=finder.received_round)
        try:
            yield Relayed(comm, finder, files, news_in)
        finally:
            comm._conn.close()  # the relay's receive ends: its thread returns
            thread.join(timeout=10)
        assert not thread.is_alive()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=4), st.sampled_from([16, 1 << 12]))
def test_a_round_comes_back_whole_through_the_areas_or_the_socket(parts: list[bytes], area: int) -> None:
    """What a rank sends itself comes back byte for byte, rounds after rounds, whether the round
    fits the shared areas or goes through the connection (16 bytes: most do not)."""
    with relayed(area) as r:
        for _ in range(3):
            got = r.comm.alltoallv([[memoryview(p) for p in parts]])
            assert got is not None and [bytes(g) for g in got] == [b"".join(parts)]


def test_no_rank_wanting_the_round_ends_it_and_what_was_received_outlives_the_next() -> None:
    with relayed(1 << 12) as r:
        first = r.comm.alltoallv([[b"first round"]])
        second = r.comm.alltoallv([[b"second, longer round"]])
        assert first is not None and second is not None
        assert bytes(first[0]) == b"first round"  # a place of its own: the next round's answer did not overwrite it
        assert r.comm.alltoallv([[b"x"]], wanted=False) is None
        assert r.comm.allgather({"a": 1}) == [{"a": 1}]
        r.comm.barrier()


def test_an_error_in_the_relay_is_raised_in_the_reading_process() -> None:
    """A reading process told it is one of two ranks, relayed to a world of one: the parent's
    communicator refuses the round, and the reading process raises that error."""
    with relayed(1 << 12, size=2) as r:
        with pytest.raises(ValueError, match="one segment per rank"):
            r.comm.alltoallv([[b"a"], [b"b"]])
        assert r.comm.allgather(7) == [7]  # the relay serves on


def test_segments_written_in_place_are_not_what_a_reading_process_sends() -> None:
    """A reading process offers no places (its rounds' segments are parts, packed into the area)."""
    with relayed(1 << 12) as r:
        assert r.comm.places() == {}
        with pytest.raises(ValueError, match="no parts left to pack"):
            r.comm.alltoallv([Written(4)])


def test_received_samples_are_placed_where_their_round_arrived_for_the_parent_to_read() -> None:
    with relayed(1 << 12) as r:
        got = r.comm.alltoallv([[b"head|", b"sample one|", b"sample two"]])
        assert got is not None
        one, two = got[0][5:15], got[0][16:]
        (n1, at1), (n2, at2) = r.finder.place(one), r.finder.place(two)
        assert n1 == n2 != IN_BUFFER and (at1, at2) == (5, 16)
        r.parent_takes_news()
        assert bytes(r.parent.view(n1, at1, len(one))) == b"sample one"
        assert bytes(r.parent.view(n2, at2, len(two))) == b"sample two"


def test_a_place_is_written_again_only_once_the_reading_process_and_the_parent_are_both_done() -> None:
    """A round's place outlives the reading process's views while a batch the parent holds (DALI's)
    views it, and is taken again once that goes: rounds after rounds, many more than the area holds
    at once, all arrive in it."""
    with relayed(1 << 10, received=1 << 10) as r:
        got = r.comm.alltoallv([[b"A" * 300]])
        assert got is not None
        number, at = r.finder.place(got[0])
        r.parent_takes_news()
        held = r.parent.view(number, at, 300)  # a batch DALI still holds
        del got
        gc.collect()
        r.parent_takes_news()  # the reading process has forgotten the round
        for i in range(40):
            later = r.comm.alltoallv([[bytes([i]) * 300]])
            assert later is not None and r.finder.place(later[0])[0] != IN_BUFFER  # the area had room
            r.parent_takes_news()
            assert bytes(held) == b"A" * 300  # never written over
            del later
            gc.collect()
            r.parent_takes_news()
        del held
        gc.collect()
        full = r.comm.alltoallv([[b"B" * 1000]])  # the whole area: free only once the held place went
        assert full is not None and r.finder.place(full[0])[0] != IN_BUFFER


def test_a_round_that_finds_no_room_comes_through_the_connection_and_its_samples_through_the_buffer() -> None:
    with relayed(1 << 12, received=100) as r:
        got = r.comm.alltoallv([[b"C" * 101]])
        assert got is not None and bytes(got[0]) == b"C" * 101
        assert r.finder.place(got[0]) == (IN_BUFFER, 0)
        r.parent_takes_news()
        assert len(r.parent) == 0
