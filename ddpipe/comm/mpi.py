"""Collectives through mpi4py: the one module that imports it.

Small collectives, where ranks wait for each other to arrive, are posted non-blocking and polled
with short sleeps (a blocking MPI call spins, taking the core from the peer it waits for). Bulk
transfers, which start once every rank has arrived, are blocking calls (MPI progresses a transfer
only inside MPI calls, so sleeping between polls would stall it) under a watchdog thread. A rank
that dies makes the launcher end the job; a rank that hangs makes the others abort it, after the
timeout, or sooner, after ``silence`` seconds, if its host stops beating (:mod:`.heartbeat`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from .base import DEFAULT_TIMEOUT, Comm, Request, Segment, Watchdog, WhileWaiting, Written, pack_parts, segment_lengths
from .heartbeat import DEFAULT_SILENCE, Heartbeats
from .landing import LandingZone, zone_capacity
from .mpi_abort import abort_world
from .mpi_peers import MPIPeerLink
from .node_slots import NodeSlots, slot_capacity
from .world import World, available_cores

T = TypeVar("T")
# how a segment travels (an exchange header's fourth column)
_MPI, _SLOT, _OWN, _LANDED = 0, 1, 2, 3
_ZONE_MAX, _PAGE = 256 << 20, 4096  # a rank's landing zone at most (what a round sends to node peers, per round held)


class MPIComm(Comm):
    """Collectives through mpi4py, each under the watchdog's deadline.

    One thread issues a communicator's collectives at a time: the caller's thread this one's, and each
    loader's threads the loader's :meth:`channel`, so one watchdog deadline at a time suffices.
    """

    node_comm: Any  # this node's ranks (MPI_COMM_TYPE_SHARED)
    _node_ranks: list[int]
    _heartbeats: Heartbeats | None

    def __init__(self, mpi_comm: Any, timeout: float = DEFAULT_TIMEOUT, silence: float = DEFAULT_SILENCE, *,
                 parent: MPIComm | None = None) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = mpi_comm
        if parent is None:
            self._discover(mpi_comm, timeout, silence)
        else:  # a channel: the parent's world, heartbeats and clean-ups; exchange state of its own
            self._share(parent)
            self.node_comm = parent.node_comm.Dup()
            self._node_ranks = parent._node_ranks
            self._heartbeats = parent._heartbeats
        local = self.node_comm
        # a node's ranks exchange through shared send slots (node_slots.py); ranks alone on a node need none
        self._slots = NodeSlots(local, MPI) if local.Get_size() > 1 else None
        self._turn = 0  # exchanges so far: which of the two slots is this one's
        self._slots_full = False  # /dev/shm had no room for the slots to grow: no rank asks again
        self._local_of = {r: i for i, r in enumerate(self._node_ranks)}
        self._on_node = np.isin(np.arange(self.world.size), self._node_ranks)
        self._peer_link: MPIPeerLink | None = None
        # landing zones (landing.py), made with the slots' first growth, when rounds' sizes are known
        self._zone: LandingZone | None = None
        self._offers: dict[int, tuple[int, int]] = {}  # rank -> the place it offered this rank (start, bytes)
        self._landing: int | None = None  # where this rank's place for this round's landings starts
        self._next_landing: int | None = None
        self._largest_received = 0  # the largest segment a node peer has sent this rank
        self._room = 0  # bytes offered to each node peer
        self.landed_bytes = 0  # bytes received without a copy, through landing zones
        self._dog = Watchdog(self.timeout, lambda reason: self.abort(f"{reason}; aborting the job"), self._silent)

    def _discover(self, mpi_comm: Any, timeout: float, silence: float) -> None:
        """Who and where this rank is, its node's ranks and cores, and the job's heartbeats."""
        MPI = self._mpi
        rank = mpi_comm.Get_rank()
        local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        is_leader = local.Get_rank() == 0
        leaders = [r for r in mpi_comm.allgather(rank if is_leader else None) if r is not None]
        leader = local.bcast(rank if is_leader else None, root=0)
        _unname_node_segment()  # every rank has passed MPI_Init: all have mapped it
        # the node's cores: every core some rank of it may run on (ranks bound to cores each see theirs)
        cores = len(set().union(*local.allgather(_affinity())))
        world = World(rank=rank, size=mpi_comm.Get_size(), local_rank=local.Get_rank(),
                      local_size=local.Get_size(), node=leaders.index(leader), num_nodes=len(leaders),
                      cores=cores)
        self.node_comm = local
        self._node_ranks = [int(r) for r in local.allgather(rank)]
        super().__init__(world, timeout)
        hosts = [str(h) for h in mpi_comm.allgather(socket.gethostname())]
        self._heartbeats = Heartbeats(mpi_comm.Dup(), hosts, silence) if self.world.size > 1 else None

    def channel(self) -> MPIComm:
        return self if self.world.size == 1 else MPIComm(self._comm.Dup(), parent=self)

    def _silent(self) -> str | None:
        return None if self._heartbeats is None else self._heartbeats.silent()

    def abort(self, message: str) -> None:
        print(f"ddpipe: rank {self.world.rank}: {message}", file=sys.stderr, flush=True)
        abort_world(self._mpi.COMM_WORLD, 1)

    def node_ranks(self) -> list[int]:
        return list(self._node_ranks)

    def end_job(self, code: int) -> None:
        self._clean_up()
        abort_world(self._mpi.COMM_WORLD, code)  # the launcher ends every rank

    def gradient_channel(self) -> MPIGradientChannel:
        # a watchdog of its own: the loader's producer thread arms this communicator's at the same time
        dog = Watchdog(self.timeout, lambda reason: self.abort(f"{reason}; aborting the job"), self._silent)
        return MPIGradientChannel(self._comm.Dup(), self._mpi, dog)

    def peer_link(self) -> MPIPeerLink:
        if self._peer_link is None:
            self._peer_link = MPIPeerLink(self._comm.Dup(), self._mpi)
        return self._peer_link

    def _arrive(self, request: Any, what: str, while_waiting: WhileWaiting | None = None) -> None:
        """Wait for a small collective, doing ``while_waiting``'s steps or else sleeping between polls,
        until the deadline."""
        deadline = time.monotonic() + self.timeout
        delay = 2e-5
        while not request.Test():
            if (reason := self._dog.overdue(what, deadline)) is not None:
                self.abort(f"{reason}; aborting the job")
            if while_waiting is not None:
                if while_waiting():
                    continue
                while_waiting = None
            time.sleep(delay)
            delay = min(delay * 1.5, 1e-3)

    def barrier(self) -> None:
        self._arrive(self._comm.Ibarrier(), "barrier")

    def allgather(self, value: T) -> list[T]:
        payload = pickle.dumps(value)
        parts = self._allgatherv(payload, "allgather")
        return [pickle.loads(p) for p in parts]

    def _allgatherv(self, payload: bytes, what: str) -> list[bytes]:
        size = self.world.size
        sizes = np.zeros(size, dtype=np.int64)
        displs = np.zeros(size, dtype=np.int64)
        self._arrive(self._comm.Iallgather(np.array([len(payload)], dtype=np.int64), sizes), what)
        with self._dog.watch(what):
            displs[1:] = np.cumsum(sizes)[:-1]
            out = np.empty(int(sizes.sum()), dtype=np.uint8)
            send = np.frombuffer(payload, dtype=np.uint8)
            self._comm.Allgatherv(send, [out, (sizes.tolist(), displs.tolist()), self._mpi.BYTE])
        return [out[d : d + s].tobytes() for d, s in zip(displs.tolist(), sizes.tolist(), strict=True)]

    def places(self) -> dict[int, memoryview]:
        zone = self._zone
        if zone is None:
            return {}
        return {d: zone.peer(self._local_of[d])[start : start + room].data for d, (start, room) in self._offers.items()}

    def alltoallv(self, segments: Sequence[Segment], what: str = "exchange", wanted: bool = True,
                  hold: int = 2, while_waiting: WhileWaiting | None = None) -> list[memoryview] | None:
        """Segments for this node's ranks go straight to the place their receiver offered in its landing
        zone (:mod:`ddpipe.comm.landing`) or, larger than that, into this rank's send slot, for their
        receivers to copy out (:mod:`ddpipe.comm.node_slots`); the rest go through ``Alltoallv``."""
        t0 = time.perf_counter()
        size, me, slots, turn = self.world.size, self.world.rank, self._slots, self._turn
        lengths = segment_lengths(segments, size)
        peer = self._on_node & (lengths > 0)
        peer[me] = False
        # to each rank: its segment's size, whether this rank wants the round, where in this rank's
        # slot or the receiver's landing zone it lies (-1: none), how it travels (_MPI, _SLOT, _OWN,
        # _LANDED), the slot size this rank asks for, whether this rank sends through MPI (if no rank
        # does, none calls Alltoallv), and the place this rank offers it for the next round (start, bytes)
        header = np.zeros((size, 8), dtype=np.int64)
        header[:, 0], header[:, 1], header[:, 2], header[:, 3] = lengths, int(wanted), -1, _MPI
        zone = self._zone
        if zone is not None:
            self._land(zone, segments, lengths, peer, header)
        need = int(lengths[peer].sum())
        if slots is not None and 0 < need <= slots.capacity:
            slot = slots.slot(self.world.local_rank, turn)
            at = 0
            for d in np.flatnonzero(peer).tolist():
                header[d, 2], header[d, 3] = at, _SLOT
                pack_parts(segments[d], slot[at : at + lengths[d]])
                at += int(lengths[d])
            slots.sync()  # the slot's bytes, visible before the header that points at them
        elif slots is not None and need > 0 and not self._slots_full:
            header[:, 4] = need
        header[me, 3] = _OWN
        via_mpi = (header[:, 3] == _MPI) & (lengths > 0)
        header[:, 5] = int(via_mpi.any())
        incoming = np.zeros((size, 8), dtype=np.int64)
        self.transfer_seconds += time.perf_counter() - t0  # the packing is part of moving the bytes
        self._arrive(self._comm.Ialltoall(header, incoming), what, while_waiting)
        self._turn += 1
        landing, self._landing = self._landing, self._next_landing
        for source in np.flatnonzero(incoming[:, 7] > 0).tolist():
            self._offers[source] = (int(incoming[source, 6]), int(incoming[source, 7]))
        if not incoming[:, 1].any():
            if landing is not None and zone is not None:
                zone.places.free(landing)
            return None
        recv_sizes = incoming[:, 0]
        landed = (incoming[:, 3] == _LANDED) & (recv_sizes > 0)
        copied = np.where(landed, 0, recv_sizes)
        recv_displs = np.concatenate([[0], np.cumsum(copied)[:-1]])
        with self._dog.watch(what):
            t0 = time.perf_counter()
            # memory the allocator kept from earlier rounds (keep_freed_memory): no page faults
            rbuf = np.empty(int(copied.sum()), dtype=np.uint8)
            if incoming[:, 5].any():
                self._alltoallv_rest(segments, lengths, via_mpi, incoming, rbuf, recv_displs)
            pack_parts(segments[me], rbuf[recv_displs[me] : recv_displs[me] + lengths[me]])
            if slots is not None:
                slots.sync()
                for source in np.flatnonzero((incoming[:, 3] == _SLOT) & (recv_sizes > 0)).tolist():
                    at, n, d = int(incoming[source, 2]), int(recv_sizes[source]), int(recv_displs[source])
                    rbuf[d : d + n] = slots.slot(self._local_of[source], turn)[at : at + n]
                self._largest_received = max(self._largest_received, int(recv_sizes[self._on_node].max(initial=0)))
                ask = int(incoming[self._on_node, 4].max())
                if ask > 0:  # the same on every rank of the node: each saw every one's header
                    self._grow(slots, ask + ask // 4, hold)
            self.transfer_seconds += time.perf_counter() - t0
        view = rbuf.data  # no copy: callers unpack straight from the receive buffer
        out = [view[d : d + s] for d, s in zip(recv_displs.tolist(), copied.tolist(), strict=True)]
        if landing is not None and zone is not None:
            self._take_landed(zone, landing, landed, incoming, out)
        return out

    def _grow(self, slots: NodeSlots, capacity: int, hold: int) -> None:
        """Grow the node's slots to ``capacity`` bytes, collectively over its ranks, and make the
        landing zones with their first growth. Where ``/dev/shm`` has no room for them, they stay as
        they are and no rank asks again: rounds that do not fit go through MPI."""
        # every rank of the node must take the same size: the least room any of them sees. Waited for as
        # the round's other collectives are (_arrive), not with mpi4py's pickling allreduce: that one kept
        # the interpreter lock while it waited, so this rank's stager thread could not copy the shard a
        # node peer was waiting for before it joined: the job hung (about 1 run in 10 of a 4-rank test)
        mine = np.array([slot_capacity(capacity, len(self._node_ranks))], dtype=np.int64)
        least = np.empty_like(mine)
        self._arrive(self.node_comm.Iallreduce(mine, least, op=self._mpi.MIN), "growing the node's exchange slots")
        capacity = int(least[0])
        if capacity == 0:
            self._slots_full = True
            return
        slots.grow(capacity)
        if self._zone is None:
            # room for the rounds the caller holds (the next among them) and two spare (at an epoch's
            # start the last batch of the one before may still hold its rounds), in places as _offer
            # makes them, with room for segments to grow as rounds go on
            per_round = _room_for(self._largest_received * 5 // 4) * (len(self._node_ranks) - 1)
            asked = min((hold + 2) * per_round, _ZONE_MAX)
            zone_bytes = zone_capacity(asked, per_round, len(self._node_ranks))
            self._zone = LandingZone(self.node_comm, self._mpi, zone_bytes)  # collective: 0 bytes too

    def _land(self, zone: LandingZone, segments: Sequence[Segment], lengths: np.ndarray, peer: np.ndarray,
              header: np.ndarray) -> None:
        """Pack each node peer's segment into the place it offered, where it fits and is not there
        already (clearing it from ``peer``, the segments left for the slots), and make this round's
        offers."""
        for d in np.flatnonzero(peer).tolist():
            start, room = self._offers.get(d, (0, 0))
            if lengths[d] <= room:
                if not isinstance(segments[d], Written):
                    pack_parts(segments[d], zone.peer(self._local_of[d])[start : start + lengths[d]])
                header[d, 2], header[d, 3] = start, _LANDED
                peer[d] = False
        self._offers.clear()  # an offer holds for one round
        self._offer(zone, header)
        zone.sync()  # the bytes landed, visible before the header that points at them

    def _take_landed(self, zone: LandingZone, landing: int, landed: np.ndarray, incoming: np.ndarray,
                     out: list[memoryview]) -> None:
        """Put views of what landed in this round's place into ``out``; free the place if nothing did."""
        if not landed.any():
            zone.places.free(landing)
            return
        zone.sync()
        place = zone.place(landing)  # freed once every view of what landed there has died
        for source in np.flatnonzero(landed).tolist():
            at, n = int(incoming[source, 2]) - landing, int(incoming[source, 0])
            out[source] = place[at : at + n]
        self.landed_bytes += int(incoming[landed, 0].sum())

    def _offer(self, zone: LandingZone, header: np.ndarray) -> None:
        """Offer each node peer a place in this rank's zone for its segment of the next round: a
        quarter more than the largest segment a node peer has sent here, and the same from round to
        round until a segment outgrows it (so that a peer writes to the same parts of this zone, page
        for page); none before the first round, or while the zone has no room."""
        self._next_landing = None
        if self._largest_received > self._room:
            self._room = _room_for(self._largest_received)
        if self._room == 0:
            return
        sources = [r for r in self._node_ranks if r != self.world.rank]
        start = zone.places.take(self._room * len(sources))
        if start is None:
            return
        for k, source in enumerate(sources):
            header[source, 6], header[source, 7] = start + k * self._room, self._room
        self._next_landing = start

    def _alltoallv_rest(self, segments: Sequence[Segment], lengths: np.ndarray, via_mpi: np.ndarray,
                        incoming: np.ndarray, rbuf: np.ndarray, recv_displs: np.ndarray) -> None:
        """The segments that travel through MPI (between nodes, or a round that outgrew the slots)."""
        send_counts = np.where(via_mpi, lengths, 0)
        send_displs = np.concatenate([[0], np.cumsum(send_counts)[:-1]])
        sbuf = self._send_buffer(int(send_counts.sum()))
        for d in np.flatnonzero(via_mpi).tolist():
            pack_parts(segments[d], sbuf[send_displs[d] : send_displs[d] + send_counts[d]])
        recv_counts = np.where(incoming[:, 3] == _MPI, incoming[:, 0], 0)
        self._comm.Alltoallv([sbuf, (send_counts.tolist(), send_displs.tolist()), self._mpi.BYTE],
                             [rbuf, (recv_counts.tolist(), recv_displs.tolist()), self._mpi.BYTE])


class MPIGradientChannel:
    """A communicator of its own for gradient averaging: the loader exchanges samples on another,
    in another thread, at the same time."""

    def __init__(self, mpi_comm: Any, mpi: Any, dog: Watchdog) -> None:
        self._comm, self._mpi, self._dog = mpi_comm, mpi, dog
        self.size: int = mpi_comm.Get_size()

    def iallreduce_sum(self, buffer: np.ndarray) -> Request:
        return _Watched(self._comm.Iallreduce(self._mpi.IN_PLACE, buffer, op=self._mpi.SUM), self._dog,
                        "gradient allreduce")

    def broadcast(self, buffer: np.ndarray) -> None:
        with self._dog.watch("broadcast"):
            self._comm.Bcast(buffer, root=0)

    def free(self) -> None:
        self._comm.Free()


class _Watched:
    """A request whose wait is under a watchdog: a peer that hangs or goes silent ends the job."""

    def __init__(self, request: Any, dog: Watchdog, what: str) -> None:
        self._request, self._dog, self._what = request, dog, what

    def Wait(self) -> Any:  # mpi4py's name
        with self._dog.watch(self._what):
            return self._request.Wait()


def _room_for(largest: int) -> int:
    """The place offered to each node peer: a quarter more than the largest segment received, in
    pages (places start page-aligned), and at least one page."""
    return max(-(-int(largest * 1.25) // _PAGE), 1) * _PAGE


def world_comm(timeout: float, silence: float = DEFAULT_SILENCE) -> MPIComm:
    """A communicator of ddpipe's own over the whole MPI job."""
    from mpi4py import MPI

    # our own: the training script may run collectives on COMM_WORLD at the same time
    return MPIComm(MPI.COMM_WORLD.Dup(), timeout, silence)


def _unname_node_segment() -> None:
    """Remove the name of MPICH's shared-memory segment for this node once every rank maps it (the
    mappings live on): an aborted job, whose ranks the launcher kills outright, left it in /dev/shm."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/dev/shm/mpich_shm_" in line}
    except OSError:
        return
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(available_cores()))
