"""This rank's encoded batches read, checked and prepared for DALI in a process of its own
(``DecodeOptions(read_in="process")``).

Why: the training process has one interpreter lock. PyTorch lets go of it around each op it
launches and takes it back from whichever thread holds it then; the Loader's threads (reading,
checking, ordering, each batch's JPEG headers and crop windows) hold it in turn. On an H200,
ResNet-50 fed by DALI's own pipeline, whose stages are threads of C++, stalled 1.4% of the time,
and fed by the Loader 17% (``benchmarks/results/gpu-train.json``). Here a reading process runs
the encoded stream (plan, reads, checksums, local shuffle) and each batch's header reads and crop
windows, and writes the batch's images back to back into a buffer both processes map; the
training process only wraps each image for DALI, which reads it in place.

Where: a DALI decoder, and no staging. A ``partial`` shuffle's exchange rounds run here too, carried
out on the job's communicator by a thread of the parent's (:mod:`ddpipe.comm.relay`): a process the
launcher did not start is no rank of the job. The memory shared is a ``memfd``: nothing is named,
so nothing is left behind however either process ends; the reading process ends when its
connection closes, which the kernel does when the parent goes. Errors raised there (a damaged
shard, a sample that does not decode under ``on_error="fail"``) reach the caller as they were
raised, at their batch's turn.

Protocol (pickled messages over a socket pair): the parent sends the stream's description once,
then ``("epoch", seed, epoch, pending)``; the child answers with ``("batch", ...)`` for each batch
and ``("end", stats)`` or ``("error", exception)``. ``("release", seq)``: the parent is done with
every batch up to ``seq`` (DALI has read them); ``("stop",)``: the parent left the epoch early.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DdpipeError, OptionError

if TYPE_CHECKING:
    from .comm import Comm, World
    from .dataset import Dataset
    from .decode.batches import EncodedBatch
    from .decode.spec import DecodeOptions
    from .loader_stats import ReadStats, SkippedSample
    from .options import ReadOptions
    from .plan import PlanOptions
    from .stream import EncodedStream

# how long the parent waits for a message before it looks whether the reading process is still there
_POLL_S = 1.0
# how long a batch waits for room in the buffer, with no release arriving, before it goes through the
# connection instead (releases arrive a batch's decoding apart)
WAIT_FOR_ROOM_S = 0.5


@dataclass(frozen=True)
class StreamSpec:
    """What the reading process rebuilds the stream from: everything but the job's communicator."""

    dataset: Dataset  # the one the parent opened (its manifest; a store's settings, never a client)
    plan: PlanOptions
    read: ReadOptions
    decode: DecodeOptions
    seed: int
    world: World  # this rank's place in the job (the plan's share, the node's split of a slow source)
    tune_allocator: bool  # as the parent's init_comm did: glibc kept from trimming and mapping each sample


# batches the shared buffer holds, at the dataset's mean sample size: DALI's prefetch queue and the batches
# prepared ahead of it (a few each), the one being written, and room for batches larger than the mean
BUFFER_BATCHES = 12
MIN_BUFFER_BYTES = 64 << 20


def spec_of(stream: EncodedStream, decode: DecodeOptions) -> tuple[StreamSpec, int]:
    """The reading process's description of ``stream``, and the size of the buffer they share."""
    manifest = stream.dataset.manifest
    mean = sum(s.bytes for s in manifest.shards) / max(1, manifest.num_samples)
    size = max(MIN_BUFFER_BYTES, int(BUFFER_BATCHES * stream.options.batch_size * mean))
    spec = StreamSpec(stream.dataset, stream.options, stream.read_options, decode, stream.seed, stream.comm.world,
                      stream.comm.allocator is not None)
    return spec, size


def check_can_read_apart(stream: EncodedStream, decode: DecodeOptions, decoder: str) -> None:
    """Raise :class:`OptionError` where ``read_in="process"`` cannot serve this stream."""
    why = None
    if stream.stager is not None:
        why = "no staging (stage_dir)"
    elif decoder not in ("dali-gpu", "dali-cpu") or decode.service:
        why = f"a DALI decoder in this process (this loader decodes with {decoder!r}" + \
              (" on decode servers)" if decode.service else ")")
    if why:
        raise OptionError(f"read_in='process' needs {why}")


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


class _Stopped(Exception):
    """The parent left the epoch early."""


class _Server:
    """The reading process: serves epochs until its connection closes."""

    def __init__(self, conn: Connection, ring: memoryview, relay: tuple[Connection, memoryview, memoryview] | None
                 ) -> None:
        from .comm import Comm
        from .comm.relay import RelayedComm
        from .memory import EpochMemory, keep_freed_memory
        from .stream import EncodedStream

        self.conn, self.buf = conn, ring
        spec: StreamSpec = conn.recv()
        comm = Comm(spec.world) if relay is None else RelayedComm(spec.world, *relay)
        if spec.tune_allocator:  # samples of ~100 KB made and freed by the thousand (memory.py)
            keep_freed_memory()
            comm.allocator = EpochMemory()
        # a dataset in a store fetches its shards into a scratch directory of this process's own
        self.stream = EncodedStream(spec.dataset, plan=spec.plan, read=spec.read, seed=spec.seed, comm=comm)
        self.stream.views = True  # each sample is copied once, into the shared buffer
        self.decode = spec.decode
        self.ring = _Ring(ring)
        self.seq = 0  # every batch sent, over every epoch: what releases count in
        self.skipped: list[SkippedSample] = []  # left out since the last batch sent

    def run(self) -> None:
        while True:
            try:
                message = self.conn.recv()
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
        self.stream.go_to(seed, epoch, pending)
        self.skipped.clear()
        batches = iter(self.stream)
        try:
            for b in batches:
                self.send(self.prepared(b.indices, b.samples, seed, epoch))
            self.conn.send(("end", self.stream.stats, self.skipped))
        except _Stopped:
            # the parent goes on once told the epoch ended: the stream's exchange rounds come first,
            # which it runs (through the parent) until every rank has stopped
            batches.close()
            self.conn.send(("end", self.stream.stats, []))
        except Exception as e:  # reaches the caller as it was raised
            self.conn.send(("error", e))
        finally:
            batches.close()

    def prepared(self, indices: np.ndarray, samples: list[Any], seed: int, epoch: int) -> EncodedBatch:
        """The batch less its unreadable samples, with each one's label and crop window."""
        from .decode.batches import EncodedBatch, checked_headers, with_crops

        batch = EncodedBatch.of(indices, samples, self.on_bad)
        if not batch.datas:
            return batch
        if self.decode.train:
            return with_crops(batch, seed, epoch, self.decode, self.on_bad)
        return checked_headers(batch, self.decode, self.on_bad)[0]

    def send(self, batch: EncodedBatch) -> None:
        """Write the batch's images into the buffer once there is room, and send the rest. A batch that
        finds no room for :data:`WAIT_FOR_ROOM_S` (or never could: larger than the buffer) goes
        whole through the connection instead: a parent holding every batch in the buffer while it
        waits for this one would otherwise wait for ever."""
        from .sample import KEY

        while self.conn.poll():  # a stop, or releases, before the batch is written
            self.handle(self.conn.recv())
        sizes = np.fromiter(map(len, batch.datas), dtype=np.int64, count=len(batch.datas))
        total = int(sizes.sum())
        start: int | None = 0
        inline = None
        if total:  # a batch whose samples were all left out takes no room
            while total <= self.ring.size and (start := self.ring.place(total)) is None:
                if not self.conn.poll(WAIT_FOR_ROOM_S):
                    break
                self.handle(self.conn.recv())
            if start is None or total > self.ring.size:
                start, inline = None, b"".join(batch.datas)
            else:
                at = start
                for data in batch.datas:
                    self.buf[at : at + len(data)] = data
                    at += len(data)
                self.ring.live.append((self.seq, start, start + total))
        c = batch.crops
        crops = None if c is None else (c.left, c.top, c.width, c.height, c.flip)
        keys = [s.get(KEY) for s in batch.samples]
        self.conn.send(("batch", self.seq, start, sizes, batch.indices, batch.labels, crops, keys, self.skipped,
                        inline))
        self.skipped = []
        self.seq += 1


class ProcessReader:
    """The parent's side: the reading process, started on first use, and its epochs as batches of
    :class:`~ddpipe.decode.batches.EncodedBatch` whose images are views of the shared buffer."""

    def __init__(self, spec: StreamSpec, buffer_bytes: int, comm: Comm) -> None:
        """``comm``: the job's communicator, on which a thread of this process carries out the reading
        process's collectives (its exchange rounds), in a job of several ranks."""
        self.spec = spec
        self.buffer_bytes = buffer_bytes
        self.comm = comm
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._relay: socket.socket | None = None  # this side of the relay's socket pair
        self._view: memoryview | None = None
        self._send_lock = threading.Lock()  # releases come from the decoding thread, epochs from the feed's
        self._started = 0  # reading processes started: a release names the one whose batch it frees

    def _start(self) -> None:
        from .comm.relay import area_bytes, start_relay

        relayed = self.comm.world.size > 1
        manifest = self.spec.dataset.manifest
        mean = sum(s.bytes for s in manifest.shards) / max(1, manifest.num_samples)
        area = area_bytes(self.spec.plan.round_size, mean) if relayed else 0
        fd = os.memfd_create("ddpipe-read", os.MFD_CLOEXEC)
        pairs: list[tuple[socket.socket, socket.socket]] = []
        try:  # one memory: the batches' ring, then the relay's areas (what a round sends, what it received)
            os.ftruncate(fd, self.buffer_bytes + 2 * area)
            buf = mmap.mmap(fd, self.buffer_bytes + 2 * area)
            pairs = [socket.socketpair() for _ in range(2 if relayed else 1)]
            theirs = [b.fileno() for _, b in pairs]
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "ddpipe.read_process", str(fd), str(self.buffer_bytes), str(area),
                 *map(str, theirs)], pass_fds=(fd, *theirs), stdin=subprocess.DEVNULL)
            self._conn = Connection(os.dup(pairs[0][0].fileno()))
            whole = memoryview(buf)
            if relayed:
                self._relay = pairs[1][0].dup()
                at = self.buffer_bytes
                start_relay(Connection(os.dup(self._relay.fileno())), self.comm, whole[at : at + area],
                            whole[at + area :])
        finally:
            os.close(fd)
            for mine, child in pairs:
                mine.close()
                child.close()
        self._view = whole[: self.buffer_bytes]
        self._started += 1
        self._send(self.spec)

    def _send(self, message: Any) -> None:
        assert self._conn is not None
        with self._send_lock:
            self._conn.send(message)

    def _release(self, started: int, seq: int) -> None:
        """DALI is done with every batch up to ``seq`` of reading process number ``started``. One gone
        by then has nothing to reuse (the next message the parent waits for says what became of it),
        and its successor counts its own batches."""
        if self._conn is not None and started == self._started:
            with contextlib.suppress(OSError):
                self._send(("release", seq))

    def _recv(self) -> tuple[Any, ...]:
        conn, proc = self._conn, self._proc
        assert conn is not None and proc is not None
        while not conn.poll(_POLL_S):
            if proc.poll() is not None:
                break
        try:
            message: tuple[Any, ...] = conn.recv()
        except (EOFError, OSError):
            code = proc.wait()
            self.close()
            raise DdpipeError(f"the reading process ended unexpectedly (exit status {code})") from None
        return message

    def epoch(self, seed: int, epoch: int, pending: np.ndarray | None,
              skip: Any) -> Generator[EncodedBatch, None, ReadStats]:
        """The epoch's batches; ``skip(SkippedSample)`` for each sample the reading process left out.
        Returns the epoch's reading figures once it is read whole."""
        from .decode.augment import Crops
        from .decode.batches import EncodedBatch
        from .sample import KEY

        if self._proc is None:
            self._start()
        view = self._view
        assert view is not None
        self._send(("epoch", seed, epoch, pending))
        ended = False
        try:
            while True:
                message = self._recv()
                if message[0] == "error":
                    ended = True
                    raise message[1]
                if message[0] == "end":
                    ended = True
                    for s in message[2]:
                        skip(s)
                    stats: ReadStats = message[1]
                    return stats
                _, seq, start, sizes, indices, labels, crops, keys, skipped, inline = message
                for s in skipped:
                    skip(s)
                where = view
                if inline is not None:
                    where, start = memoryview(inline), 0
                ends = (start + np.cumsum(sizes)).tolist()
                starts = [start, *ends[:-1]] if ends else []
                datas: list[Any] = [where[a:b] for a, b in zip(starts, ends, strict=True)]
                batch = EncodedBatch(indices, [{KEY: k} for k in keys], datas, labels,
                                     Crops(*crops) if crops is not None else None, checked=True,
                                     release=functools.partial(self._release, self._started, seq))
                yield batch
        finally:
            if not ended and self._proc is not None:
                # left early: the child stops at its next batch; its messages until then are dropped
                with contextlib.suppress(DdpipeError):
                    self._send(("stop",))
                    while self._recv()[0] not in ("end", "error"):
                        pass

    def close(self) -> None:
        """End the reading process (the next epoch starts another)."""
        conn, proc, self._conn, self._proc = self._conn, self._proc, None, None
        if conn is not None:
            conn.close()  # the child's recv ends: it exits
        if self._relay is not None:  # the relay thread's receive ends (its own descriptor): it returns
            with contextlib.suppress(OSError):
                self._relay.shutdown(socket.SHUT_RDWR)
            self._relay.close()
            self._relay = None
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._view = None  # the mapping goes with the last view of it


def main(argv: list[str]) -> None:
    # no PR_SET_PDEATHSIG (workers.py): it fires when the thread that started this process ends, and
    # the loader's threads come and go. Every wait here is on a connection, which the kernel closes
    # when the parent goes, however it goes: a receive then ends, a send fails, and this process exits
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
