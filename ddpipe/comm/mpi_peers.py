"""Files sent whole from one rank to another over MPI point-to-point messages, beside the collectives:
how a node fetches a shard that another node has staged (the ``PeerLink`` of :mod:`ddpipe.comm.base`).
The MPI module comes in from :mod:`ddpipe.comm.mpi`, the one importer of mpi4py."""

from __future__ import annotations

import atexit
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

_REQUEST = 1  # tag of a request; each answer comes on a tag the requester chose for it
_CHUNK = 8 << 20
# a request's number n gives two tags: 2 + 2n for what the server sends (header, chunks), 3 + 2n for
# the requester's "send the chunks". Two ranks that fetch from each other at once number their
# requests alike; with one tag for both directions, one's "send them" met the other's header or
# chunks ("Message truncated", a hang, or another file's bytes). Numbers wrap below MPI's smallest
# allowed tag bound (32767).
_NUMBERS = (32767 - 3) // 2


def _tags(number: int) -> tuple[int, int]:
    """(the server's answer tag, the requester's go-ahead tag) of request ``number``."""
    return 2 + 2 * number, 3 + 2 * number


class MPIPeerLink:
    """Files between ranks by point-to-point messages on a communicator of its own.

    The serving thread polls for requests with short sleeps (a blocking receive would spin a core
    for the whole job). An answer is a header (the file's size, or -1) and then the file in chunks,
    on a tag the requester chose for that request, so a late answer to an abandoned request never
    mixes with the next one; the requester's go-ahead comes on a tag of its own (see ``_tags``).
    The chunks go only after the requester, having received the header, says it still wants them:
    a requester that gave up first never receives them, and the server, blocked in sending them,
    would serve no one again.
    """

    def __init__(self, mpi_comm: Any, mpi: Any) -> None:
        self._comm, self._mpi = mpi_comm, mpi
        self._stop = threading.Event()
        self._server: threading.Thread | None = None
        self._numbers = itertools.count()

    def serve(self, lookup: Callable[[int], str | None]) -> None:
        if self._server is not None:
            return
        self._server = threading.Thread(target=self._serve, args=(lookup,), daemon=True, name="ddpipe-peer-server")
        self._server.start()
        atexit.register(self.close)  # before mpi4py's own exit hook finalizes MPI (hooks run last-in first-out)

    def _serve(self, lookup: Callable[[int], str | None]) -> None:
        status = self._mpi.Status()
        request = np.empty(3, dtype=np.int64)
        while not self._stop.is_set():
            if not self._comm.Iprobe(source=self._mpi.ANY_SOURCE, tag=_REQUEST, status=status):
                time.sleep(0.002)
                continue
            source = status.Get_source()
            self._comm.Recv(request, source=source, tag=_REQUEST)
            item, patience = int(request[0]), int(request[2]) / 1000
            tag, go = _tags(int(request[1]))
            path = lookup(item)
            try:
                f = open(path, "rb", buffering=0) if path is not None else None  # noqa: SIM115 - closed below
            except OSError:  # evicted since the lookup
                f = None
            if f is None:
                self._comm.Send(np.array([-1], dtype=np.int64), dest=source, tag=tag)
                continue
            with f:
                size = os.fstat(f.fileno()).st_size
                self._comm.Send(np.array([size], dtype=np.int64), dest=source, tag=tag)
                if not self._still_wanted(source, go, patience):
                    continue
                buf = bytearray(min(_CHUNK, max(size, 1)))
                sent = 0
                while sent < size:
                    n = f.readinto(buf) or 0
                    if n == 0:  # the file shrank under us: pad, and the requester's checksum refuses it
                        buf[:] = bytes(len(buf))
                        n = min(len(buf), size - sent)
                    self._comm.Send([memoryview(buf)[:n], self._mpi.BYTE], dest=source, tag=tag)
                    sent += n

    def _still_wanted(self, source: int, go_tag: int, patience: float) -> bool:
        """Whether the requester, sent the header, asks for the chunks within ``patience`` seconds."""
        go = np.empty(1, dtype=np.int64)
        request = self._comm.Irecv(go, source=source, tag=go_tag)
        deadline = time.monotonic() + patience
        while not request.Test():
            if time.monotonic() > deadline or self._stop.is_set():
                request.Cancel()
                status = self._mpi.Status()
                request.Wait(status)
                return not status.Is_cancelled()  # it came as we gave up: it wants them after all
            time.sleep(0.001)
        return True

    def fetch(self, rank: int, item: int, sink: Callable[[memoryview], None], timeout: float) -> bool:
        number = next(self._numbers) % _NUMBERS
        tag, go = _tags(number)
        self._comm.Send(np.array([item, number, int(timeout * 1000)], dtype=np.int64), dest=rank, tag=_REQUEST)
        header = np.empty(1, dtype=np.int64)
        answer = self._comm.Irecv(header, source=rank, tag=tag)
        deadline = time.monotonic() + timeout
        while not answer.Test():
            if time.monotonic() > deadline:
                answer.Cancel()
                status = self._mpi.Status()
                answer.Wait(status)
                if status.Is_cancelled():
                    return False
                break  # the answer came as we gave up: take it, or the sender would wait forever
            time.sleep(0.001)
        size = int(header[0])
        if size < 0:
            return False
        self._comm.Send(np.array([1], dtype=np.int64), dest=rank, tag=go)  # the chunks, please
        buf = bytearray(min(_CHUNK, max(size, 1)))
        got = 0
        while got < size:  # the chunks follow at once: blocking receives
            n = min(len(buf), size - got)
            self._comm.Recv([memoryview(buf)[:n], self._mpi.BYTE], source=rank, tag=tag)
            sink(memoryview(buf)[:n])
            got += n
        return True

    def close(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.join(timeout=5)  # a send to a requester that gave up never returns: leave it
            self._server = None
