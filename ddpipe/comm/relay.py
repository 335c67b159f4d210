"""Collectives issued in a reading process (:mod:`ddpipe.read_process`) and carried out by its
parent on the job's communicator.

A process the launcher did not start is no rank of the job, and MPI cannot take it in (spawning
into a job is what Slurm's PMI and most launchers leave out). So the reading process's stream runs
its exchange rounds through :class:`RelayedComm`: each round's segments are packed, back to back,
into memory both processes map (the sent area); the parent's relay thread (:func:`serve_collectives`)
hands them to its own communicator's ``alltoallv``, which does what it does in a rank's producer
thread, and copies what the round received into a place of its own in a second shared area (the
received area, :class:`ReceivedRounds`). The reading process's samples stay views of that place,
and go on to the parent as places in it (:mod:`ddpipe.shard_places`), which DALI reads there: one
copy of each received sample, where copying it out of the area, then into the batches' buffer, made
three. A place is taken again only once the reading process has forgotten it (no view of it left
there) and the parent's last view of it has gone (DALI has read the batches that use it). A round
that finds no room travels through the connection instead, and its samples through the buffer.

The parent's thread waits in the collective as a rank's producer thread would (MPI's waits and
NumPy's copies let go of the interpreter lock); the reading process reads the next round while it
waits for its answer, as the exchange does in a rank's own thread. The job's watchdog stays the
parent's: a round that hangs ends the job from there; a parent that goes closes the connection,
which ends the reading process.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import numpy as np

from ..errors import DdpipeError
from .base import Comm, Segment, WhileWaiting, pack_parts, segment_lengths, split_views
from .landing import Places
from .world import World

T = TypeVar("T")
# how often a reading process with nothing to read ahead looks whether its answer came (it only waits
# on the connection, which the kernel closes when the parent goes)
_ANSWER_POLL_S = 1.0


def area_bytes(round_size: int, mean_sample_bytes: float) -> int:
    """The sent area's size: one round of this rank's reads, sent whole, with room for rounds larger
    than the mean (memory is only taken as it is written)."""
    return max(1 << 20, int(1.25 * round_size * mean_sample_bytes))


def received_area_bytes(area: int, batches_bytes: int) -> int:
    """The received area's size: room for the rounds whose samples the reading process's shuffle
    buffer holds and those of the batches on their way through DALI: what the batches' buffer holds
    (``batches_bytes``), and two rounds of reads more (two ranks at the defaults, tar: the places
    held at once reached 107 MB of the 510 this gave). Places are taken lowest first: memory is
    taken only as far as they reach, and a round that finds no room goes through the connection."""
    return 2 * area + batches_bytes


class ReceivedRounds:
    """The parent's side of the received area: each round's place in it, taken by the relay thread,
    held for the reading process until it forgets the round (:meth:`claim`, then the caller's
    references), and free once the last view of it goes too."""

    def __init__(self, area: memoryview) -> None:
        self.area = np.frombuffer(area, dtype=np.uint8)
        self.places = Places(len(area))
        self._held: dict[int, np.ndarray] = {}  # start -> the place, for the reading process (not claimed yet)

    def take(self, nbytes: int) -> tuple[int, np.ndarray] | None:
        """The start of a place of ``nbytes`` for a round, and the place, held until claimed; None if
        the area has no room now."""
        start = self.places.take(nbytes)
        if start is None:
            return None
        place: np.ndarray = self.area[start : start + nbytes]
        weakref.finalize(place, self.places.free, start)
        self._held[start] = place
        return start, place

    def claim(self, start: int) -> memoryview:
        """The place taken at ``start``, the reading process's hold on it now the caller's."""
        try:
            return self._held.pop(start).data
        except KeyError:
            raise DdpipeError(f"reading process: no round was received at {start} of the received area") from None


class RelayedComm(Comm):
    """A reading process's collectives, carried out by its parent: ``conn`` is the relay connection,
    ``sent`` and ``received`` the shared areas (mappings of the same memory as the parent's);
    ``node_ranks``: the parent's :meth:`Comm.node_ranks`. ``on_round(place, start)`` hears of each
    round received into the received area, ``place`` the view of it its samples are views of."""

    def __init__(self, world: World, node_ranks: list[int], conn: Connection, sent: memoryview,
                 received: memoryview, on_round: Callable[[np.ndarray, int], None]) -> None:
        super().__init__(world)
        self._node_ranks = node_ranks
        self._conn = conn
        self._sent = np.frombuffer(sent, dtype=np.uint8)
        self._received = np.frombuffer(received, dtype=np.uint8)
        self._on_round = on_round

    def _answer(self, while_waiting: WhileWaiting | None = None) -> Any:
        """The parent's answer, doing ``while_waiting``'s steps until it comes."""
        while not self._conn.poll(0 if while_waiting is not None else _ANSWER_POLL_S):
            if while_waiting is not None and not while_waiting():
                while_waiting = None
        answer = self._conn.recv()
        if answer[0] == "error":
            raise answer[1]
        return answer[1:]

    def node_ranks(self) -> list[int]:
        return list(self._node_ranks)

    def allgather(self, value: T) -> list[T]:
        self._conn.send(("allgather", value))
        gathered: list[T] = self._answer()[0]
        return gathered

    def barrier(self) -> None:
        self._conn.send(("barrier",))
        self._answer()

    def alltoallv(self, segments: Sequence[Segment], what: str = "exchange", wanted: bool = True,
                  hold: int = 2, while_waiting: WhileWaiting | None = None) -> list[memoryview] | None:
        t0 = time.perf_counter()
        lengths = segment_lengths(segments, self.world.size)
        total = int(lengths.sum())
        inline = total > len(self._sent)
        out = np.empty(total, dtype=np.uint8) if inline else self._sent[:total]
        at = 0
        for segment, n in zip(segments, lengths.tolist(), strict=True):
            pack_parts(segment, out[at : at + n])
            at += n
        self._conn.send(("alltoallv", lengths, what, wanted, hold, inline))
        if inline:
            self._conn.send_bytes(out.data)
        self.transfer_seconds += time.perf_counter() - t0
        sizes, start, moved = self._answer(while_waiting)
        if sizes is None:  # no rank wanted the round
            return None
        t0 = time.perf_counter()
        if start is None:  # no room in the received area: it came through the connection
            got = np.frombuffer(self._conn.recv_bytes(), dtype=np.uint8)
        else:  # its own place, kept as long as a view of it is (the shuffle buffer's samples)
            got = self._received[start : start + int(sizes.sum())]
            self._on_round(got, start)
        self.transfer_seconds += moved + time.perf_counter() - t0
        return split_views(got.data, sizes)


def serve_collectives(conn: Connection, comm: Comm, sent: memoryview, received: ReceivedRounds) -> None:
    """The parent's relay: carry out the reading process's collectives on ``comm`` until the
    connection closes, then close it. An error (a round the plan did not expect, say) goes back to
    be raised there."""
    with conn:
        _serve(conn, comm, sent, received)


def _serve(conn: Connection, comm: Comm, sent: memoryview, received: ReceivedRounds) -> None:
    sent_area = np.frombuffer(sent, dtype=np.uint8)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if message[0] == "allgather":
                conn.send(("ok", comm.allgather(message[1])))
            elif message[0] == "barrier":
                comm.barrier()
                conn.send(("ok",))
            else:
                _relay_alltoallv(conn, comm, message, sent_area, received)
        except (EOFError, OSError):
            return
        except Exception as e:  # raised in the reading process, which sends it on to the caller
            try:
                conn.send(("error", e))
            except OSError:
                return


def _relay_alltoallv(conn: Connection, comm: Comm, message: tuple[Any, ...], sent_area: np.ndarray,
                     received: ReceivedRounds) -> None:
    _, lengths, what, wanted, hold, inline = message
    packed = np.frombuffer(conn.recv_bytes(), dtype=np.uint8) if inline else sent_area
    segments: list[Segment] = [[view] for view in split_views(packed.data, lengths)]
    moved = comm.transfer_seconds
    got = comm.alltoallv(segments, what, wanted=wanted, hold=hold)
    del segments, packed
    if got is None:
        conn.send(("ok", None, False, 0.0))
        return
    t0 = time.perf_counter()
    sizes = np.array([len(g) for g in got], dtype=np.int64)
    total = int(sizes.sum())
    taken = received.take(total)
    start, out = taken if taken is not None else (None, np.empty(total, dtype=np.uint8))
    pack_parts(got, out)
    del got, taken  # the round's receive memory (a landing place) goes back now
    moved = comm.transfer_seconds - moved + time.perf_counter() - t0
    conn.send(("ok", sizes, start, moved))
    if start is None:
        conn.send_bytes(out.data)


def start_relay(conn: Connection, comm: Comm, sent: memoryview, received: ReceivedRounds) -> threading.Thread:
    """:func:`serve_collectives` on a thread of its own, which ends with the connection."""
    thread = threading.Thread(target=serve_collectives, args=(conn, comm, sent, received), daemon=True,
                              name=f"ddpipe-relay-{comm.world.rank}")
    thread.start()
    return thread
