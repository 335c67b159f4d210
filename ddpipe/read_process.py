"""This rank's encoded batches read, checked and prepared for DALI in a process of its own
(``DecodeOptions(read_in="process")``).

Why: the training process has one interpreter lock. PyTorch lets go of it around each op it
launches and takes it back from whichever thread holds it then; the Loader's threads (reading,
checking, ordering, each batch's JPEG headers and crop windows) hold it in turn. On an H200,
ResNet-50 fed by DALI's own pipeline, whose stages are threads of C++, stalled 1.4% of the time,
and fed by the Loader 17% (``benchmarks/results/gpu-train.json``). Here a reading process runs
the encoded stream (plan, reads, checksums, local shuffle) and each batch's header reads and crop
windows, and hands each image over as its place in its shard file, which the training process maps
too, or, for a sample received from another rank, in the place its round arrived in, in memory both
map (:mod:`ddpipe.shard_places`); where it has no such place (the copies some adopted files give, a
round that found no room), it writes it into a buffer both processes map. The training process only
wraps each image for DALI, which reads it in place.

Where: a DALI decoder, in every shuffle mode, with staging or without. What needs the job's other
processes stays in the training process: a ``partial`` shuffle's exchange rounds are carried out on
the job's communicator by a thread of its own (:mod:`ddpipe.comm.relay`: a process the launcher did
not start is no rank of the job), and the node's staged copies are made by local rank 0's training
process, the reading processes reading them. The reading process (:mod:`ddpipe.read_server`) leaves
Ctrl-C to the rank (a launcher's reaches it too) and ends when its connection closes, which the
kernel does when the parent goes; the memory both map is a ``memfd``, named nowhere, so nothing is
left behind however either ends. Errors raised there (a damaged shard, a sample that does not
decode under ``on_error="fail"``) reach the caller as they were raised, at their batch's turn.

Protocol (pickled messages over a socket pair): the parent sends the stream's description once,
then ``("epoch", seed, epoch, pending)``; the child answers with ``("batch", ...)`` for each batch
and ``("end", stats, skipped, fallbacks)`` or ``("error", exception)``; before a batch, ``("file",
number)`` followed by the file's descriptor, ``("round", number, start)`` (a round the relay
received at ``start`` of its area), and ``("forget", numbers)``. ``("release", seq)``: the
parent is done with every batch up to ``seq`` (DALI has read them); ``("stop",)``: the parent left
the epoch early. As an epoch read whole ends, the child reads the first batches of the one likely to
be asked for next (``epoch_ahead.py``), and sends them if it is: an epoch's start
then waits neither for the plan's shuffle buffer to fill nor for its first shards to be checked.
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
from collections.abc import Callable, Generator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DdpipeError, OptionError
from .shard_places import IN_BUFFER, PlaceViews
from .workers import parents_signals_held

if TYPE_CHECKING:
    from .comm import Comm, World
    from .dataset import Dataset
    from .decode.batches import EncodedBatch
    from .decode.spec import DecodeOptions
    from .loader_stats import ReadStats, SkippedSample
    from .options import ReadOptions
    from .plan import PlanOptions
    from .staging import NodeStager, StageOptions
    from .stream import EncodedStream

# how long the parent waits for a message before it looks whether the reading process is still there
_POLL_S = 1.0

# the reading process imports the ddpipe its parent imported: ``python -m`` would look in its working
# directory first, where another checkout of ddpipe (speaking another protocol) may be
_IMPORTED_FROM = str(Path(__file__).resolve().parent.parent)
_START_SERVER = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
                 "from ddpipe.read_server import main; main(sys.argv[1:])")


@dataclass(frozen=True)
class StreamSpec:
    """What the reading process rebuilds the stream from: everything but the job's communicator."""

    dataset: Dataset  # the one the parent opened (its manifest; a store's settings, never a client)
    plan: PlanOptions
    read: ReadOptions
    decode: DecodeOptions
    seed: int
    world: World  # this rank's place in the job (the plan's share, the node's split of a slow source)
    node_ranks: list[int]  # the job's ranks on this rank's node
    stage: StageOptions | None  # the node's staging, its directory resolved: the parent copies, this reads
    tune_allocator: bool  # as the parent's init_comm did: glibc kept from trimming and mapping each sample


# batches the shared buffer holds, at the dataset's mean sample size: DALI's prefetch queue and the batches
# prepared ahead of it (a few each), the one being written, and room for batches larger than the mean
BUFFER_BATCHES = 12
MIN_BUFFER_BYTES = 64 << 20


def spec_of(stream: EncodedStream, decode: DecodeOptions) -> tuple[StreamSpec, int, int]:
    """The reading process's description of ``stream``, the size of the batches' buffer they share,
    and of the relay's sent area (none in a world of one: nothing to relay)."""
    from .comm.relay import area_bytes

    manifest = stream.dataset.manifest
    mean = manifest.num_bytes / max(1, manifest.num_samples)
    size = max(MIN_BUFFER_BYTES, int(BUFFER_BATCHES * stream.options.batch_size * mean))
    area = area_bytes(stream.options.round_size, mean) if stream.comm.world.size > 1 else 0
    stage = stream.stager.options if stream.stager is not None else None
    spec = StreamSpec(stream.dataset, stream.options, stream.read_options, decode, stream.seed, stream.comm.world,
                      stream.comm.node_ranks(), stage, stream.comm.allocator is not None)
    return spec, size, area


def check_can_read_apart(decode: DecodeOptions, decoder: str) -> None:
    """Raise :class:`OptionError` where ``read_in="process"`` cannot serve this stream."""
    if decoder not in ("dali-gpu", "dali-cpu") or decode.service:
        raise OptionError(f"read_in='process' needs a DALI decoder in this process (this loader decodes with "
                          f"{decoder!r}" + (" on decode servers)" if decode.service else ")"))


class ProcessReader:
    """The parent's side: the reading process (:meth:`start`, or the first epoch), and its epochs as batches of
    :class:`~ddpipe.decode.batches.EncodedBatch` whose images are views of their shard files or of the
    shared buffer."""

    def __init__(self, spec: StreamSpec, buffer_bytes: int, area_bytes: int, comm: Comm) -> None:
        """``comm``: the job's communicator, on which a thread of this process carries out the reading
        process's collectives (its exchange rounds) through a sent area of ``area_bytes`` and a received
        area (:func:`~ddpipe.comm.relay.received_area_bytes`); none if 0."""
        self.spec = spec
        self.buffer_bytes = buffer_bytes
        self.area_bytes = area_bytes
        self.comm = comm
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._relay: socket.socket | None = None  # this side of the relay's socket pair
        self._view: memoryview | None = None
        self._places = PlaceViews()  # the shard files and rounds the reading process named (shard_places.py)
        self._send_lock = threading.Lock()  # releases come from the decoding thread, epochs from the feed's
        self._started = 0  # reading processes started: a release names the one whose batch it frees

    def start(self) -> None:
        """Start the reading process (the first epoch does, if not yet)."""
        from .comm.relay import ReceivedRounds, received_area_bytes, start_relay

        area = self.area_bytes
        relayed = area > 0
        received = received_area_bytes(area, self.buffer_bytes) if relayed else 0
        fd = os.memfd_create("ddpipe-read", os.MFD_CLOEXEC)
        pairs: list[tuple[socket.socket, socket.socket]] = []
        try:  # one memory: the batches' ring, then the relay's areas (what a round sends, what rounds received)
            os.ftruncate(fd, self.buffer_bytes + area + received)
            buf = mmap.mmap(fd, self.buffer_bytes + area + received)
            pairs = [socket.socketpair() for _ in range(2 if relayed else 1)]
            theirs = [b.fileno() for _, b in pairs]
            with parents_signals_held():  # Ctrl-C and a scheduler's stop are the rank's to answer
                self._proc = subprocess.Popen(
                    [sys.executable, "-c", _START_SERVER, _IMPORTED_FROM, str(fd), str(self.buffer_bytes),
                     str(area), *map(str, theirs)], pass_fds=(fd, *theirs), stdin=subprocess.DEVNULL)
            self._conn = Connection(os.dup(pairs[0][0].fileno()))
            whole = memoryview(buf)
            if relayed:
                self._relay = pairs[1][0].dup()
                at = self.buffer_bytes
                self._places.rounds = ReceivedRounds(whole[at + area :])
                start_relay(Connection(os.dup(self._relay.fileno())), self.comm, whole[at : at + area],
                            self._places.rounds)
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

    def _recv(self, watch: Callable[[], None] | None = None) -> tuple[Any, ...]:
        """The reading process's next message but those about its files and rounds, which are taken in
        on the way."""
        conn, proc = self._conn, self._proc
        assert conn is not None and proc is not None
        while True:
            while not conn.poll(_POLL_S):
                if proc.poll() is not None:
                    break
                if watch is not None:
                    watch()
            try:
                message: tuple[Any, ...] = conn.recv()
                if not self._places.receive(message, conn):
                    return message
            except (EOFError, OSError):
                code = proc.wait()
                self.close()
                raise DdpipeError(f"the reading process ended unexpectedly (exit status {code})") from None

    def epoch(self, seed: int, epoch: int, pending: np.ndarray | None, skip: Callable[[SkippedSample], None],
              stager: NodeStager | None = None) -> Generator[EncodedBatch, None, ReadStats]:
        """The epoch's batches; ``skip(SkippedSample)`` for each sample the reading process left out;
        ``stager``: this process's, whose errors are raised while waiting for a batch, and which counts
        the shards the reading process read from the source instead. Returns the epoch's reading
        figures once it is read whole."""
        watch = stager.check if stager is not None else None
        if self._proc is None:
            self.start()
        view = self._view
        assert view is not None
        with contextlib.suppress(OSError):  # a reading process gone: the receive below says so
            self._send(("epoch", seed, epoch, pending))
        ended = False
        try:
            while True:
                message = self._recv(watch)
                if message[0] == "error":
                    ended = True
                    raise message[1]
                if message[0] == "end":
                    ended = True
                    for s in message[2]:
                        skip(s)
                    if stager is not None:
                        stager.stats["fallbacks"] += message[3]
                    stats: ReadStats = message[1]
                    return stats
                for s in message[9]:  # the samples left out of this batch
                    skip(s)
                yield self._batch_of(message, view)
        except GeneratorExit:
            if not ended and self._proc is not None:
                # left early: the child stops at its next batch; its messages until then are dropped
                with contextlib.suppress(DdpipeError):
                    self._send(("stop",))
                    while self._recv()[0] not in ("end", "error"):
                        pass
            raise
        except BaseException:
            if not ended:  # an error here (the node's staging failed): the reading process goes too
                self.close()
            raise

    def _batch_of(self, message: tuple[Any, ...], view: memoryview) -> EncodedBatch:
        """The batch a "batch" message describes: each sample's bytes where the reading process put
        them (the shared buffer ``view``, or the message itself where they did not fit; or a shard file
        both processes map), handed back for reuse as the batch is released."""
        from .decode.augment import Crops
        from .decode.batches import EncodedBatch
        from .sample import KEY

        _, seq, start, sizes, places, indices, labels, crops, keys, _, inline = message
        buffer = view if inline is None else memoryview(inline)
        at = start if inline is None else 0
        datas: list[Any] = []
        for size, (number, offset) in zip(sizes.tolist(), places.tolist(), strict=True):
            if number == IN_BUFFER:
                datas.append(buffer[at : at + size])
                at += size
            else:
                datas.append(self._places.view(number, offset, size))
        return EncodedBatch(indices, [{KEY: k} for k in keys], datas, labels,
                            Crops(*crops) if crops is not None else None, checked=True,
                            release=functools.partial(self._release, self._started, seq))

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
        self._places.clear()  # as do the files' mappings and the rounds' places
