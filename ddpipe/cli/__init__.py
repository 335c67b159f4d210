"""The ``ddpipe`` command line. Expected errors print one line and exit 1; no tracebacks."""

from __future__ import annotations

import argparse
import contextlib
import functools
import signal
import sys
import threading
import traceback
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO

from ..comm.world import launched_rank
from ..errors import DdpipeError
from .parser import parse_command_line

ShowWarning = Callable[[Warning | str, type[Warning], str, int, TextIO | None, str | None], None]


def _end_the_job(code: int, error: BaseException | None = None) -> None:
    """After an error on one rank of an MPI job, end every rank now: the others would otherwise wait
    for it in their next collective until the watchdog's timeout. Not for an error every rank raises
    (``job_wide``): each reports it and leaves on its own."""
    if getattr(error, "job_wide", False):
        return
    from ..comm.mpi_abort import abort_mpi_job

    abort_mpi_job(code)


def _one_line(python_shows: ShowWarning, message: Warning | str, category: type[Warning], filename: str, lineno: int,
              file: TextIO | None = None, line: str | None = None) -> None:
    """ddpipe's own warnings as the command's one line each, as its errors are (not Python's two, the
    second a line of ddpipe's source); others as Python shows them."""
    if category.__module__.split(".")[0] == "ddpipe":
        print(f"ddpipe: warning: {message}", file=file or sys.stderr)
    else:
        python_shows(message, category, filename, lineno, file, line)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, ``timeout``'s, ``kill``'s), raised where Ctrl-C's KeyboardInterrupt
    would be, so that a command so ended unwinds as a Ctrl-C'd one does: its workers ended, what it
    was writing discarded, one line said. Python's default ended the process on the spot, silently,
    and the resource tracker then warned of the workers' leaked semaphores."""


def _terminated(signum: int, frame: types.FrameType | None) -> None:
    raise Terminated


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Within it, SIGTERM raises :class:`Terminated` (``train`` and ``serve`` answer it their own way
    while they run: a step's stop, a server's). Signals are the main thread's only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:  # None: a handler not set from Python, put back as the default
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command_line(argv)
    # showwarning alone, not warnings.catch_warnings(): that resets which warnings were shown, and a
    # script that made a Loader before calling main() saw its once-a-process warning twice
    python_shows = warnings.showwarning
    warnings.showwarning = functools.partial(_one_line, python_shows)
    try:
        with _sigterm_unwinds():
            return _run(args)
    finally:
        warnings.showwarning = python_shows


def _run(args: argparse.Namespace) -> int:
    try:
        code: int = args.func(args)
    except DdpipeError as e:
        if not e.job_wide or launched_rank() in (None, 0):  # raised by every rank alike: rank 0 says it for all
            print(f"ddpipe: error: {e}", file=sys.stderr)
        _end_the_job(1, e)
        return 1
    except KeyboardInterrupt as e:
        ended = 128 + signal.SIGTERM if isinstance(e, Terminated) else 130
        print("ddpipe: terminated" if isinstance(e, Terminated) else "ddpipe: interrupted", file=sys.stderr)
        _end_the_job(ended)
        return ended
    except OSError as e:
        if e.filename is None:
            raise
        # a path the user gave that is not what it must be (a file where a directory goes, say)
        print(f"ddpipe: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        _end_the_job(1, e)
        return 1
    except Exception as e:
        traceback.print_exc()
        _end_the_job(1, e)
        raise
    return code
