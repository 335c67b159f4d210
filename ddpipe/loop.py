"""One loop at a time over a loader or a stream.

A loader's decoder and reading process, and a stream's producer and exchange rounds, serve one
epoch's loop: two loops at once took turns with one DALI pipeline (a second loop read in a process
got 6 batches of 8, some of them the first loop's), and on several ranks interleaved two producers'
exchange rounds on one communicator (each rank then unpacked the other loop's samples). So a
later ``iter()`` ends the loop before it, whose next ``next()`` says so, and starts afresh.
"""

from __future__ import annotations

import weakref
from collections.abc import Generator
from typing import Generic, TypeVar

from .errors import DdpipeError

T = TypeVar("T")


class Loop(Generic[T]):
    """A loop over a loader or a stream: its epoch's batches, until it ends or something ends it."""

    def __init__(self, batches: Generator[T, None, None], over: str) -> None:
        self._batches = batches
        self._over = over
        self._ended_by: str | None = None

    def __iter__(self) -> Loop[T]:
        return self

    def __next__(self) -> T:
        if self._ended_by is not None:
            raise DdpipeError(f"this loop over the {self._over} was ended by {self._ended_by}")
        return next(self._batches)

    def close(self) -> None:
        self._batches.close()

    def end(self, by: str) -> None:
        """Its reading stopped and its batches let go of now; its next ``next()`` says what ended it."""
        self._ended_by = by
        self._batches.close()


class HeldLoop(Generic[T]):
    """The loop now held over one loader or stream (``over``), if any: not kept alive by this, so that
    a loop dropped unfinished still closes at once."""

    def __init__(self, over: str) -> None:
        self.over = over
        self._loop: weakref.ref[Loop[T]] | None = None

    def start(self, batches: Generator[T, None, None]) -> Loop[T]:
        """A new loop over ``batches``, held from now on; end the one before with :meth:`end_before`
        first, before the new loop's reading starts."""
        loop = Loop(batches, self.over)
        self._loop = weakref.ref(loop)
        return loop

    def end_before(self) -> None:
        """End the loop held, for a later one: call before that one's reading starts."""
        self.end(f"a later iter() of it: a {self.over} gives one loop's batches at a time (finish or leave one "
                 "loop before starting the next)")

    def end(self, by: str) -> None:
        held = self._loop() if self._loop is not None else None
        if held is not None:
            held.end(by)
        self._loop = None
