"""Where an LMDB file's records lie, as a walk of its tree found them (lmdb_tree.py), and reading
them there: its keys in key order (:class:`Keys`), each record's place (:class:`Placement`, which a
format may keep from one open of the same file to the next: learnt.py), and the records read at
their places with ``pread`` (:class:`PlacedRecords`), around LMDB, whose own reads touch each
record's first page through its mapping, and with it the kernel's read-ahead window around it.
"""

from __future__ import annotations

import abc
import bisect
import itertools
import mmap
import os
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import numpy as np

from .lmdb_tree import Tree, TreeError, open_as, walk_file

_KEYS_CHUNK = 1 << 16


class Keys(Sequence[bytes]):
    """An LMDB file's keys, in key order: by default byte order (Python's for bytes), where
    :meth:`find` looks one up."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def _key(self, index: int) -> bytes:
        """The ``index``-th key, ``index`` within ``range(len(self))``."""

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self._key(i) for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError("key index out of range")
        return self._key(index % len(self))

    def find(self, key: bytes, guess: int | None = None) -> int | None:
        """Where ``key`` is (``guess`` first, where given), or None; for a database in LMDB's default
        order (ddpipe's shards)."""
        if guess is not None and 0 <= guess < len(self) and self._key(guess) == key:
            return guess
        at = bisect.bisect_left(self, key)
        return at if at < len(self) and self._key(at) == key else None


class PackedKeys(Keys):
    """Keys in one bytes object, with where each starts: a random reader of an adopted ImageNet holds
    1.28M keys, each a bytes object of its own in a list cost about three times their bytes."""

    def __init__(self, packed: bytes, starts: np.ndarray) -> None:
        self._packed, self._starts = packed, starts  # starts: one more than keys, the last the end

    def __len__(self) -> int:
        return len(self._starts) - 1

    def _key(self, index: int) -> bytes:
        return self._packed[self._starts[index] : self._starts[index + 1]]

    def __iter__(self) -> Iterator[bytes]:
        for c in range(0, len(self), _KEYS_CHUNK):  # a chunk's places as ints at a time, not every key's
            starts = self._starts[c : c + _KEYS_CHUNK + 1].tolist()
            yield from (self._packed[a:b] for a, b in itertools.pairwise(starts))


class MappedKeys(Keys):
    """The keys a walk placed (``tree``), read from the file's bytes (LMDB's own mapping, say) as
    they are asked for."""

    def __init__(self, data: memoryview, tree: Tree) -> None:
        self._data, self._at, self._size = data, tree.key_at, tree.key_size

    def __len__(self) -> int:
        return len(self._at)

    def _key(self, index: int) -> bytes:
        at = int(self._at[index])
        return bytes(self._data[at : at + int(self._size[index])])


def _packed_keys(data: mmap.mmap | memoryview, tree: Tree) -> PackedKeys:
    """The keys the walk found, packed, a chunk of keys at a time (a bytes object for every key at once
    would hold as much as the list this replaces, if only while it is made)."""
    at, size = tree.key_at, tree.key_size
    packed = b"".join(b"".join([data[a : a + n] for a, n in zip(at[c : c + _KEYS_CHUNK].tolist(),
                                                                 size[c : c + _KEYS_CHUNK].tolist(), strict=True)])
                      for c in range(0, len(at), _KEYS_CHUNK))
    return PackedKeys(packed, np.concatenate(([0], np.cumsum(tree.key_size))).astype(np.int64))


@dataclass(frozen=True)
class Placement:
    """Each record's key, in key order, and where its value lies in the file and its length, as a walk
    found them (:class:`Tree`): what :class:`PlacedRecords` reads a file's records by, and a format may
    keep from one open of the same file to the next (learnt.py)."""

    keys: Keys
    value_at: np.ndarray
    value_size: np.ndarray

    @classmethod
    def of(cls, data: mmap.mmap | memoryview, tree: Tree) -> Placement:
        """The placement of ``tree``'s records, its keys read from ``data`` (the file's bytes)."""
        return cls(_packed_keys(data, tree), tree.value_at, tree.value_size)


class PlacedRecords:
    """An LMDB file's records read one at a time (random access) from their places in the file, as
    the tree walk found them (:func:`walk_tree`: every place within the file), with ``pread`` on a
    descriptor advised ``POSIX_FADV_RANDOM``: one read of a record's own bytes. (Found by LMDB
    instead, a record's first page is read through LMDB's mapping, and with it the kernel's
    read-ahead window around it: benchmarks/random_access.py.) The file read is the file walked, and
    must be ``identity`` (device, inode): the one its reader's environment maps, checked as a whole,
    whatever its path names now. TreeError where the file does not hold together or is another.
    ``walked``: the file's bytes where its environment maps them and the walk made as it opened
    (:meth:`.lmdb_env.EnvironmentLease.placed`), not made again: a random access reopening a shard,
    its environment still open, walked the whole tree again each time (docs/benchmarks.md,
    feed-global-reopen). ``placement``: where the records lie, found by a walk of this file before
    (of this version of it: learnt.py), for a reader that checks each record it reads."""

    def __init__(self, path: Path, identity: tuple[int, int], walked: tuple[memoryview, Tree] | None = None,
                 placement: Placement | None = None) -> None:
        self._fd = open_as(path, identity)
        self.close = weakref.finalize(self, os.close, self._fd)
        try:
            if placement is not None:
                self.placement = placement
            elif walked is not None:
                self.placement = Placement.of(*walked)
            else:
                self.placement = walk_file(path, Placement.of, fd=self._fd)
        except BaseException:
            self.close()
            raise
        self.keys = self.placement.keys
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)

    def value(self, record: int) -> bytes:
        """The value of the ``record``-th record (in key order, as :attr:`keys`)."""
        size = int(self.placement.value_size[record])
        data = os.pread(self._fd, size, int(self.placement.value_at[record]))
        if len(data) != size:
            raise TreeError(f"record {record}'s value is cut short")
        return data
