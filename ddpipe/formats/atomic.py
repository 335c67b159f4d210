"""Files that become visible only when complete: write a hidden temporary name, fsync, rename.

A reader, a resumed conversion or a stager never sees a partial file under its final name.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import DiskFullError


def partial_path(final: str | os.PathLike[str]) -> Path:
    """The hidden temporary name a file is written under before it is committed."""
    p = Path(final)
    return p.with_name(f".{p.name}.partial")


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: str | os.PathLike[str], final: str | os.PathLike[str], *, durable: bool = True) -> None:
    """Rename ``tmp`` over ``final`` in one atomic step; ``durable`` first fsyncs it (and after, its
    directory), so that the rename survives a power loss with its content."""
    if durable:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, final)
    if durable:
        fsync_dir(Path(final).parent)


@dataclass(frozen=True)
class Finished:
    """Files written whole under their hidden temporary names, not yet flushed to the disk nor named:
    whoever holds this (a thread, or the process a worker returned it to) makes them durable and
    names them with :meth:`commit`, so that the one that wrote them goes on to its next file rather
    than wait for the disk."""

    files: tuple[tuple[str, str], ...]  # (temporary, final), named in this order: a shard after its sidecars

    def commit(self) -> None:
        """Flush every file, rename each to its final name in order, then flush the renames; the
        temporary files are removed on failure."""
        try:
            for tmp, _ in self.files:
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            for tmp, final in self.files:
                os.replace(tmp, final)
            for directory in dict.fromkeys(Path(final).parent for _, final in self.files):
                fsync_dir(directory)
        except OSError as e:
            self.discard()
            if self.files:
                raise_if_disk_full(e, self.files[-1][1])
            raise

    def discard(self) -> None:
        for tmp, _ in self.files:
            discard(tmp)


def discard(tmp: str | os.PathLike[str]) -> None:
    """Remove a temporary file if it exists."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def is_disk_full(error: BaseException) -> bool:
    """True for ENOSPC/EDQUOT/EFBIG, also when a library (HDF5) only names the errno in its message."""
    if isinstance(error, OSError) and error.errno in _FULL:
        return True
    text = str(error)
    return "No space left on device" in text or "errno = 28" in text


def raise_if_disk_full(error: BaseException, path: str | os.PathLike[str]) -> None:
    """Turn a full-disk error into a :class:`DiskFullError` naming the file being written."""
    if is_disk_full(error):
        raise DiskFullError(
            "no space left on the device while writing; files finished before are intact, "
            "free space and run the same command again to continue",
            path=path,
        ) from error


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that the file appears whole or not at all."""
    tmp = partial_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        commit(tmp, path)
    except OSError as e:
        discard(tmp)
        raise_if_disk_full(e, path)
        raise
