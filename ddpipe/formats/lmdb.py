"""LMDB shards: one file per shard (``subdir=False``, no lock file), readable with plain lmdb.

Layout (version 1)::

    b"000000000000" ... b"%012d" % (N - 1)   sample i, packed with msgpack as a map
                                            {"__key__": str, "<field>": bytes, ...}
    b"__ddpipe__"                           JSON: {"layout": 1, "samples": N}

    env = lmdb.open("shard-000000.lmdb", subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        sample = msgpack.unpackb(txn.get(b"%012d" % i))

Why: zero-padded decimal keys sort in sample order, so a walk in key order is a sequential read of
pages written in that order (one transaction, append mode), and random access is one B-tree
lookup. One record per sample keeps a sample's fields together on disk.

ddpipe reads them where the walk of the file's tree that guards LMDB found them (:mod:`.lmdb_tree`):
a scan (and the ``__ddpipe__`` record) from LMDB's mapping, a random read with ``pread``; LMDB itself
only opens the file (and reads a file without records).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from ..errors import CorruptShardError
from ..sample import KEY, Sample, field_names
from .base import ShardFormat, ShardReader, ShardWriter
from .learnt import FileVersion, Learnt, LearntOfFile
from .lmdb_env import LMDBFile
from .lmdb_places import Keys, MappedKeys, PlacedRecords, Placement
from .lmdb_tree import TreeError
from .mapped import ShardMapping

LAYOUT_VERSION = 1
META_KEY = b"__ddpipe__"
# Commit every this many samples: one transaction's dirty-page list is bounded (MDB_TXN_FULL).
_SAMPLES_PER_TXN = 4096
# Address space only: LMDB grows the file as it writes, so this bounds a shard, not the disk used.
_MAP_SIZE = 1 << 40


def sample_key(index: int) -> bytes:
    return b"%012d" % index


class NumberedKeys(Keys):
    """The keys of a shard of ddpipe's own, in key order (each sample's :func:`sample_key`, then
    ``META_KEY``), made as they are asked for: a placement kept of a shard (:class:`LMDBReader`)
    holds 16 bytes a sample, its values' places, and no key."""

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples + 1

    def _key(self, index: int) -> bytes:
        return sample_key(index) if index < self.samples else META_KEY

    @classmethod
    def of(cls, keys: Keys, samples: int) -> NumberedKeys | None:
        """``keys`` as numbered keys, where they are those of a shard of ``samples`` samples; else None."""
        numbered = cls(samples)
        return numbered if len(keys) == len(numbered) and list(keys) == list(numbered) else None


def record_views(whole: memoryview, at: int, end: int) -> Sample | None:
    """The record at ``whole[at:end]`` as :class:`LMDBWriter` packs it (a msgpack map of up to 15
    entries, string keys, the sample key a string and every field bytes), each field a view of
    ``whole``; None for any other record (msgpack then unpacks it, and says what is wrong with a
    damaged one). Parsing the map here cost less than half of unpacking it, which copies every field."""
    if not 0 <= at < end <= len(whole):
        return None
    head = whole[at]
    if head & 0xF0 != 0x80:  # fixmap
        return None
    at += 1
    sample: Sample = {}
    try:
        for _ in range(head & 0x0F):
            t = whole[at]
            if t & 0xE0 == 0xA0:  # fixstr
                n, at = t & 0x1F, at + 1
            elif t == 0xD9:  # str 8
                n, at = whole[at + 1], at + 2
            else:
                return None
            name, at = str(whole[at : at + n], "utf-8"), at + n
            t = whole[at]
            if t == 0xC6:  # bin 32: an image
                n, at = int.from_bytes(whole[at + 1 : at + 5], "big"), at + 5
            elif t == 0xC4:  # bin 8: a label
                n, at = whole[at + 1], at + 2
            elif t == 0xC5:  # bin 16
                n, at = int.from_bytes(whole[at + 1 : at + 3], "big"), at + 3
            elif t & 0xE0 == 0xA0 or t == 0xD9:  # the sample's key
                n, at = (t & 0x1F, at + 1) if t != 0xD9 else (whole[at + 1], at + 2)
                if at + n > end:
                    return None
                sample[name], at = str(whole[at : at + n], "utf-8"), at + n
                continue
            else:
                return None
            if at + n > end:
                return None
            sample[name], at = whole[at : at + n], at + n
    except (IndexError, UnicodeDecodeError):
        return None
    return sample if at == end else None


class LMDBReader(ShardReader):
    """Opens its environment on first use, through its :class:`LMDBFile`: a check of the shard's
    checksum hashes the file through LMDB's own mapping, so a scan after it finds every page in.

    A reader of a file read sample by sample (each sample checked against its digest) or unchecked
    is given ``learnt``, where its records lie in its version of the file, if a reader of it found
    them before (learnt.py): one whose placement is known reads its records at those places without
    opening an environment or walking the file's tree again, and a reader that found a placement
    keeps it for the next (a rank's share of a global shuffle opens each shard for a few samples
    every epoch, and the open and the walk cost more than reading them)."""

    def __init__(self, path: str | os.PathLike[str], learnt: LearntOfFile[Placement] | None = None) -> None:
        super().__init__(path)
        self._file = LMDBFile(self.path)
        self._samples: int | None = None
        self._placed: PlacedRecords | None = None  # made on the first random read
        self._own_placed = False  # made by this reader from a known placement, not its environment's
        self._learnt = learnt
        self._known = learnt.known if learnt is not None else None
        if self._known is not None:
            self._samples = len(self._known.keys) - 1

    @property
    def _env(self) -> lmdb.Environment:
        return self._open()[0]

    def mapped_file(self) -> LMDBFile:
        return self._file

    def adopt_mapping(self, mapped: ShardMapping) -> None:
        if isinstance(mapped, LMDBFile) and not self._file.opened:
            self._file.close()
            self._file = mapped

    def _open(self) -> tuple[lmdb.Environment, int]:
        if self._samples is not None:
            return self._file.env(), self._samples
        try:
            env = self._file.env()
            meta = self._meta_record(env)
            if meta is None:
                raise self._corrupt("not a ddpipe LMDB shard (no __ddpipe__ record)")
            doc = json.loads(meta)
            if doc.get("layout") != LAYOUT_VERSION:
                raise self._corrupt(f"unsupported LMDB layout {doc.get('layout')!r}")
            self._samples = int(doc["samples"])
        except (lmdb.Error, ValueError, KeyError) as e:  # a CorruptShardError raised above is a ValueError
            self._file.close()
            if isinstance(e, CorruptShardError):
                raise
            raise self._corrupt(f"unreadable or truncated LMDB shard: {e}") from None
        return env, self._samples

    def _meta_record(self, env: lmdb.Environment) -> bytes | None:
        """The ``__ddpipe__`` record (the last, in key order) where the walk found it, as a scan reads
        its records (:meth:`_placed_records`); LMDB's, where its mapping is not found."""
        placed = self._file.placed()
        if placed is None:
            with env.begin() as txn:
                meta: bytes | None = txn.get(META_KEY)
                return meta
        whole, tree = placed
        record = MappedKeys(whole, tree).find(META_KEY, guess=len(tree.key_at) - 1)
        if record is None:
            return None
        at = int(tree.value_at[record])
        return bytes(whole[at : at + int(tree.value_size[record])])

    def __len__(self) -> int:
        return self._samples if self._samples is not None else self._open()[1]

    def _unpack(self, raw: bytes | memoryview | None, index: int) -> Sample:
        if raw is None:
            raise self._corrupt(f"sample {index} is missing")
        try:
            sample: Sample = msgpack.unpackb(raw, raw=False)
        except (ValueError, msgpack.UnpackException) as e:
            raise self._corrupt(f"sample {index} is corrupt: {e}") from None
        return sample

    def __getitem__(self, index: int) -> Sample:
        i = self._check_index(index)
        if self._placed is None:  # where each record lies, from the tree's pages (lmdb_places.PlacedRecords)
            try:
                self._placed = self._records()
            except (TreeError, OSError) as e:
                raise self._corrupt(f"unreadable or truncated LMDB shard: {e}") from None
        record = self._placed.keys.find(sample_key(i), guess=i)  # sample i is record i in a shard of ddpipe's
        try:
            raw = self._placed.value(record) if record is not None else None
        except (TreeError, OSError) as e:
            raise self._corrupt(f"cannot read sample {i}: {e}") from None
        return self._unpack(raw, i)

    def scan(self, start: int = 0) -> Iterator[Sample]:
        placed = self._placed_records(start)
        if placed is None:
            return (self._unpack(raw, i) for i, raw in self._cursor_records(start))
        whole, records = placed
        return (self._unpack(whole[at:end], i) for i, at, end in records)

    def scan_views(self, start: int = 0) -> Iterator[Sample]:
        """:meth:`scan`, each field a view of the file where LMDB maps it (:class:`LMDBMapping`), which
        keeps the environment open while any view of it lives; where that mapping is not found (a
        file without records), copies as :meth:`scan` gives."""
        placed = self._placed_records(start)
        if placed is None:
            yield from self.scan(start)
            return
        whole, records = placed
        for i, at, end in records:
            sample = record_views(whole, at, end)
            yield sample if sample is not None else self._unpack(whole[at:end], i)

    def _placed_records(self, start: int) -> tuple[memoryview, Iterator[tuple[int, int, int]]] | None:
        """LMDB's mapping of the file, and each sample's position and where its record starts and ends
        there, from ``start`` on, as the tree walk found them (every place within the file): no call
        into LMDB a record. A cursor's every step let go of the interpreter lock, and took it back only
        once the thread holding it let go: beside a thread running Python a scan took tens of times as
        long as alone. None where the mapping is not found (:meth:`_cursor_records` then)."""
        _, n = self._open()
        placed = self._file.placed()
        if placed is None:
            return None
        whole, tree = placed

        def records() -> Iterator[tuple[int, int, int]]:
            if start >= n:
                return
            first = MappedKeys(whole, tree).find(sample_key(start), guess=start)  # not start if one before is missing
            if first is None:
                raise self._corrupt(f"sample {start} is missing")
            stop = min(first + n - start, len(tree.key_at))  # records past the last: a sample missing, said below
            key_at, key_size = tree.key_at[first:stop].tolist(), tree.key_size[first:stop].tolist()
            value_at, value_size = tree.value_at[first:stop].tolist(), tree.value_size[first:stop].tolist()
            for i in range(start, n):
                j = i - start
                if j >= len(key_at) or whole[key_at[j] : key_at[j] + key_size[j]] != sample_key(i):
                    raise self._corrupt(f"sample {i} is missing")
                yield i, value_at[j], value_at[j] + value_size[j]

        return whole, records()

    def _cursor_records(self, start: int) -> Iterator[tuple[int, memoryview]]:
        """Each sample's position and record from ``start`` on, found by LMDB's cursor, the record a view
        of LMDB's mapping valid until the next (buffers: unpacked straight from the map, a copy fewer
        than bytes)."""
        env, n = self._open()
        try:
            with env.begin(buffers=True) as txn:
                cursor = txn.cursor()
                if start >= n or not cursor.set_key(sample_key(start)):
                    if start < n:
                        raise self._corrupt(f"sample {start} is missing")
                    return
                i = start
                for key, raw in cursor:
                    if i == n:
                        break
                    if key != sample_key(i):
                        raise self._corrupt(f"sample {i} is missing")
                    yield i, raw
                    i += 1
                if i != n:
                    raise self._corrupt(f"expected {n} samples, found {i}")
        except lmdb.Error as e:
            raise self._corrupt(f"cannot read: {e}") from None

    def _records(self) -> PlacedRecords:
        """Where each record lies: at the places known for this version of the file, where a reader of
        it found them before (read at them without an environment: see the class), else as its
        environment's walk found them, then kept for the next reader."""
        learnt = self._learnt
        if self._known is not None and learnt is not None and not self._file.opened:
            self._own_placed = True
            return PlacedRecords(self.path, learnt.identity, placement=self._known)
        _, samples = self._open()
        records = self._file.records()
        if self._known is None and learnt is not None \
                and self._file.identity() == learnt.identity:  # the file opened is the version named
            keys = NumberedKeys.of(records.keys, samples)
            if keys is not None:
                placed = records.placement
                learnt.learn(Placement(keys, placed.value_at, placed.value_size), samples)
        return records

    def close(self) -> None:
        if self._placed is not None and self._own_placed:
            self._placed.close()
        self._placed = None  # its environment's, closed with it, unless its own
        self._file.close()


class LMDBWriter(ShardWriter):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._env = lmdb.open(
            str(self.tmp_path), subdir=False, lock=False, map_size=_MAP_SIZE, sync=False, metasync=False
        )
        self._txn: Any = self._env.begin(write=True)
        self._bytes = 0

    def _write(self, sample: Sample) -> None:
        record = {KEY: sample[KEY], **{name: bytes(sample[name]) for name in field_names(sample)}}
        packed = msgpack.packb(record, use_bin_type=True)
        with self._lmdb_errors():
            self._txn.put(sample_key(self.count), packed, append=True)
            if (self.count + 1) % _SAMPLES_PER_TXN == 0:
                self._txn.commit()
                self._txn = self._env.begin(write=True)
        self._bytes += len(packed)

    def _finish(self) -> None:
        meta = json.dumps({"layout": LAYOUT_VERSION, "samples": self.count}).encode()
        try:
            with self._lmdb_errors():
                self._txn.put(META_KEY, meta, append=True)
                self._txn.commit()  # no sync here: whoever commits the shard flushes it (atomic.Finished)
        finally:
            self._env.close()

    @contextlib.contextmanager
    def _lmdb_errors(self) -> Iterator[None]:
        """LMDB reports a failed write at commit as EIO; call it ENOSPC when the device is out of space."""
        try:
            yield
        except lmdb.Error as e:
            full = isinstance(e, lmdb.MapFullError) or shutil.disk_usage(self.tmp_path.parent).free < self._bytes
            raise OSError(errno.ENOSPC if full else errno.EIO, f"LMDB write failed: {e}") from e

    def _close_quietly(self) -> None:
        try:
            self._txn.abort()
        finally:
            self._env.close()


class LMDBFormat(ShardFormat):
    name = "lmdb"
    suffix = ".lmdb"
    reads_mapped = True
    copies_cheaply = True
    pages_in_ahead = True

    def __init__(self) -> None:
        super().__init__()
        # where each record lies in files read sample by sample or unchecked, by version: LMDBReader
        self.placements = Learnt[FileVersion, Placement]()  # this dataset's: each made by get_format

    def reader(self, path: str | os.PathLike[str]) -> ShardReader:
        return LMDBReader(path)

    def reader_of(self, path: str | os.PathLike[str], checksum: str | None, *, vouched: bool = False,
                  by_sample: bool = False) -> ShardReader:
        """Read sample by sample (or unchecked), from where its records lie in this version of the file,
        where a reader of it found them before (:class:`LMDBReader`)."""
        return LMDBReader(path, LearntOfFile.of(self.placements, path) if by_sample else None)

    def mapping(self, path: str | os.PathLike[str], *, keep: bool = False) -> ShardMapping:
        return LMDBFile(Path(path), self.kept if keep else None)

    def writer(self, path: str | os.PathLike[str]) -> ShardWriter:
        return LMDBWriter(path)

    def sidecar_files(self, path: str | os.PathLike[str]) -> list[Path]:
        return []
