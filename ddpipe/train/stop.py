"""Stopping a training job at one step on every rank, checkpoint saved, when any rank is asked to.

``ddpipe train`` is asked by a signal: SIGTERM, which a scheduler sends before it kills a job at its
time limit or to preempt it (Slurm waits ``KillWait`` seconds, 30 by default, before SIGKILL), or
SIGUSR1, which Slurm sends that many seconds ahead with ``--signal=USR1@SECONDS``. The signal reaches
the ranks at different steps, or only some of them; a rank that stopped alone would leave the others
waiting in their next gradient allreduce until the timeout. So every rank casts a vote each step: an
allreduce of one number, on a process group of its own, started at one step and read at the next (it
completes while the step runs, so no step waits for it). All ranks stop after the step that read a vote
in which any rank was asked: the same step on every rank.

A second signal of the same kind ends the process at once, as if none had been caught: a job stuck
where no step ends can still be stopped.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import Any

import torch

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """The signal this process was asked to stop by, if any: set by :meth:`catch`'s handlers."""

    def __init__(self) -> None:
        self.signum = 0

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "none"

    def catch(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Callable[[], None]:
        """Handlers for ``signals`` that ask this process to stop (from the main thread, as Python
        requires); the function that puts the previous handlers back."""
        previous = {s: signal.getsignal(s) for s in signals}

        def ask(signum: int, frame: FrameType | None) -> None:
            self.signum = self.signum or signum
            signal.signal(signum, signal.SIG_DFL)  # the next one ends the process

        def restore() -> None:
            for s, handler in previous.items():  # None: a handler not set from Python, put back as the default
                signal.signal(s, signal.SIG_DFL if handler is None else handler)

        for s in signals:
            signal.signal(s, ask)
        return restore


class StopVote:
    """Whether any rank of the job was asked to stop, agreed by all: each rank calls :meth:`agreed`
    once per step, in step with the others, and all get True after the same step.

    ``group``: a process group of its own (gloo, so a ballot stays in host memory and a GPU job never
    waits for the device to read it), or None for a job of one process."""

    def __init__(self, request: StopRequest, group: Any | None) -> None:
        self.request, self._group = request, group
        self._ballot = torch.zeros(1, dtype=torch.int32)
        self._work: Any | None = None

    @classmethod
    def for_job(cls, request: StopRequest, ranks: int, timeout: float) -> StopVote:
        """The vote of a job of ``ranks`` processes, with torch.distributed's default process group in place
        where there are several (every rank calls this at the same point: making the group is collective)."""
        if ranks == 1:
            return cls(request, None)
        import torch.distributed as dist

        return cls(request, dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout)))

    def agreed(self) -> bool:
        """True when the vote cast at this rank's previous call found any rank asked to stop; then the vote
        ends. Otherwise this call casts the next vote."""
        if self._group is None:
            return self.request.signum != 0
        if self._work is not None:
            self._work.wait()
            self._work = None
            if int(self._ballot[0]):
                return True
        import torch.distributed as dist

        self._ballot[0] = 1 if self.request.signum else 0
        self._work = dist.all_reduce(self._ballot, group=self._group, async_op=True)
        return False

    def close(self) -> None:
        """Wait for the last vote cast (every rank cast as many), so that none is left open. Not after an
        error: the other ranks may never cast the vote this one would wait for."""
        if self._work is not None:
            self._work.wait()
            self._work = None
