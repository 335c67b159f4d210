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
_TAG = 7


class Heartbeats:
    """This rank's heartbeat thread on ``comm`` (a communicator of its own: nothing else may receive on
    it); ``hosts[r]``: rank r's host name, for the message."""

    def __init__(self, comm: Any, hosts: Sequence[str], silence: float = DEFAULT_SILENCE) -> None:
        if silence <= 0:
            raise ValueError(f"silence must be positive seconds, not {silence}")
        self._comm = comm
        rank, size = comm.Get_rank(), comm.Get_size()
        self._previous, self._next = (rank - 1) % size, (rank + 1) % size
        self._hosts = list(hosts)
        self.silence = silence
        self._period = silence / 10
        self._heard = time.monotonic()  # replaced whole by the thread, read by waiting ranks
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
        ranks = [r for r, h in enumerate(self._hosts) if h == host]
        return (f"host {host} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}), which has shown "
                f"no sign of life for {quiet:.0f} s (no heartbeat from rank {self._previous}): frozen or cut off")

    def stop(self) -> None:
        """End the thread (at exit, before MPI is finalised; again does nothing)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _beat(self) -> None:
        incoming = np.zeros(1, dtype=np.int64)
        beat = np.ones(1, dtype=np.int64)
        heard = self._comm.Irecv(incoming, source=self._previous, tag=_TAG)
        sent = None
        due = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            # small messages leave at once (eager); one still pending means the next rank's host is
            # not taking them in: another beat would only queue behind it
            if now >= due and (sent is None or sent.Test()):
                sent = self._comm.Isend(beat, dest=self._next, tag=_TAG)
                due = now + self._period
            while heard.Test():
                self._heard = time.monotonic()
                heard = self._comm.Irecv(incoming, source=self._previous, tag=_TAG)
            self._stop.wait(self._period / 2)
        heard.Cancel()
        heard.Wait()
