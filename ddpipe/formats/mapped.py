"""A shard file mapped into memory, so that checking its checksum and then reading its samples touch
the page cache's own pages once: reading it instead made the kernel copy it twice (once to hash it,
once to scan it), and the scan copy it again out of its read buffer.

A check (which hashes all of it) pages the whole file in when it maps it: one call, and the fastest
way through it here (64 MB tar shards, unchecked: 2,570 MB/s cold, against 1,234 asking 8 MB ahead at
a time); so does a scan from the file's start, where the file is no larger than a shard ddpipe
writes. A scan that starts mid-file (a rank's share can), or of a larger file (a rank may read a
small part of an adopted one), instead asks the kernel to read ahead of itself, ``AHEAD`` at a time
(``madvise(MADV_WILLNEED)``), so that it does not read what it will not use. A read of one sample
(random access) asks for that sample's bytes alone, and the mapping's faults then read their own
page only (:meth:`MappedFile.ask`). A shard hashed ahead
(reading.py) is hashed on a thread of its own through a mapping whose pages come in as the hash
reaches them, and its reader then reads through that same mapping: nothing is paged in on the
reading thread.

Like DALI's readers, which map files too, this relies on shards not being truncated in place while
they are read (ddpipe replaces files by renaming, which leaves a mapping intact).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import resource
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..checksum import buffer_checksum
from ..errors import CorruptShardError

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: page the whole mapping in with one call
_WILLNEED = getattr(mmap, "MADV_WILLNEED", None)
_RANDOM = getattr(mmap, "MADV_RANDOM", None)
AHEAD = 8 << 20
# Files adopted in place (HDF5, LMDB) can hold a whole dataset: paged in with one call, such a file
# would be read in full before its first sample and its first pages evicted by its last.
POPULATE_LIMIT = 2 << 30
# A scan pages in whole only a file of a shard's size at most (ddpipe writes up to 256 MB).
SCAN_WHOLE_LIMIT = 256 << 20
# The bytes of shard files a dataset keeps mapped between epochs (KeptMappings), per process; and how
# many files, each holding a descriptor (Python's mmap keeps a duplicate of its file's before 3.13's
# trackfd; an LMDB environment holds its file's): this share of the process's descriptors, within
# KEPT_FILES (at the usual soft limit of 1024, the least)
KEPT_BYTES = 4 << 30
KEPT_FILES = (128, 4096)
KEPT_DESCRIPTOR_SHARE = 8


def kept_files(descriptors: int) -> int:
    """How many files a dataset keeps mapped in a process that may hold ``descriptors`` open (its soft
    ``RLIMIT_NOFILE``): a random access over more shards than are kept maps each again, and an LMDB
    shard's environment is opened and its tree walked again, at nearly every sample
    (docs/benchmarks.md, feed-global-files)."""
    least, most = KEPT_FILES
    return max(least, min(most, descriptors // KEPT_DESCRIPTOR_SHARE))


def open_files_limit() -> int:
    """The descriptors this process may hold open at once (its soft ``RLIMIT_NOFILE``)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return sys.maxsize if soft == resource.RLIM_INFINITY else soft


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (part of its stable ABI)."""

    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer  # pythonapi: called holding the interpreter lock
_get_buffer.argtypes, _get_buffer.restype = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int], ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes, _release_buffer.restype = [ctypes.c_void_p], None


def address_of(data: Any) -> int:
    """Where the bytes of ``data`` (anything with the buffer protocol) start in memory: a reading
    process places each image it hands on by it (shard_places.py). Asked of the buffer protocol
    itself, at half the cost of NumPy's answer (``np.frombuffer(...).__array_interface__``), which
    had been the reading process's costliest call."""
    view = _PyBuffer()
    at = ctypes.addressof(view)
    _get_buffer(data, at, 0)  # PyBUF_SIMPLE; raises (TypeError) for an object without the protocol
    try:
        return view.buf or 0
    finally:
        _release_buffer(at)


class FileMapping(mmap.mmap):
    """A file's mapping that knows which file it maps: a reading process hands samples that are views
    of it to its parent as places in the file (shard_places.py), and opens the file again by its path,
    after checking that the path still names the file mapped."""

    path: Path
    identity: tuple[int, int]  # the file's (st_dev, st_ino) when it was mapped


class KeptMapping(Protocol):
    """A mapping of a whole file that knows which file it maps: a :class:`FileMapping`, or the mapping
    LMDB makes of its file (formats/lmdb_env.py, whose environment it holds open)."""

    path: Path
    identity: tuple[int, int]  # the file's (st_dev, st_ino) when it was mapped

    def __len__(self) -> int: ...


M = TypeVar("M", bound=KeptMapping)


class KeptMappings:
    """The mappings of a dataset's shard files kept from one epoch to the next, up to ``limit`` bytes.

    Mapping a file from the page cache costs more than hashing it: each page is entered in the
    process's page tables as it is touched, and taken out again when the mapping goes (32 MB tar
    shards hashed warm: 8 GB/s through a new mapping, 23 through one kept). Every epoch a rank reads
    the same shards again (sticky assignment), so the mapping its hash ahead made is kept, every page
    of it in, and the next epoch's hash goes through it. Each epoch still hashes the whole file: a
    kept mapping shares the file's pages, so a shard changed in place is seen changed. A path that no
    longer names the file mapped (replaced, deleted), or whose size changed (a truncated file would
    fault through the old mapping's end), is mapped again. Only files that stay are kept: a dataset's
    own, and node-local staged copies where no capacity evicts them (a damaged one, removed to be
    staged again, is let go of first); never a copy a capacity may evict: ddpipe deletes it, and a
    mapping would hold its space.

    ``limit`` bounds what the process's resident size shows (its shard pages, which the page cache
    holds anyway: a mapping adds none) and its page tables (2 MB a GB); ``files``, the descriptors
    held, one a mapping. DALI's readers keep every file they read mapped."""

    def __init__(self, limit: int = KEPT_BYTES, files: int | None = None) -> None:
        """``files``: how many at most (default: :func:`kept_files` of this process's limit)."""
        self.limit = limit
        self.files = files if files is not None else kept_files(open_files_limit())
        self._mappings: dict[Path, KeptMapping] = {}
        self._bytes = 0
        self._lock = threading.Lock()  # kept on the hash's thread, found on the reading thread

    def find(self, path: Path, kind: type[M]) -> M | None:
        """The mapping kept of the file ``path`` names now, if any (of type ``kind``); one kept of a file
        that ``path`` no longer names, or whose size changed, is let go of."""
        with self._lock:
            mapping = self._mappings.get(path)
        if mapping is None:
            return None
        try:
            stat = os.stat(path)
            same = (stat.st_dev, stat.st_ino, stat.st_size) == (*mapping.identity, len(mapping))
        except OSError:
            same = False
        if not same:
            with self._lock:
                if self._mappings.get(path) is mapping:
                    del self._mappings[path]
                    self._bytes -= len(mapping)
            return None
        return mapping if isinstance(mapping, kind) else None

    def keep(self, mapping: KeptMapping) -> None:
        """Keep ``mapping`` (every page of it in) where there is room."""
        with self._lock:
            if mapping.path not in self._mappings and self._bytes + len(mapping) <= self.limit \
                    and len(self._mappings) < self.files:
                self._mappings[mapping.path] = mapping
                self._bytes += len(mapping)

    def holds(self, path: Path) -> bool:
        """A mapping of ``path`` is kept (as the file was when it was mapped: :meth:`find` checks)."""
        with self._lock:
            return path in self._mappings

    def let_go(self, path: Path) -> None:
        """Let go of the mapping kept of ``path``, if any: ddpipe is about to delete the file (a damaged
        staged copy), and the mapping would hold its space until the path was next looked up."""
        with self._lock:
            mapping = self._mappings.pop(path, None)
            if mapping is not None:
                self._bytes -= len(mapping)

    def __len__(self) -> int:
        return len(self._mappings)

    def __reduce__(self) -> tuple[type[KeptMappings], tuple[int, int]]:
        return KeptMappings, (self.limit, self.files)  # sent to another process empty: a mapping is this process's


class MappedFile:
    """One file, mapped read-only on first use; a new mapping once the file is wanted whole. With
    ``kept``, the file's mapping is taken from it where it has one, and given to it once hashed."""

    def __init__(self, path: Path, kept: KeptMappings | None = None) -> None:
        self.path = path
        self.size = path.stat().st_size
        self._kept = kept
        self._mapping: FileMapping | None = None
        self._whole = False  # the mapping was paged in whole
        self._asked = 0  # the file up to here has been asked for (see ask_ahead)
        self._random = False  # the mapping's faults read their own page only (see ask)

    @property
    def fits_whole(self) -> bool:
        """Small enough to be paged in with one call."""
        return self.size <= POPULATE_LIMIT

    def content(self, *, whole: bool = False) -> memoryview:
        """The file's bytes. ``whole``: all of the file is about to be read (a check; scans ask
        :meth:`for_scan`), so it is paged in with one call where it fits; otherwise pages come in as
        they are touched, or as a scan asks for them ahead of itself. An empty file, which cannot be
        mapped, is a :class:`CorruptShardError`."""
        whole = whole and self.fits_whole
        found = self._kept.find(self.path, FileMapping) if self._mapping is None and self._kept is not None else None
        if found is not None:
            self._mapping, self._whole, self._random, self._asked = found, True, False, len(found)
        if self._mapping is None or (whole and not self._whole):
            with open(self.path, "rb") as f:
                stat = os.fstat(f.fileno())
                if stat.st_size == 0:
                    raise CorruptShardError("empty file: not a shard", path=self.path)
                flags = mmap.MAP_SHARED | (_POPULATE if whole else 0)
                self._mapping = FileMapping(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
                self._mapping.path, self._mapping.identity = self.path, (stat.st_dev, stat.st_ino)
            self._whole, self._random = whole, False
            self._asked = len(self._mapping) if whole else 0
        return memoryview(self._mapping)

    def prepare(self) -> None:
        """Map the file now, on the caller's thread, so that :meth:`checksum` is then one call into
        xxhash (see :meth:`ShardMapping.prepare`). An empty file is left for :meth:`checksum` to
        report."""
        with contextlib.suppress(OSError, ValueError):  # said again where it matters: hashed or read
            self.content().release()

    def checksum(self) -> str:
        """The checksum of the whole file, through this mapping: the hash touches every page, so the
        mapping then counts as paged in whole. Pages come in as the hash reaches them: cold, paging
        64 MB tar shards in with one call before hashing them made a checked read ~15% slower."""
        with self.content() as content:
            digest = buffer_checksum(content)
        self._whole, self._asked = True, self.size
        if self._kept is not None and self._mapping is not None and self.fits_whole:
            self._kept.keep(self._mapping)
        return digest

    def for_scan(self, *, from_start: bool) -> memoryview:
        """The file's bytes for a scan: paged in whole if it starts at the file's beginning and the
        file is no larger than a shard, or if a check has paged it in already."""
        return self.content(whole=from_start and self.size <= SCAN_WHOLE_LIMIT)

    @property
    def paged_in(self) -> bool:
        """The mapping was paged in whole: a scan has nothing to ask ahead for."""
        return self._whole

    def ask_ahead(self, position: int) -> None:
        """Ask the kernel to read in the file from ``position`` to ``AHEAD`` past it, unless at least
        half of that has been asked for already."""
        mapping = self._mapping
        if mapping is None or _WILLNEED is None:
            return
        size = len(mapping)
        if self._asked >= min(position + AHEAD // 2, size):
            return
        start = max(self._asked, position - position % mmap.PAGESIZE)  # madvise wants a page-aligned start
        stop = min(-(-(position + AHEAD) // mmap.PAGESIZE) * mmap.PAGESIZE, size)
        mapping.madvise(_WILLNEED, start, stop - start)
        self._asked = stop

    def ask(self, start: int, stop: int) -> None:
        """Read the file's bytes from ``start`` to ``stop`` alone, for a read of one sample (random
        access), unless the mapping was paged in whole. Left to faults, a page not yet in would read the
        kernel's read-ahead window around it, and one marked by an earlier read (h5py's, opening the
        file) the window after it: on the benchmarks' machine a random eighth of a dataset's samples
        read all of it (``benchmarks/random_access.py``). So the mapping's faults read their own page
        only, and the sample's pages are asked for together."""
        mapping = self._mapping
        if mapping is None or _WILLNEED is None or self._whole:
            return
        if not self._random and _RANDOM is not None:
            mapping.madvise(_RANDOM)
            self._random = True
        first, stop = max(start, 0) - max(start, 0) % mmap.PAGESIZE, min(stop, len(mapping))
        if first < stop:
            mapping.madvise(_WILLNEED, first, stop - first)

    def close(self) -> None:
        # dropped, not closed: a scan left suspended may still hold a view of it, and the mapping
        # goes when that view does
        self._mapping = None


class ShardMapping(Protocol):
    """A shard file as its reader maps it (:meth:`ShardFormat.mapping`): hashed through it, the file
    is paged in where the reader will read it. :class:`MappedFile` is one; LMDB's is the mapping LMDB
    makes of its file itself (formats/lmdb.py)."""

    path: Path
    size: int

    @property
    def fits_whole(self) -> bool: ...

    def prepare(self) -> None:
        """What a hash needs before it starts that runs Python (opening and mapping the file): done on
        the thread that asks for a hash ahead, so that the hash's own thread makes one call that lets
        go of the interpreter lock. Each step that waited for that lock on a thread of its own waited
        out the reading thread's switch interval: an LMDB shard's environment, opened beside a scan,
        took 8-20 ms rather than 1.5. A failure here is left for :meth:`checksum` or the reader."""

    def checksum(self) -> str: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class HashedFile:
    """A file's checksum and, where it was kept, the mapping it was taken through, paged in whole:
    a reader of the same file scans through it rather than page the file in again (on the reading
    thread)."""

    path: Path
    checksum: str
    mapped: ShardMapping | None


def hash_mapped(mapping: ShardMapping, keep: bool) -> HashedFile:
    """The file of ``mapping`` hashed through it (one call into xxhash, which lets go of the
    interpreter); ``keep``: the mapping kept for its reader, every page of it in, else closed.
    CorruptShardError for an empty file, OSError where it cannot be read."""
    try:
        checksum = mapping.checksum()
    except BaseException:
        mapping.close()
        raise
    # kept only where it is the reader's whole file (past POPULATE_LIMIT a scan reads part of it)
    if keep and mapping.fits_whole:
        return HashedFile(mapping.path, checksum, mapping)
    mapping.close()
    return HashedFile(mapping.path, checksum, None)


def advise_willneed(path: Path) -> None:
    """Start reading ``path`` into the page cache in the background (``POSIX_FADV_WILLNEED``)."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)
