"""The collectives ddpipe issues, for a world of one, and the watchdog that bounds every wait.

No collective waits forever: a rank that hangs makes the others, after ``timeout`` seconds, print
which collective stalled and end the whole job with a non-zero exit.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from ..errors import DdpipeError
from ..memory import EpochMemory
from .world import World

T = TypeVar("T")
DEFAULT_TIMEOUT = float(300)
if TYPE_CHECKING:
    from typing import TypeAlias

    from typing_extensions import Buffer

    Part: TypeAlias = Buffer  # a buffer: one piece of a segment to send
else:
    Part = Buffer = object

#: Work a rank does while it waits for the others to arrive at a collective, a step at a time: called
#: between polls, instead of sleeping, until it returns False (nothing more to do)
WhileWaiting = Callable[[], bool]


@dataclass(frozen=True)
class Written:
    """A segment its sender has already written whole at the start of the place its receiver offered
    for it (:meth:`Comm.places`): ``nbytes`` long, nothing left to pack."""

    nbytes: int


Segment = Sequence[Part] | Written  # what one rank sends another in one alltoallv: its parts, or Written


class Request(Protocol):
    def Wait(self) -> Any: ...  # mpi4py's name


class GradientChannel(Protocol):
    """What gradient averaging over MPI needs: a communicator of its own for non-blocking sums of
    float32 buffers, in place, and broadcasts from rank 0."""

    size: int

    def iallreduce_sum(self, buffer: np.ndarray) -> Request: ...

    def broadcast(self, buffer: np.ndarray) -> None: ...

    def free(self) -> None: ...


class PeerLink(Protocol):
    """Files sent whole from one rank to another on request, beside the collectives: how a node
    fetches a shard that another node has staged (:mod:`ddpipe.staging.peers`)."""

    def serve(self, lookup: Callable[[int], str | None]) -> None:
        """Answer other ranks' requests in a thread of this rank's own: ``lookup(item)`` is the file to
        send, or None when this rank no longer has it."""

    def fetch(self, rank: int, item: int, sink: Callable[[memoryview], None], timeout: float) -> bool:
        """Ask ``rank`` for ``item`` and pass its bytes to ``sink`` chunk by chunk; False if that rank
        does not have it or does not answer within ``timeout`` seconds (nothing was passed to ``sink``)."""

    def close(self) -> None: ...


class Comm:
    """Collectives over the job's world. A world of one needs no MPI and returns at once."""

    def __init__(self, world: World | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.world = world or World()
        self.timeout = timeout
        # what the edge (init_comm) read of the process, for the loaders given this communicator: the
        # environment (staging directories' $VARS and "auto"), and when freed memory goes back to the
        # OS after an epoch (None: never, the allocator was left as it was)
        self.environ: Mapping[str, str] = {}
        self.allocator: EpochMemory | None = None
        self._at_end: list[Callable[[], Any]] = []
        # seconds :meth:`alltoallv` spent packing and moving bytes (what the exchange costs, as against
        # waiting for slower ranks to arrive)
        self.transfer_seconds = 0.0
        self._send = np.empty(0, dtype=np.uint8)

    def _share(self, parent: Comm) -> None:
        """Take ``parent``'s world, timeout, environment, allocator and clean-ups (a channel of it)."""
        Comm.__init__(self, parent.world, parent.timeout)
        self.environ, self.allocator, self._at_end = parent.environ, parent.allocator, parent._at_end

    def at_end(self, cleanup: Callable[[], Any]) -> None:
        """Run ``cleanup`` before :meth:`end_job` ends the process (worker pools, shared memory)."""
        self._at_end.append(cleanup)

    def _clean_up(self) -> None:
        for cleanup in reversed(self._at_end):
            try:
                cleanup()
            except Exception:  # ending the job matters more than a clean-up that failed
                continue

    def allgather(self, value: T) -> list[T]:
        return [value]

    def barrier(self) -> None:
        return None

    def _send_buffer(self, nbytes: int) -> np.ndarray:
        """Where to pack the next :meth:`alltoallv`'s segments: at least ``nbytes``, reused from
        round to round (fresh pages would fault in every round)."""
        if len(self._send) < nbytes:
            self._send = np.empty(int(nbytes * 1.25), dtype=np.uint8)
        return self._send

    def places(self) -> dict[int, memoryview]:
        """For the next :meth:`alltoallv`: the place, writable, that rank ``d`` offered this one for
        its segment, for each ``d`` that offered one (node peers with shared memory, from the second
        round on). A segment written whole at the start of its place goes as :class:`Written`, so that
        a sender copies each sample there as it is read rather than all at once when the round is
        sent. None in a world of one."""
        return {}

    def alltoallv(self, segments: Sequence[Segment], what: str = "exchange", wanted: bool = True,
                  hold: int = 2, while_waiting: WhileWaiting | None = None) -> list[memoryview] | None:
        """Send ``segments[d]`` (given as its parts, which go back to back) to rank ``d``; returns the
        segment each rank sent here, as views of one buffer of this round's own, which lives as long
        as any view of it (callers hand the views on instead of copying them). ``while_waiting``: what
        to do while the other ranks arrive (:data:`WhileWaiting`); a world of one never waits.

        ``wanted``: whether this rank still wants the exchange. The ranks agree on it in the same
        message that tells each rank the sizes it will receive (one synchronisation, not two); if no
        rank wants it, nothing moves and every rank gets None. ``hold``: how many rounds' views the
        caller may keep at once (a shuffle buffer's worth): what receive memory shared between a
        node's ranks is sized for (:mod:`ddpipe.comm.landing`); later rounds that find it full are
        copied into memory of their own instead."""
        lengths = segment_lengths(segments, self.world.size)
        if not wanted:
            return None
        out = np.empty(int(lengths[0]), dtype=np.uint8)
        pack_parts(segments[0], out)
        return [out.data]

    def channel(self) -> Comm:
        """A communicator of this one's world for one loader's collectives, which the loader's threads
        issue while its caller goes on issuing its own on this one (a training loop's progress line, a
        second loader's rounds): collectives on one communicator from two threads can be matched across
        ranks in different orders, and were. It has an MPI communicator or gloo group of its own, and
        shares this one's world, environment, clean-ups and heartbeats. Collective: every rank makes
        its channels in the same order. A world of one has no collectives to keep apart."""
        return self

    def node_ranks(self) -> list[int]:
        """The global ranks on this process's node (itself included)."""
        w = self.world
        return list(range(w.node * w.local_size, (w.node + 1) * w.local_size))

    def peer_link(self) -> PeerLink | None:
        """A link for sending files between ranks, where the launcher gives one (MPI), else None."""
        return None

    def gradient_channel(self) -> GradientChannel:
        raise DdpipeError("gradient averaging over MPI needs an MPI launcher (mpiexec or srun); "
                          "under torchrun use DDP")

    def abort(self, message: str) -> None:
        print(f"ddpipe: rank {self.world.rank}: {message}", file=sys.stderr, flush=True)
        raise SystemExit(1)

    def end_job(self, code: int) -> None:
        """End every process of the job now, with exit status ``code`` (after an error on this rank);
        under torchrun, this process's exit makes torchrun end the others."""
        self._clean_up()
        sys.stderr.flush()
        os._exit(code)

    def close(self) -> None:
        """Leave the job's collectives cleanly (every rank calls it, at the end)."""


def end_job_on_uncaught(comm: Comm) -> None:
    """Make an uncaught exception (Ctrl-C included) end every rank of ``comm``'s job at once, its
    traceback printed once by the rank that raised it, instead of leaving the others to wait out the
    collective timeout in a collective it never joins. Wraps ``sys.excepthook`` (once per hook:
    installing over itself does nothing)."""
    previous = sys.excepthook
    if getattr(previous, "ends_the_job", False):
        return

    def hook(kind: type[BaseException], error: BaseException, trace: types.TracebackType | None) -> None:
        # to the process's own stderr: a hook that wraps this one (torch.distributed installs one when a
        # process group is made later) may be capturing sys.stderr, and the job ends before it writes
        captured, sys.stderr = sys.stderr, sys.__stderr__
        try:
            previous(kind, error, trace)  # this rank's traceback, once
            print(f"ddpipe: rank {comm.world.rank} raised {kind.__name__}: ending the job", file=sys.stderr,
                  flush=True)
        finally:
            sys.stderr = captured
        comm.end_job(130 if issubclass(kind, KeyboardInterrupt) else 1)

    hook.ends_the_job = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def segment_lengths(segments: Sequence[Segment], size: int) -> np.ndarray:
    """Each segment's bytes, checked: one segment per rank, none over MPI's 2 GiB count limit."""
    if len(segments) != size:
        raise ValueError("one segment per rank")
    lengths = np.array([s.nbytes if isinstance(s, Written) else sum((memoryview(p).nbytes for p in s), 0)
                        for s in segments], dtype=np.int64)
    if lengths.max(initial=0) >= 2**31:
        raise ValueError("an exchange round moves over 2 GiB between two ranks: lower round_size")
    return lengths


def split_views(buffer: memoryview, lengths: Sequence[int] | np.ndarray) -> list[memoryview]:
    """``buffer`` cut into consecutive pieces of ``lengths`` bytes, each a view of it (no copy)."""
    ends = np.cumsum(lengths, dtype=np.int64).tolist()
    return [buffer[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def pack_parts(parts: Segment, into: np.ndarray) -> None:
    """``parts`` back to back at the start of ``into``."""
    if isinstance(parts, Written):
        raise ValueError("a segment written in its receiver's place has no parts left to pack")
    view = into.data
    at = 0
    for part in parts:
        piece = memoryview(part).cast("B")
        copy_bytes(view[at : at + len(piece)], piece)
        at += len(piece)


# pieces this large are copied by NumPy, which lets go of the interpreter lock while it copies, where a
# memoryview's slice assignment holds it throughout (a 200 MB copy let another thread run for all of its
# 13 ms through NumPy, for about two fifths of it through a memoryview). A copy of a megabyte holds the
# lock about as long as Python's own turns do; an image's (~100 KB) far less, and sending those through
# NumPy too gained nothing on two ranks (benchmarks/results/feed-copies-ranks.json): what reaches this
# size is whole segments (a reading process's rounds, packed by its parent's relay thread)
RELEASE_LOCK_AT = 1 << 20


def copy_bytes(dest: memoryview, src: Buffer) -> None:
    """``src`` into ``dest`` (of the same length), letting go of the interpreter lock for large copies."""
    source = memoryview(src).cast("B")
    if len(source) >= RELEASE_LOCK_AT:
        np.copyto(np.frombuffer(dest, dtype=np.uint8), np.frombuffer(source, dtype=np.uint8))
    else:
        dest[:] = source


class Watchdog:
    """Calls ``on_timeout(reason)`` if a watched call outlives its deadline, or if ``silent()`` names a
    peer that has stopped showing signs of life (:mod:`ddpipe.comm.heartbeat`) while it waits (give
    or take a tenth of the deadline, at most a second). One thread per communicator.

    The thread looks at the clock on its own, a few times per deadline, instead of being woken at
    every watched call: an exchange round arms it once, and a wake-up per round cost the round a
    context switch and a turn of the GIL for the watchdog's Python (with the header's two polls, an
    empty round took 170-250 us of processor time on 2 ranks here)."""

    def __init__(self, timeout: float, on_timeout: Callable[[str], Any],
                 silent: Callable[[], str | None] | None = None) -> None:
        self.timeout = timeout
        self._on_timeout = on_timeout
        self._silent = silent
        self._period = min(max(timeout / 10, 0.01), 1.0)
        self._armed: tuple[str, float] | None = None  # (what, deadline); replaced whole, never mutated
        threading.Thread(target=self._watch, daemon=True, name="ddpipe-watchdog").start()

    def _watch(self) -> None:
        while True:
            time.sleep(self._period)
            armed = self._armed
            if armed is None:
                continue
            reason = self.overdue(*armed)
            if reason is not None and self._armed is armed:
                self._armed = None
                self._on_timeout(reason)

    def overdue(self, what: str, deadline: float) -> str | None:
        """Why a wait for ``what`` must end now (its deadline passed, or a peer fell silent), or None.
        Also for waits that poll on their own thread rather than arm the watchdog."""
        if time.monotonic() > deadline:
            return f"{what} did not complete within {self.timeout:.0f} s: another rank died or hung"
        if self._silent is not None and (quiet := self._silent()) is not None:
            return f"{what} waits on {quiet}"
        return None

    def watch(self, what: str) -> _Watched:
        return _Watched(self, what)

    def _arm(self, what: str) -> None:
        self._armed = (what, time.monotonic() + self.timeout)

    def _disarm(self) -> None:
        self._armed = None


class _Watched:
    def __init__(self, dog: Watchdog, what: str) -> None:
        self._dog, self._what = dog, what

    def __enter__(self) -> None:
        self._dog._arm(self._what)

    def __exit__(self, *exc: object) -> None:
        self._dog._disarm()
