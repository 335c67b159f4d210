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
processes. Places are taken in turn from a ring (:class:`PlaceRing`); one still held blocks the
ring behind it, and a zone with no room offers nothing (that round goes through the slots). The
window is never freed while the process runs: views of it may live as long as the caller keeps them.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any

import numpy as np


class PlaceRing:
    """Places of ``capacity`` bytes taken in turn, oldest first, each freed on its own (in any
    order, from any thread); space comes back once every place taken before it is free too."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._taken: deque[list[int]] = deque()  # [start, stop, freed] of each place, oldest first
        self._freed: deque[int] = deque()  # starts of places freed since the last take

    def take(self, nbytes: int) -> int | None:
        """The start of a free place of ``nbytes``, now taken; None if the ring has no room."""
        self._collect()
        if nbytes <= 0 or nbytes > self.capacity:
            return None
        if not self._taken:
            start = 0
        else:
            oldest, newest = self._taken[0][0], self._taken[-1]
            if newest[0] >= oldest:  # free: after the newest place, and before the oldest
                start = newest[1] if newest[1] + nbytes <= self.capacity else 0
                if start == 0 and nbytes > oldest:
                    return None
            elif newest[1] + nbytes <= oldest:  # wrapped: free only between the newest and the oldest
                start = newest[1]
            else:
                return None
        self._taken.append([start, start + nbytes, 0])
        return start

    def stop(self, start: int) -> int:
        """Where the place taken at ``start`` ends."""
        for entry in self._taken:
            if entry[0] == start and not entry[2]:
                return entry[1]
        raise KeyError(start)

    def free(self, start: int) -> None:
        """Free the place taken at ``start``. Safe from any thread (an append, collected at the next take)."""
        self._freed.append(start)

    def _collect(self) -> None:
        while self._freed:
            start = self._freed.popleft()
            for entry in self._taken:
                if entry[0] == start and not entry[2]:
                    entry[2] = 1
                    break
        while self._taken and self._taken[0][2]:
            self._taken.popleft()


class LandingZone:
    """This rank's zone and its node peers' zones, as this process maps them, in one MPI
    shared-memory window over the node's ranks, ``capacity`` bytes each."""

    def __init__(self, node_comm: Any, mpi: Any, capacity: int) -> None:
        self.ring = PlaceRing(capacity)
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
        array: np.ndarray = self._mine[start : self.ring.stop(start)]
        weakref.finalize(array, self.ring.free, start)
        return array.data  # a view of ``array``: it, and every slice of it, keeps the place taken

    def sync(self) -> None:
        """Make this rank's writes to the zones visible to its node peers, and theirs to it."""
        self._win.Sync()
