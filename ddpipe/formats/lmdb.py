"""LMDB shards: one file per shard (``subdir=False``, no lock file), readable with plain lmdb.

Layout (version 1)::

    b"000000000000" ... b"%012d" % (N - 1)   sample i, packed with msgpack as a map
                                            {"__key__": str, "<field>": bytes, ...}
    b"__ddpipe__"                           JSON: {"layout": 1, "samples": N}

    env = lmdb.open("shard-000000.lmdb", subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        sample = msgpack.unpackb(txn.get(b"%012d" % i))

Why: zero-padded decimal keys sort in sample order, so a cursor walk is a sequential read of
pages written in that order (one transaction, append mode), and random access is one B-tree
lookup. One record per sample keeps a sample's fields together on disk.
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

LAYOUT_VERSION = 1
META_KEY = b"__ddpipe__"
# Commit every this many samples: one transaction's dirty-page list is bounded (MDB_TXN_FULL).
_SAMPLES_PER_TXN = 4096
# Address space only: LMDB grows the file as it writes, so this bounds a shard, not the disk used.
_MAP_SIZE = 1 << 40


def sample_key(index: int) -> bytes:
    return b"%012d" % index


def open_whole(path: Path) -> lmdb.Environment:
    """The LMDB file ``path``, read-only and without a lock file, once it is known to hold every page it
    names: pages are read through mmap, and a truncated file would kill the process with SIGBUS
    rather than raise."""
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=True, max_readers=512)
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    if path.stat().st_size < needed:
        env.close()
        raise CorruptShardError(f"truncated LMDB: {path.stat().st_size} bytes, its pages need {needed}", path=path)
    return env


class LMDBReader(ShardReader):
    """Opens its environment on first use: a check of the shard's checksum, which pages the whole file
    in at once, then comes first, and the opening reads pages already in memory (cold, opening first
    cost ~10 ms a 64 MB shard in scattered reads of its meta pages and its last leaf, a fifth of a
    checked read's time)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._opened: tuple[lmdb.Environment, int] | None = None

    @property
    def _env(self) -> lmdb.Environment:
        return self._open()[0]

    def _open(self) -> tuple[lmdb.Environment, int]:
        if self._opened is not None:
            return self._opened
        env = None
        try:
            env = open_whole(self.path)
            with env.begin() as txn:
                meta = txn.get(META_KEY)
            if meta is None:
                raise self._corrupt("not a ddpipe LMDB shard (no __ddpipe__ record)")
            doc = json.loads(meta)
            if doc.get("layout") != LAYOUT_VERSION:
                raise self._corrupt(f"unsupported LMDB layout {doc.get('layout')!r}")
            self._opened = env, int(doc["samples"])
        except (lmdb.Error, ValueError, KeyError) as e:  # a CorruptShardError raised above is a ValueError
            if env is not None:
                env.close()
            if isinstance(e, CorruptShardError):
                raise
            raise self._corrupt(f"unreadable or truncated LMDB shard: {e}") from None
        return self._opened

    def __len__(self) -> int:
        return self._open()[1]

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
        try:
            with self._env.begin(buffers=False) as txn:
                return self._unpack(txn.get(sample_key(i)), i)
        except lmdb.Error as e:
            raise self._corrupt(f"cannot read sample {i}: {e}") from None

    def scan(self, start: int = 0) -> Iterator[Sample]:
        env, n = self._open()
        try:
            # buffers: each value is unpacked straight from the map (valid until the cursor moves), a copy
            # fewer than taking it as bytes first
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
                    yield self._unpack(raw, i)
                    i += 1
                if i != n:
                    raise self._corrupt(f"expected {n} samples, found {i}")
        except lmdb.Error as e:
            raise self._corrupt(f"cannot read: {e}") from None

    def close(self) -> None:
        if self._opened is not None:
            self._opened[0].close()


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
                self._txn.commit()
                self._env.sync(True)
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

    def reader(self, path: str | os.PathLike[str]) -> ShardReader:
        return LMDBReader(path)

    def writer(self, path: str | os.PathLike[str]) -> ShardWriter:
        return LMDBWriter(path)

    def sidecar_files(self, path: str | os.PathLike[str]) -> list[Path]:
        return []
