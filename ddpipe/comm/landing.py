"""Landing zones: each rank's receive memory, in a window shared by its node's ranks, so that a
node peer writes a round's segment straight to where the receiver will read it.

Without them a segment between two ranks of a node is copied twice: by its sender into its send
slot (:mod:`ddpipe.comm.node_slots`) and by its receiver out of the slot into a buffer of its own,
which the received samples stay views of. With them, each rank offers each node peer, in the
header of round j, a place in its own zone for that peer's segment of round j + 1; the sender packs
its samples there, straight from the shards they were read from, and the receiver hands out views
of its zone: one copy instead of two. A segment larger than the place offered goes through the
slots, as before.

The receiver alone decides when its memory is free again: a round's place lives as long as any
view of it does (the samples a shuffle buffer holds), in its own process, so no lifetime crosses
processes. Places are taken lowest first (:class:`Places`), and a zone with no room offers
nothing (that round goes through the slots). The window is never freed while the process runs:
views of it may live as long as the caller keeps them.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any

import numpy as np

from ..memory import shared_memory_left


def zone_capacity(wanted: int, one_round: int, local_ranks: int) -> int:
    """The bytes a rank's zone takes: ``wanted``, but at most its share of half the shared memory
    left (MPICH backs shared windows with ``/dev/shm``, which a container may keep small: pages
    touched beyond it end the process with SIGBUS); none if that is less than ``one_round``."""
    free = shared_memory_left()
    if free is None:
        return wanted
    capacity = min(wanted, free // (2 * local_ranks))
    return capacity if capacity >= one_round else 0


class Places:
    """A zone of ``capacity`` bytes handed out as places, each taken at the lowest start where it
    fits and freed on its own (in any order, from any thread). Lowest first, so that the zone's
    first pages serve over and over: a place further on is memory touched for the first time, page
    faults in the receiver and in every sender that writes there (places taken in turn round the
    zone brought a fresh one into every epoch of 8 ranks until the turn came round)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._taken: dict[int, int] = {}  # start -> stop of each place held
        self._freed: deque[int] = deque()  # starts of places freed since the last take

    def take(self, nbytes: int) -> int | None:
        """The start of a free place of ``nbytes``, now taken; None if the zone has no room."""
        while self._freed:
            self._taken.pop(self._freed.popleft(), None)
        if nbytes <= 0 or nbytes > self.capacity:
            return None
        start = 0
        for begin, stop in sorted(self._taken.items()):
            if start + nbytes <= begin:
                break
            start = max(start, stop)
        if start + nbytes > self.capacity:
            return None
        self._taken[start] = start + nbytes
        return start

    def stop(self, start: int) -> int:
        """Where the place taken at ``start`` ends."""
        return self._taken[start]

    def free(self, start: int) -> None:
        """Free the place taken at ``start``. Safe from any thread (an append, collected at the next take)."""
        self._freed.append(start)


class LandingZone:
    """This rank's zone and its node peers' zones, as this process maps them, in one MPI
    shared-memory window over the node's ranks, ``capacity`` bytes each."""

    def __init__(self, node_comm: Any, mpi: Any, capacity: int) -> None:
        self.places = Places(capacity)
        self._win = mpi.Win.Allocate_shared(capacity, 1, comm=node_comm)
        self._win.Lock_all(mpi.MODE_NOCHECK)  # one passive epoch for the window's life, as the slots'
        self._zones = [np.frombuffer(self._win.Shared_query(r)[0], dtype=np.uint8)
                       for r in range(node_comm.Get_size())]
        self._mine = self._zones[node_comm.Get_rank()]

    def peer(self, local_rank: int) -> np.ndarray:
        """The zone of node rank ``local_rank``, to write what it offered into."""
        return self._zones[local_rank]

    def place(self, start: int) -> memoryview:
        """The place taken at ``start`` in this rank's zone, freed when its last view dies."""
        array: np.ndarray = self._mine[start : self.places.stop(start)]
        weakref.finalize(array, self.places.free, start)
        return array.data  # a view of ``array``: it, and every slice of it, keeps the place taken

    def sync(self) -> None:
        """Make this rank's writes to the zones visible to its node peers, and theirs to it."""
        self._win.Sync()
