"""Worker processes that never outlive the process that started them.

A pool's workers wait on a pipe from their parent; a parent ended by SIGKILL (or by SIGTERM, whose
default action skips every clean-up) left them waiting for ever, with the resource tracker beside
them. Each worker asks the kernel to end it when its parent goes (Linux's PR_SET_PDEATHSIG)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Call first thing in a worker process (a pool's ``initializer``); a no-op off Linux."""
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
    """End a ``ProcessPoolExecutor``'s workers at once (Python 3.14 has ``terminate_workers``; before
    it, through the executor's table of processes)."""
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    for process in list(getattr(pool, "_processes", {}).values()):
        with contextlib.suppress(OSError, ValueError):
            process.terminate()
