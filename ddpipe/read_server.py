"""The reading process itself (:mod:`ddpipe.read_process` starts it, running :func:`main`): it
rebuilds its parent's encoded stream and serves the epochs it is asked for, each batch's images
handed on as their places in their shard files or in the rounds the relay received
(:mod:`ddpipe.shard_places`), or written into the buffer both map (:class:`_Ring`)."""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import sys
import threading
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np

from .comm.base import pack_parts
from .epoch_ahead import READ_AHEAD_BATCHES, likely_next, may_read_ahead, serves
from .errors import DdpipeError, NoBatchWarning
from .shard_places import IN_BUFFER, PlaceFinder
from .workers import leave_signals_to_parent

if TYPE_CHECKING:
    from .decode.batches import EncodedBatch
    from .loader_stats import SkippedSample
    from .loop import Loop
    from .read_process import StreamSpec
    from .sample import SampleBatch

# how long a batch waits for room in the buffer, with no release arriving, before it goes through the
# connection instead (releases arrive a batch's decoding apart)
WAIT_FOR_ROOM_S = 0.5


class _Ring:
    """The child's side of the shared buffer: batches written back to back, in order, each freed
    once the parent has released it (or everything, when the parent says so)."""

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.size = len(buf)
        self.live: deque[tuple[int, int, int]] = deque()  # (seq, start, end) not yet released

    def release(self, upto: int | None) -> None:
        while self.live and (upto is None or self.live[0][0] <= upto):
            self.live.popleft()

    def place(self, nbytes: int) -> int | None:
        """Where ``nbytes`` (more than 0) fit now, or None until more is released. The live batches
        run from the oldest's start (head) round to the newest's end (tail)."""
        if not self.live:
            return 0 if nbytes <= self.size else None
        head, tail = self.live[0][1], self.live[-1][2]
        if tail > head:  # free: from the tail to the end, then from the start to the head
            if tail + nbytes <= self.size:
                return tail
            return 0 if nbytes <= head else None
        return tail if tail + nbytes <= head else None  # wrapped: free between the tail and the head


def _when_closed(conn: Connection, then: Callable[[], None]) -> None:
    """Call ``then()`` once the other end of ``conn`` has closed (reading nothing from it)."""
    watch = select.poll()
    watch.register(conn.fileno(), select.POLLRDHUP)
    while not any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, events in watch.poll()):
        pass
    then()


@dataclass
class _ReadAhead:
    """An epoch's first batches, read before the parent asks for it (:meth:`_Server.read_ahead`)."""

    seed: int
    epoch: int
    batches: Loop[SampleBatch]  # the stream's, after those held
    held: list[tuple[EncodedBatch, list[SkippedSample]]]  # prepared, each with the samples it left out
    error: Exception | None  # what reading the next one raised

    def serves(self, seed: int, epoch: int, pending: np.ndarray | None) -> bool:
        return serves((self.seed, self.epoch), seed, epoch, pending)


class _Stopped(Exception):
    """The parent left the epoch early."""


class _Server:
    """The reading process: serves epochs until its connection closes."""

    def __init__(self, conn: Connection, ring: memoryview, relay: tuple[Connection, memoryview, memoryview] | None
                 ) -> None:
        from .comm import Comm
        from .comm.relay import RelayedComm
        from .decode.batches import KnownSizes
        from .memory import EpochMemory, keep_freed_memory
        from .staging import NodeStager
        from .stream import EncodedStream

        self.conn = conn
        spec: StreamSpec = conn.recv()
        self.places = PlaceFinder(conn, os.getppid())
        comm = Comm(spec.world) if relay is None else RelayedComm(spec.world, spec.node_ranks, *relay,
                                                                  on_round=self.places.received_round)
        if spec.tune_allocator:  # samples of ~100 KB made and freed by the thousand (memory.py)
            keep_freed_memory()
            comm.allocator = EpochMemory()
        # a dataset in a store fetches its shards into a scratch directory of this process's own. Made on a
        # communicator of no collectives: the parent's stream made the job-wide checks, and a collective here
        # would hold each rank's first batch until every rank's reading process had started; the relay then
        # carries the epochs' collectives
        self.stream = EncodedStream(spec.dataset, plan=spec.plan, read=spec.read, seed=spec.seed,
                                    comm=Comm(spec.world))
        self.stream.comm = comm
        if spec.stage is not None:  # the node's copies, made by the training processes, read from here
            stager = self.stream.stager = NodeStager(spec.dataset, spec.stage, comm, copies=False)
            # a read waiting for a copy waits on no connection: it stops when the parent's goes
            threading.Thread(target=_when_closed, args=(conn, stager.close), daemon=True,
                             name="ddpipe-parent-watch").start()
        self.stream.views = True  # each sample handed on as its place in its shard, or copied once into the buffer
        self.decode = spec.decode
        self.sizes = KnownSizes()  # each image's, read once for every epoch
        self.ring = _Ring(ring)
        self.ring_bytes = np.frombuffer(ring, dtype=np.uint8)
        self.seq = 0  # every batch sent, over every epoch: what releases count in
        self.skipped: list[SkippedSample] = []  # left out since the last batch sent
        # the next epoch's first batches read as the last one ends (epoch_ahead.py)
        self.may_read_ahead = may_read_ahead(spec.plan, spec.world.size, spec.stage is not None)
        self.ahead: _ReadAhead | None = None
        self.asked: int | None = None  # the last epoch asked for
        self.waiting: tuple[Any, ...] | None = None  # a message received while reading ahead

    def run(self) -> None:
        try:
            self.serve()
        finally:  # its producer thread stopped before this process ends, not left inside h5py's lock
            if self.ahead is not None:
                self.ahead.batches.close()

    def serve(self) -> None:
        while True:
            message, self.waiting = self.waiting, None
            try:
                message = message or self.conn.recv()
            except EOFError:
                return
            if message[0] == "epoch":
                self.epoch(*message[1:])
            else:
                with contextlib.suppress(_Stopped):  # a stop for an epoch that had ended here already
                    self.handle(message)

    def handle(self, message: tuple[Any, ...]) -> None:
        if message[0] == "release":
            self.ring.release(message[1])
        elif message[0] == "stop":
            self.ring.release(None)
            raise _Stopped
        else:
            raise DdpipeError(f"reading process: unexpected message {message[0]!r}")

    def on_bad(self, index: int, sample: Any, reason: str) -> None:
        from .loader_stats import SkippedSample
        from .sample import KEY
        from .stream import unreadable

        if self.decode.on_error == "fail":
            raise unreadable(self.stream, index, sample, reason)
        self.skipped.append(SkippedSample(str(sample.get(KEY)), self.stream.source_of(index), reason))

    def epoch(self, seed: int, epoch: int, pending: np.ndarray | None) -> None:
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead.serves(seed, epoch, pending):
            batches, held, error = ahead.batches, ahead.held, ahead.error
        else:
            if ahead is not None:
                ahead.batches.close()
            self.stream.go_to(seed, epoch, pending)
            self.skipped.clear()
            batches, held, error = iter(self.stream), [], None
        previous, self.asked = self.asked, epoch
        stager = self.stream.stager
        fallbacks = stager.stats["fallbacks"] if stager is not None else 0
        whole = False
        try:
            for batch, skipped_in_it in held:
                self.skipped = skipped_in_it
                # the files the last epoch read are forgotten after these, which the epoch's start waits for
                self.send(batch, forget=False)
            if error is not None:
                raise error
            for b in batches:
                self.send(self.prepared(b.indices, b.samples, seed, epoch))
            skipped, whole = self.skipped, True
        except _Stopped:
            skipped = []
        except Exception as e:  # reaches the caller as it was raised, at once
            self.conn.send(("error", e))
            return
        finally:
            # before the end is told: the parent goes on once it is, and a stopped stream first runs
            # the exchange rounds (through the parent) that the other ranks still need
            batches.close()
        fell_back = stager.stats["fallbacks"] - fallbacks if stager is not None else 0
        self.places.send_news()
        self.conn.send(("end", self.stream.stats, skipped, fell_back))
        if whole and self.may_read_ahead:  # not left early: the caller is likely to go on to the next
            self.ahead = self.read_ahead(seed, likely_next(previous, epoch))
        elif whole:  # its plan at least: no collective in it
            self.stream.plan_ahead(likely_next(previous, epoch))

    def read_ahead(self, seed: int, following: int) -> _ReadAhead:
        """The first :data:`~ddpipe.epoch_ahead.READ_AHEAD_BATCHES` of epoch ``following``, read until
        that many are ready or the parent has something to say."""
        self.stream.go_to(seed, following, None)
        self.skipped = []
        ahead = _ReadAhead(seed, following, iter(self.stream), [], None)
        try:
            for b in ahead.batches:
                ahead.held.append((self.prepared(b.indices, b.samples, seed, following), self.skipped))
                self.skipped = []
                if len(ahead.held) == READ_AHEAD_BATCHES or self.parent_spoke():
                    break
        except Exception as e:  # raised if that epoch is asked for, after the batches before it
            ahead.error = e
        return ahead

    def parent_spoke(self) -> bool:
        """Whether the parent has asked for something (kept for :meth:`run`), its releases taken in."""
        while self.waiting is None and self.conn.poll():
            try:
                message = self.conn.recv()
            except EOFError:  # gone: run() finds out
                return True
            if message[0] == "release":
                self.handle(message)
            else:
                self.waiting = message
        return self.waiting is not None

    def prepared(self, indices: np.ndarray, samples: list[Any], seed: int, epoch: int) -> EncodedBatch:
        """The batch less its unreadable samples, with each one's label and crop window."""
        from .decode.batches import EncodedBatch, checked_headers, with_crops

        batch = EncodedBatch.of(indices, samples, self.on_bad, len(self.stream.dataset.classes),
                                labels_required=self.decode.require_labels)
        if not batch.datas:
            return batch
        if self.decode.train:
            return with_crops(batch, seed, epoch, self.decode, self.on_bad, self.sizes)
        return checked_headers(batch, self.decode, self.on_bad, self.sizes)[0]

    def send(self, batch: EncodedBatch, forget: bool = True) -> None:
        """Send the batch: each image that is a view of a shard file the parent can map, or of a round
        received, as its place there (shard_places.py), the others written into the buffer once there
        is room. A batch that finds no room for :data:`WAIT_FOR_ROOM_S` (or never could: larger than
        the buffer) sends those whole through the connection instead: a parent holding every batch in
        the buffer while it waits for this one would otherwise wait for ever."""
        from .sample import KEY

        while self.conn.poll():  # a stop, or releases, before the batch is written
            self.handle(self.conn.recv())
        found = [self.places.place(d) for d in batch.datas]
        places = np.array(found, dtype=np.int64).reshape(-1, 2)
        in_buffer = [d for d, (number, _) in zip(batch.datas, found, strict=True) if number == IN_BUFFER]
        sizes = np.fromiter(map(len, batch.datas), dtype=np.int64, count=len(batch.datas))
        total = sum(map(len, in_buffer))
        start: int | None = 0
        inline = None
        if total:  # a batch whose images are all elsewhere takes no room
            while total <= self.ring.size and (start := self.ring.place(total)) is None:
                if not self.conn.poll(WAIT_FOR_ROOM_S):
                    break
                self.handle(self.conn.recv())
            if start is None or total > self.ring.size:
                start, inline = None, b"".join(in_buffer)
            else:
                pack_parts(in_buffer, self.ring_bytes[start : start + total])
                self.ring.live.append((self.seq, start, start + total))
        c = batch.crops
        crops = None if c is None else (c.left, c.top, c.width, c.height, c.flip)
        keys = [s.get(KEY) for s in batch.samples]
        self.places.send_news(forget)
        self.conn.send(("batch", self.seq, start, sizes, places, batch.indices, batch.labels, crops, keys,
                        self.skipped, inline))
        self.skipped = []
        self.seq += 1


def main(argv: list[str]) -> None:
    # no PR_SET_PDEATHSIG (workers.py): it fires when the thread that started this process ends, and
    # the loader's threads come and go. Every wait here is on a connection, which the kernel closes
    # when the parent goes, however it goes: a receive then ends, a send fails, and this process exits.
    # A Ctrl-C (the terminal's or the launcher's, to the whole group) is the parent's to answer
    leave_signals_to_parent()
    warnings.simplefilter("ignore", NoBatchWarning)  # the training process's stream says it, once
    buf_fd, ring_bytes, area = (int(a) for a in argv[:3])
    conn_fd, *relay_fd = (int(a) for a in argv[3:])
    whole = memoryview(mmap.mmap(buf_fd, 0))
    os.close(buf_fd)
    relay = None
    if relay_fd:
        at = ring_bytes
        relay = (Connection(relay_fd[0]), whole[at : at + area], whole[at + area :])
    with Connection(conn_fd) as conn, contextlib.suppress(BrokenPipeError, ConnectionResetError):
        _Server(conn, whole[:ring_bytes], relay).run()


if __name__ == "__main__":
    main(sys.argv[1:])
