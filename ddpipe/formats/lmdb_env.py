"""LMDB environments, one per file in this process, shared by every reader of the file, and views of
the mapping LMDB makes of it.

LMDB forbids opening one file's environment twice in one process (py-lmdb raises "already open"):
two readers of one shard at a time (two loaders over one dataset, a training loader and an
evaluation one, a shard hashed ahead while another reader of it is open) failed, the second told
its shard was unreadable. So each file's environment is opened once and shared
(:func:`lease_environment`), and closed when its last user lets go: a reader, a hash taken through
its mapping, or a sample read as a view of that mapping (:class:`LMDBMapping`), which DALI then
reads in place as it reads tar's. The register is the process's, as LMDB's rule is.

A shard's file, as its readers and the hash ahead hold it (:class:`LMDBFile`), takes a lease on its
environment when first used, and hashes the file through the mapping LMDB reads it by.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lmdb

from ..checksum import buffer_checksum
from ..errors import CorruptShardError
from .lmdb_places import PlacedRecords
from .lmdb_tree import Tree, TreeError, file_tree
from .mapped import POPULATE_LIMIT, KeptMappings, MappedFile, address_of


def open_whole(path: Path, identity: tuple[int, int]) -> tuple[lmdb.Environment, Tree]:
    """The LMDB file ``path``, read-only and without a lock file, once it is known to hold every page it
    names and its tree to hold together (:mod:`.lmdb_tree`): pages are read through mmap, and LMDB
    follows a damaged page's numbers anywhere, killing the process (SIGBUS, SIGABRT) rather than
    raising; and the walk that found that out. Open it through :func:`lease_environment`, which
    opens it once."""
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=True, max_readers=512)
    try:
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        if path.stat().st_size < needed:
            raise CorruptShardError(f"truncated LMDB: {path.stat().st_size} bytes, its pages need {needed}",
                                    path=path)
        tree = file_tree(path, identity)
    except TreeError as e:
        env.close()
        raise CorruptShardError(f"damaged LMDB: {e}", path=path) from None
    except BaseException:
        env.close()
        raise
    return env, tree


def lmdb_mapping_start(env: lmdb.Environment, places: Tree | None) -> int | None:
    """Where ``env``'s mapping of its file starts: the address LMDB gives its first record's value,
    less where the walk of the file's tree found that value in the file (``places``). None for a
    file without records (or not walked), or where LMDB's record is not the one walked.
    LMDB does not say where its mapping starts. Its cursor steps to that record through tree pages
    the bounded walk has checked, and only the value's address is used, not its bytes. Found among
    the process's mappings in ``/proc/self/maps``, it cost a ``read`` call for each page of that
    file (of a process with torch and DALI loaded), each letting go of the interpreter lock: beside
    a thread running Python, about 125 ms a shard here."""
    if places is None or not len(places.value_at):
        return None
    at, size = int(places.value_at[0]), int(places.value_size[0])
    try:
        with env.begin(buffers=True) as txn:
            cursor = txn.cursor()
            if not cursor.first():
                return None
            value = cursor.value()
            return address_of(value) - at if len(value) == size else None
    except lmdb.Error:
        return None


class LMDBMapping:
    """The bytes of an LMDB file where its environment maps them, as a ctypes array of the file's size
    (made by :meth:`EnvironmentLease.mapping`): views of it hold the environment open, and a reading
    process hands them to its parent as places in the file (:mod:`ddpipe.shard_places`), as it does
    tar's."""

    path: Path
    identity: tuple[int, int]  # the file's (st_dev, st_ino)

    if TYPE_CHECKING:  # what the ctypes array beside this class in each instance's type gives
        def __buffer__(self, flags: int, /) -> memoryview: ...

        def __len__(self) -> int: ...


class MappedRecords:
    """Where py-lmdb's buffers (views of LMDB's mapping, valid only until its cursor moves) lie in an
    :class:`LMDBMapping`, whose views last as long as they are held."""

    def __init__(self, mapping: LMDBMapping) -> None:
        self.whole = memoryview(mapping).cast("B")
        self._base = address_of(self.whole)

    def place(self, buffer: Any) -> int | None:
        """Where ``buffer`` starts in the file, or None where it lies outside the mapping."""
        at = address_of(buffer) - self._base
        return at if 0 <= at <= len(self.whole) - len(buffer) else None


class _Environment:
    """One file's environment, where its records lie (the walk's, made before LMDB opened the file)
    and what is known of its mapping, with the count of its users."""

    def __init__(self, path: Path, identity: tuple[int, int], size: int) -> None:
        self.path, self.identity, self.size = path, identity, size
        self.env, tree = open_whole(path, identity)
        self.places: Tree | None = tree  # None only where a benchmark's reference leaves the walk out
        self.users = 0
        self.start: int | None = None  # where its mapping starts, once found
        self.mapping: weakref.ref[Any] | None = None
        self.records: PlacedRecords | None = None  # once a record is read on its own (EnvironmentLease.records)


class Environments:
    """The LMDB environments open in this process, by file (device and inode, as py-lmdb tells them
    apart): each opened once, closed once no lease on it is left."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a mapping's finalizer may release its lease while this is held
        self._open: dict[tuple[int, int], _Environment] = {}

    def lease(self, path: Path) -> EnvironmentLease:
        """A hold on ``path``'s environment, opened now unless it is open already. CorruptShardError for
        a truncated or damaged file; lmdb.Error or OSError where it cannot be opened."""
        st = path.stat()
        identity = (st.st_dev, st.st_ino)
        with self._lock:
            entry = self._open.get(identity)
            if entry is None:
                entry = self._open[identity] = _Environment(path, identity, st.st_size)
            entry.users += 1
        return EnvironmentLease(self, entry)

    def _release(self, entry: _Environment) -> None:
        with self._lock:
            entry.users -= 1
            if entry.users == 0:
                del self._open[entry.identity]
                if entry.records is not None:
                    entry.records.close()
                entry.env.close()

    def _mapping(self, entry: _Environment) -> LMDBMapping | None:
        with self._lock:
            if entry.start is None:
                entry.start = lmdb_mapping_start(entry.env, entry.places)
                if entry.start is None:
                    return None
            mapping: LMDBMapping | None = entry.mapping() if entry.mapping is not None else None
            if mapping is None:
                # a class of the file's size, so that its instance has the buffer protocol and a __dict__
                array: Any = type("LMDBFileBytes", (LMDBMapping, ctypes.c_char * entry.size), {})
                mapping = array.from_address(entry.start)
                mapping.path, mapping.identity = entry.path, entry.identity
                entry.users += 1  # the mapping's own hold: its views keep the environment open
                weakref.finalize(mapping, self._release, entry)
                entry.mapping = weakref.ref(mapping)
            return mapping


class EnvironmentLease:
    """One user's hold on a file's shared environment (:meth:`Environments.lease`), let go by
    :meth:`release` or, failing that, when the lease is collected."""

    def __init__(self, environments: Environments, entry: _Environment) -> None:
        self._environments = environments
        self._entry = entry
        self.env: lmdb.Environment = entry.env
        self.identity = entry.identity  # the file's (st_dev, st_ino) when it was opened
        self.places: Tree | None = entry.places  # where its records lie (None only where not walked)
        self.release = weakref.finalize(self, environments._release, entry)

    def mapping(self) -> LMDBMapping | None:
        """The file's bytes where the environment maps them (one object while any view of it lives),
        or None for a file without records (:func:`lmdb_mapping_start`)."""
        return self._environments._mapping(self._entry)

    def placed(self) -> tuple[memoryview, Tree] | None:
        """The file's bytes where the environment maps them (:meth:`mapping`), and where each record's
        key and value lie there (:attr:`places`); None where either is missing."""
        mapping = self.mapping()
        if mapping is None or self.places is None:
            return None
        return memoryview(mapping).cast("B"), self.places

    def records(self) -> PlacedRecords:
        """Where each record's key and value lie, for reads of one record at a time
        (:class:`.lmdb_places.PlacedRecords`), from the walk the environment made as it opened where its
        mapping is found (else from a walk of their own): made once while the environment is open, and
        shared by its readers. Made by each reader, they were made again at each reopen of a shard
        (a random access: docs/benchmarks.md, feed-global-records), and an adopted file's tree,
        walked as its environment opened, was walked again. TreeError or OSError where the file cannot
        be read so."""
        entry = self._entry
        if entry.records is None:
            made = PlacedRecords(entry.path, entry.identity, self.placed())  # outside the lock: it may walk
            with self._environments._lock:
                if entry.records is None:
                    entry.records = made
            if entry.records is not made:  # another reader's came first
                made.close()
        return entry.records

    def __enter__(self) -> EnvironmentLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# the process's: LMDB's one-environment-per-file rule is the process's
_ENVIRONMENTS = Environments()


def lease_environment(path: Path) -> EnvironmentLease:
    """A hold on the environment of the LMDB file ``path``, shared with every other reader of the file
    in this process (see the module), with where its records lie (``lease.places``, a
    :class:`~.lmdb_tree.Tree`): a reader scans them from LMDB's mapping."""
    return _ENVIRONMENTS.lease(path)


class LMDBFile:
    """An LMDB shard's environment, taken on first use (shared with every other reader of the file in
    this process: :mod:`.lmdb_env`), and LMDB's own mapping of the file (a
    :class:`~ddpipe.formats.mapped.ShardMapping`): its checksum is taken through the pages LMDB will
    read, so that a shard hashed ahead, on another thread, is then scanned without a page fault on
    the reading thread (32 MB shards of 66 KB samples, warm: a scan through a fresh environment
    took 20 us a sample, 5 once the file was hashed through it). With ``kept``, the mapping it was
    hashed through is kept for the next epoch (:class:`~ddpipe.formats.mapped.KeptMappings`): it
    holds the environment open, which the next epoch's lease then finds, its file's tree walked and
    its pages mapped already."""

    def __init__(self, path: Path, kept: KeptMappings | None = None) -> None:
        self.path = path
        self.size = path.stat().st_size
        self._kept = kept
        self._lease: EnvironmentLease | None = None

    @property
    def opened(self) -> bool:
        """Whether its environment is taken (:meth:`env`)."""
        return self._lease is not None

    @property
    def fits_whole(self) -> bool:
        return self.size <= POPULATE_LIMIT

    def env(self) -> lmdb.Environment:
        return self._taken().env

    def _taken(self) -> EnvironmentLease:
        """The lease on its environment, taken the first time it is asked for."""
        if self._lease is None:
            if self._kept is not None:  # one kept of a file the path no longer names, or resized, let go first
                self._kept.find(self.path, LMDBMapping)
            self._lease = lease_environment(self.path)
        return self._lease

    def placed(self) -> tuple[memoryview, Tree] | None:
        """The file's bytes where LMDB maps them (:meth:`mapping`), and where each record's key and
        value lie there, as the walk before LMDB opened the file found them (:mod:`.lmdb_tree`), in
        key order; None where the mapping is not found (a file without records) or the walk was
        left out (a benchmark's reference)."""
        return self._taken().placed()

    def mapping(self) -> LMDBMapping | None:
        """The file's bytes where LMDB maps them, or None for a file without records. Where the mapping
        starts is found from the address LMDB gives the first record's value (:func:`lmdb_mapping_start`):
        no record is read before the checksum has vouched for the file."""
        return self._taken().mapping()

    def records(self) -> PlacedRecords:
        """Where each record lies, for reads of one at a time (:meth:`.lmdb_env.EnvironmentLease.records`)."""
        return self._taken().records()

    def identity(self) -> tuple[int, int]:
        """The (device, inode) of the file the environment maps."""
        return self._taken().identity

    def prepare(self) -> None:
        """Open the environment and find its mapping (see :meth:`ShardMapping.prepare`)."""
        with contextlib.suppress(OSError, lmdb.Error, CorruptShardError):  # said again by checksum() or the reader
            self.mapping()

    def checksum(self) -> str:
        try:
            mapping = self.mapping()
        except (lmdb.Error, CorruptShardError):  # not a whole LMDB file: its checksum says that it differs
            mapping = None
        if mapping is None:
            return MappedFile(self.path).checksum()
        with memoryview(mapping).cast("B") as view:
            digest = buffer_checksum(view)
        if self._kept is not None and self.fits_whole:
            self._kept.keep(mapping)
        return digest

    def close(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None
