"""Send slots in memory shared by a node's ranks: how an exchange round's bytes reach the other
ranks of the same node without MPI moving them.

A rank packs the segments of a round into its own slot; once the round's header (sizes, offsets)
has reached every rank, each rank copies the segments meant for it straight out of its node
peers' slots. Through ``MPI_Alltoallv`` the same bytes are copied by the kernel (CMA) while both
ranks are inside the call: a rank whose peer is not yet scheduled spins until it is, which on a
node with more ranks than free cores took the core the peer was waiting for (benchmarks/exchange.py).
Here nothing waits but the header, which ranks poll with sleeps. A segment that fits the place its
receiver offered in its landing zone goes there instead (:mod:`ddpipe.comm.landing`): one copy, not
two; the slots carry the rest.

Two slots per rank, used in turn: a rank writes round j + 2 into the slot of round j only after
round j + 1's header has reached it from every rank, which each rank sends only after copying out
round j. Slots grow when a round does not fit, for all of a node's ranks at once after a round in
which one asked (every rank sees every rank's header), since a shared window is made collectively;
a round that does not fit goes through MPI meanwhile. MPICH backs shared windows with ``/dev/shm``,
which containers often keep small (Docker's default is 64 MB) and where a page touched beyond its
room ends the process with SIGBUS: the slots take at most a quarter of the room left there, and
where that is too little they stay as they are and MPI carries the rounds that do not fit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..memory import shared_memory_left


def slot_capacity(wanted: int, local_ranks: int) -> int:
    """``wanted`` bytes per slot if the node's slots (two per rank) fit in a quarter of the room left
    in /dev/shm, else 0."""
    free = shared_memory_left()
    return wanted if free is None or 2 * wanted * local_ranks <= free // 4 else 0


class NodeSlots:
    """Two send slots per rank in one MPI shared-memory window over the node's ranks."""

    def __init__(self, node_comm: Any, mpi: Any) -> None:
        self._node, self._mpi = node_comm, mpi
        self.capacity = 0  # bytes per slot, the same on every rank of the node
        self._win: Any = None
        self._views: list[np.ndarray] = []  # each node rank's window, as this process maps it

    def slot(self, local_rank: int, turn: int) -> np.ndarray:
        """Slot ``turn % 2`` of the node rank ``local_rank`` (this rank's own to write, a peer's to read)."""
        start = (turn % 2) * self.capacity
        return self._views[local_rank][start : start + self.capacity]

    def grow(self, capacity: int) -> None:
        """Make every slot of the node ``capacity`` bytes: collective over the node's ranks, each of
        which must have copied out everything it needs from the current slots."""
        if self._win is not None:
            self._win.Unlock_all()
            self._win.Free()
        self._win = self._mpi.Win.Allocate_shared(2 * capacity, 1, comm=self._node)
        # one passive epoch for the window's life: Sync orders the writes and reads around each header
        self._win.Lock_all(self._mpi.MODE_NOCHECK)
        self._views = [np.frombuffer(self._win.Shared_query(r)[0], dtype=np.uint8)
                       for r in range(self._node.Get_size())]
        self.capacity = capacity

    def sync(self) -> None:
        """Make this rank's writes to its slots visible to its node peers, and theirs to it."""
        if self._win is not None:
            self._win.Sync()
