"""Signs of life between ranks, so that a rank waiting on others can tell a slow peer from a frozen one.

A host that dies is noticed by the launcher, which ends the job; a host that freezes (every process
stopped: a hung kernel, a stuck node) is not, and the others would wait in their next collective for
its whole timeout. Each rank's heartbeat thread sends the next rank (``rank + 1`` around the ring) a
small message every tenth of ``silence`` seconds, on a communicator of its own, and listens for the
previous rank's. A peer that is slow (reading from a slow source, training a long step) keeps beating,
since the thread runs whatever its main thread does; a frozen one stops. A rank waiting in a collective
asks :meth:`Heartbeats.silent`: once its previous rank has been quiet for ``silence`` seconds, it names
that rank's host and the host's ranks, and the job ends.

One message per rank per period, whatever the job's size: of a frozen set of ranks that is not the
whole job, at least one rank's previous rank is in it, and that rank ends the job.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_SILENCE = float(20)
_TAG = 7  # beats from the previous rank, then its CLOSE
_BACK_TAG = 8  # the next rank's CLOSE, the one message sent back along the ring
_BEAT, _CLOSE = 1, 0
_POLL = 0.1  # seconds at most between looks at the links: a leaving neighbour waits this long for an answer


class Heartbeats:
    """This rank's heartbeat thread on ``comm`` (a communicator of its own: nothing else may receive on
    it); ``hosts[r]``: rank r's host name, for the message.

    Each link of the ring (this rank to the next) is closed by a handshake as either end leaves (at
    exit): each end sends the other one CLOSE, its last message on the link, and takes in everything
    until the other's CLOSE has come. Left open, beats sent while a rank was leaving arrived after it
    stopped listening, unmatched at MPI_Finalize (UCX warns "unexpected tag-receive descriptor ... was
    not matched", across hosts, about one job in three)."""

    def __init__(self, comm: Any, hosts: Sequence[str], silence: float = DEFAULT_SILENCE) -> None:
        if silence <= 0:
            raise ValueError(f"silence must be positive seconds, not {silence}")
        self._comm = comm
        rank, size = comm.Get_rank(), comm.Get_size()
        self._previous, self._next = (rank - 1) % size, (rank + 1) % size
        self._hosts = list(hosts)
        self.silence = silence
        self._period = silence / 10
        # a neighbour that does not answer a CLOSE within this is frozen or gone: leave without it
        self._closing = min(silence, 5.0)
        self._heard = time.monotonic()  # replaced whole by the thread, read by waiting ranks
        self._previous_left = False  # its CLOSE has come: its silence is its exit, not a freeze
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="ddpipe-heartbeat")
        self._thread.start()
        atexit.register(self.stop)  # before MPI_Finalize, which mpi4py registered on import

    def silent(self) -> str | None:
        """Why to stop waiting: the previous rank's host has been silent for ``silence`` seconds (None
        while it beats)."""
        quiet = time.monotonic() - self._heard
        if quiet < self.silence:
            return None
        host = self._hosts[self._previous]
        if self._previous_left:
            return f"rank {self._previous} (host {host}), which left the job {quiet:.0f} s ago"
        ranks = [r for r, h in enumerate(self._hosts) if h == host]
        return (f"host {host} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}), which has shown "
                f"no sign of life for {quiet:.0f} s (no heartbeat from rank {self._previous}): frozen or cut off")

    def stop(self) -> None:
        """End the thread, closing its links (at exit, before MPI is finalised; again does nothing)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._closing + 5)

    def _beat(self) -> None:
        links = _Links(self._comm, self._previous, self._next)
        due = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            # small messages leave at once (eager); one still pending means the next rank's host is
            # not taking them in: another beat would only queue behind it
            if now >= due and links.may_beat():
                links.beat()
                due = now + self._period
            if links.take_in():
                self._heard = time.monotonic()
            if links.previous_closed:
                self._previous_left = True
            links.answer_closes()
            self._stop.wait(min(self._period / 2, _POLL))
        links.close(time.monotonic() + self._closing)


class _Links:
    """The two links of a rank's ring: beats in from the previous rank, beats out to the next; each
    closed by a CLOSE from both of its ends."""

    def __init__(self, comm: Any, previous: int, next_rank: int) -> None:
        self._comm, self._previous, self._next = comm, previous, next_rank
        self._incoming = np.zeros(1, dtype=np.int64)
        self._back = np.zeros(1, dtype=np.int64)
        self._beats_in: Any = comm.Irecv(self._incoming, source=previous, tag=_TAG)
        self._close_back: Any = comm.Irecv(self._back, source=next_rank, tag=_BACK_TAG)
        self._sends: list[Any] = []
        self._beat = np.array([_BEAT], dtype=np.int64)
        self._close = np.array([_CLOSE], dtype=np.int64)
        self.previous_closed = self.next_closed = False  # their CLOSE has come
        self._closed_in = self._closed_out = False  # this rank's CLOSE has gone

    def may_beat(self) -> bool:
        return not self._closed_out and not self._sending()

    def _sending(self) -> bool:
        """Whether a message this rank sent is still on its way (those arrived are let go)."""
        self._sends = [s for s in self._sends if not s.Test()]
        return bool(self._sends)

    def beat(self) -> None:
        self._sends.append(self._comm.Isend(self._beat, dest=self._next, tag=_TAG))

    def take_in(self) -> bool:
        """Take in what has come; True if the previous rank showed a sign of life."""
        heard = False
        while not self.previous_closed and self._beats_in.Test():
            heard = True
            if int(self._incoming[0]) == _CLOSE:
                self.previous_closed = True  # its last message on the link: nothing more to receive
            else:
                self._beats_in = self._comm.Irecv(self._incoming, source=self._previous, tag=_TAG)
        if not self.next_closed and self._close_back.Test():
            self.next_closed = True
        return heard

    def answer_closes(self) -> None:
        """Close this rank's end of a link the other end has closed."""
        if self.previous_closed and not self._closed_in:
            self._close_in()
        if self.next_closed and not self._closed_out:
            self._close_out()

    def close(self, deadline: float) -> None:
        """Close both links: send this rank's CLOSEs, then take in all until both neighbours' CLOSEs
        have come (or ``deadline``: a neighbour frozen or gone; what is still posted is cancelled)."""
        if not self._closed_in:
            self._close_in()
        if not self._closed_out:
            self._close_out()
        while time.monotonic() < deadline:
            self.take_in()
            if not self._sending() and self.previous_closed and self.next_closed:
                return
            time.sleep(1e-3)
        for request, done in ((self._beats_in, self.previous_closed), (self._close_back, self.next_closed)):
            if not done:
                request.Cancel()
                request.Wait()

    def _close_in(self) -> None:
        self._sends.append(self._comm.Isend(self._close, dest=self._previous, tag=_BACK_TAG))
        self._closed_in = True

    def _close_out(self) -> None:
        # after every beat sent: a link's messages arrive in the order they were sent
        self._sends.append(self._comm.Isend(self._close, dest=self._next, tag=_TAG))
        self._closed_out = True
