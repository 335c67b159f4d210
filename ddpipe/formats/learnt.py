"""What a format learnt of a shard's file as it opened it (where each sample lies), kept so that the
next open of the same bytes need not learn it again: a rank reads the same shards every epoch
(sticky assignment), and a rank's share of a global shuffle opens each for a few samples an epoch,
where learning it again cost more than reading them.

Kept by what vouches that the bytes are the same: the shard's checksum, for a file a checked read
hashed whole; or the file's version (:func:`file_version`) for one read sample by sample or
unchecked, for such reads alone (a checked open would otherwise trust what it learnt as the
manifest's bytes'). A file read so that changed since without its size or time changing is read at
the old places: its samples' digests then differ, or an unchecked read reads what it finds, as it
would anyway.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

# a file's device, inode, size and modification time (ns)
FileVersion = tuple[int, int, int, int]


def file_version(path: str | os.PathLike[str]) -> FileVersion | None:
    """One version of a file: its device, inode, size and modification time (ns); None where it cannot
    be asked (opening it then says why). A file written again in place, or replaced, is another; what
    was learnt of one version (a layout) is for it alone."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


class Learnt(Generic[K, V]):
    """What was learnt of files, by ``K`` (a checksum, a :data:`FileVersion`), up to ``limit``
    samples' worth, past which a file is learnt again at each open; a dataset sent to another
    process arrives without them. Shared by a dataset's reading threads: each step is one dictionary
    operation."""

    LIMIT = 1_000_000

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._known: dict[K, V] = {}
        self._samples = 0

    def get(self, key: K) -> V | None:
        return self._known.get(key)

    def learn(self, key: K, learnt: V, samples: int) -> None:
        """Keep ``learnt`` of ``key``'s file, ``samples`` samples' worth, where the limit has room."""
        if key not in self._known and self._samples + samples <= self.limit:
            self._samples += samples
            self._known[key] = learnt

    def __len__(self) -> int:
        return len(self._known)

    def __reduce__(self) -> tuple[type[Learnt[K, V]], tuple[int]]:
        return Learnt, (self.limit,)


@dataclass(frozen=True)
class LearntOfFile(Generic[V]):
    """What ``store`` keeps of one version of one file, for a reader of it that reads sample by sample
    or unchecked: :attr:`known`, learnt by an earlier open of that version, or None; :meth:`learn`
    keeps what this open found."""

    store: Learnt[FileVersion, V]
    version: FileVersion

    @classmethod
    def of(cls, store: Learnt[FileVersion, V], path: str | os.PathLike[str]) -> LearntOfFile[V] | None:
        """The file at ``path`` as it is now in ``store``; None where its version cannot be asked."""
        version = file_version(path)
        return None if version is None else cls(store, version)

    @property
    def known(self) -> V | None:
        return self.store.get(self.version)

    @property
    def identity(self) -> tuple[int, int]:
        """The file's device and inode: a reader must read this file, whatever its path names now."""
        return self.version[0], self.version[1]

    def learn(self, learnt: V, samples: int) -> None:
        self.store.learn(self.version, learnt, samples)
