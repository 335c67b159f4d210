"""A shard's file read a few bytes at a time with ``pread`` rather than through a mapping: a random
read of a few samples of each shard (a rank's share of a global shuffle), read sample by sample.

Copied out of a mapping made for them, each page faulted in, such reads took about half as long
again warm (docs/benchmarks.md, random_access); and a file cut short in place under a mapping ends
the process with SIGBUS, where a short read here is an error naming the file. The descriptor, opened
at the first read, is advised ``POSIX_FADV_RANDOM``, so that a cold read reads the bytes asked for
and not the kernel's read-ahead window around them.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CorruptShardError


class RandomReads:
    """Reads of one file at its places, opened on the first (:meth:`read`, :meth:`ask`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._size = 0  # the file's when opened

    def _descriptor(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            self._size = os.fstat(self._fd).st_size
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
        return self._fd

    def ask(self, start: int, stop: int) -> None:
        """Ask the disk for the bytes from ``start`` to ``stop`` now: the pieces of one sample, read one
        after another next, then wait on it once, not once each."""
        os.posix_fadvise(self._descriptor(), start, stop - start, os.POSIX_FADV_WILLNEED)

    def read(self, at: int, size: int, what: str) -> bytes:
        """The ``size`` bytes at ``at``: :class:`CorruptShardError` naming the file where they run past
        its end (``what`` they are, "member 'a.jpg'", is then cut short), checked against its size
        first where a damaged file gives the place, before a buffer of ``size`` bytes is made."""
        fd = self._descriptor()
        if at < 0 or size < 0 or at + size > self._size:
            raise CorruptShardError(f"{what} is cut short: it runs past the file's end ({self._size} bytes)",
                                    path=self.path)
        data = os.pread(fd, size, at)
        if len(data) != size:
            raise CorruptShardError(f"{what} is cut short", path=self.path)
        return data

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
