"""Worker processes that never outlive the process that started them, and leave its signals to it.

A pool's workers wait on a pipe from their parent; a parent ended by SIGKILL (or by SIGTERM, whose
default action skips every clean-up) left them waiting for ever, with the resource tracker beside
them. Each worker asks the kernel to end it when its parent goes (Linux's PR_SET_PDEATHSIG).

A terminal's or a launcher's Ctrl-C reaches the whole process group, workers included, and only the
parent may decide what it means: workers that took it as their own were left blocked on their pool's
result queue, their parent waiting for ever for a batch they would not send (a job under mpiexec,
Ctrl-C'd). A scheduler's stop is the same: Slurm signals every process of a job step (SIGTERM before
a time limit, SIGUSR1 with ``--signal``), and a rank that stops after its step
(:func:`ddpipe.distributed.stop_on_signals`) found its decoding workers dead of it. Workers are
started from :func:`worker_context` and ignore these signals from their first instruction on; the
parent ends its workers, or the kernel does as it goes. A child started otherwise (the loader's
reading process) does the same with :func:`parents_signals_held` and :func:`leave_signals_to_parent`."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Iterator
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from .errors import DdpipeError

_PR_SET_PDEATHSIG = 1


# Ctrl-C, and a scheduler's stop (ddpipe.train.stop's signals): the parent's to answer
PARENTS_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGUSR1})


@contextlib.contextmanager
def parents_signals_held() -> Iterator[None]:
    """Start child processes inside: they start with the parent's signals held back until they call
    :func:`leave_signals_to_parent`. The signal mask passes through fork and exec (a Ctrl-C that came
    while a child's interpreter started had killed it with a traceback); CPython starts its resource
    tracker the same way (bpo-33613), and one started in here keeps SIGUSR1 held for good. Only this
    thread's mask changes, and only while inside."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, PARENTS_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def leave_signals_to_parent() -> None:
    """Call first thing in a child started under :func:`parents_signals_held`: it ignores its parent's
    signals from now on (its parent ends it, or the kernel as its parent goes)."""
    for s in PARENTS_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PARENTS_SIGNALS)  # those held back since the start are dropped


def start_resource_tracker() -> None:
    """CPython's resource tracker (of shared memory and semaphores), started now unless it runs, with
    the parent's signals held: CPython holds back only SIGINT and SIGTERM as it starts it, so one
    started by the first SharedMemory died of the SIGUSR1 Slurm sends every process of a step."""
    from multiprocessing import resource_tracker

    with parents_signals_held():
        resource_tracker.ensure_running()


_WORKER_NAME = "ddpipe-worker"


class _SignalsHeldProcess(SpawnProcess):
    def start(self) -> None:
        self.name = f"{_WORKER_NAME}-{self.name}"  # known to the worker before it imports its parent's script
        with parents_signals_held():
            super().start()


class _SignalsHeldContext(SpawnContext):
    Process = _SignalsHeldProcess


def worker_context() -> SpawnContext:
    """The ``mp_context`` of a pool whose initializer is :func:`bind_to_parent`: spawn (a fresh
    interpreter: forking a process that may hold MPI, HDF5 or DALI threads is unsafe), each worker
    started deaf to its parent's signals. Whoever makes the pool calls
    :func:`end_if_importing_parents_script` first, before anything it writes."""
    return _SignalsHeldContext()


_MAIN_GUARD = ("Worker processes import the main script before they start (Python's spawn), so a script must make "
               "ddpipe's loaders and conversions under `if __name__ == \"__main__\":`, and be run from a file, not "
               "from standard input")


def ended_as_they_started(what: str) -> DdpipeError:
    """The error for a pool whose workers ended before any had done its work (its parent saw the pool
    broken): most likely, a script without ``if __name__ == "__main__":`` (see below)."""
    return DdpipeError(f"{what} ended as they started. {_MAIN_GUARD}")


def end_if_importing_parents_script() -> None:
    """Call before anything that starts worker processes or writes: in a worker that is still importing
    its parent's main script (spawn runs it again, as ``__mp_main__``), a script that makes its loader or
    conversion outside ``if __name__ == "__main__":`` would make it again there, each worker writing
    beside its parent or starting workers of its own, which multiprocessing refuses with a traceback in
    each. One of ddpipe's workers ends at once, silently: its parent, its pool broken, names the cause
    (:func:`ended_as_they_started`). Another's (the script's own pool) raises the error."""
    import multiprocessing

    process = multiprocessing.current_process()
    # multiprocessing's own mark of a process importing its parent's main (spawn._main), which its
    # _check_not_importing_main reads
    if not getattr(process, "_inheriting", False):
        return
    if process.name.startswith(_WORKER_NAME):
        raise SystemExit(1)
    raise DdpipeError(f"this worker process, importing its parent's main script, was asked for ddpipe's work at "
                      f"the script's top level. {_MAIN_GUARD}")


def bind_to_parent() -> None:
    """Call first thing in a worker process (a pool's ``initializer``): the worker dies with its parent
    and leaves its signals to it (see the module)."""
    leave_signals_to_parent()
    if not sys.platform.startswith("linux"):
        return
    import multiprocessing

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    # the parent as multiprocessing recorded it when starting this worker: if it went before the
    # request above took effect, this process has been handed to another already
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid is not None and os.getppid() != parent.pid:
        os._exit(1)


def stop_workers(pool: Any) -> None:
    """End a ``ProcessPoolExecutor``'s workers at once, with SIGKILL: they ignore SIGTERM (see the module).
    (Python 3.14 has ``kill_workers``; before it, through the executor's table of processes.)"""
    kill = getattr(pool, "kill_workers", None)
    if kill is not None:
        kill()
        return
    for process in list(getattr(pool, "_processes", {}).values()):
        with contextlib.suppress(OSError, ValueError):
            process.kill()


# the guard's whole program: the paths it is given, one a line, removed once its input ends. Deaf to
# its parent's signals, which Slurm sends to every process of a step: it goes when its parent does
_GUARD = f"""
import os, signal, sys
for s in {sorted(int(s) for s in PARENTS_SIGNALS)}:
    signal.signal(s, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {sorted(int(s) for s in PARENTS_SIGNALS)})
paths = [line.rstrip("\\n") for line in sys.stdin]
for path in paths:
    try:
        os.unlink(path)
    except OSError:
        pass
"""


class NameGuard:
    """Removes named shared memory (files under /dev/shm) once this process is gone, however it goes.

    multiprocessing's resource tracker would, but it runs in this process's group, and a launcher
    ending a job (hydra after MPI_Abort) kills the group with SIGKILL, tracker included, leaving the
    names behind. The guard is a small process in a session of its own that reads the paths it is
    given until its input ends: when this process closes it (:meth:`close`) or dies, the guard
    removes whichever of them are still there, and exits."""

    def __init__(self) -> None:
        import subprocess

        with parents_signals_held():  # held until its program ignores them
            self._guard: subprocess.Popen[str] | None = subprocess.Popen(
                [sys.executable, "-c", _GUARD], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, text=True, start_new_session=True, close_fds=True)

    def add(self, *paths: str) -> None:
        guard = self._guard
        if guard is not None and guard.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                guard.stdin.write("".join(f"{p}\n" for p in paths))
                guard.stdin.flush()

    def close(self) -> None:
        """Have the guard remove what is left now, and end (again does nothing)."""
        guard, self._guard = self._guard, None
        if guard is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if guard.stdin is not None:
                guard.stdin.close()
        with contextlib.suppress(Exception):
            guard.wait(timeout=10)
