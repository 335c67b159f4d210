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

import json
import os
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
# Address space only: LMDB grows the file as it writes, so this bounds a shard, not the disk used.
_MAP_SIZE = 1 << 40


def sample_key(index: int) -> bytes:
    return b"%012d" % index


class LMDBReader(ShardReader):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        try:
            self._env = lmdb.open(
                str(self.path), subdir=False, readonly=True, lock=False, readahead=True, max_readers=512
            )
            with self._env.begin() as txn:
                meta = txn.get(META_KEY)
            if meta is None:
                raise self._corrupt("not a ddpipe LMDB shard (no __ddpipe__ record)")
            doc = json.loads(meta)
            if doc.get("layout") != LAYOUT_VERSION:
                raise self._corrupt(f"unsupported LMDB layout {doc.get('layout')!r}")
            self._n = int(doc["samples"])
        except CorruptShardError:
            raise
        except (lmdb.Error, ValueError, KeyError) as e:
            raise self._corrupt(f"unreadable or truncated LMDB shard: {e}") from None

    def __len__(self) -> int:
        return self._n

    def _unpack(self, raw: bytes | None, index: int) -> Sample:
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
        try:
            with self._env.begin() as txn:
                cursor = txn.cursor()
                if start >= self._n or not cursor.set_key(sample_key(start)):
                    if start < self._n:
                        raise self._corrupt(f"sample {start} is missing")
                    return
                i = start
                for key, raw in cursor:
                    if i == self._n:
                        break
                    if key != sample_key(i):
                        raise self._corrupt(f"sample {i} is missing")
                    yield self._unpack(raw, i)
                    i += 1
                if i != self._n:
                    raise self._corrupt(f"expected {self._n} samples, found {i}")
        except lmdb.Error as e:
            raise self._corrupt(f"cannot read: {e}") from None

    def close(self) -> None:
        self._env.close()


class LMDBWriter(ShardWriter):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._env = lmdb.open(
            str(self.tmp_path), subdir=False, lock=False, map_size=_MAP_SIZE, sync=False, metasync=False
        )
        self._txn: Any = self._env.begin(write=True)

    def _write(self, sample: Sample) -> None:
        record = {KEY: sample[KEY], **{name: bytes(sample[name]) for name in field_names(sample)}}
        try:
            self._txn.put(sample_key(self.count), msgpack.packb(record, use_bin_type=True), append=True)
        except lmdb.MapFullError as e:
            raise OSError(28, f"LMDB map full: {e}") from e

    def _finish(self) -> None:
        meta = json.dumps({"layout": LAYOUT_VERSION, "samples": self.count}).encode()
        try:
            self._txn.put(META_KEY, meta, append=True)
            self._txn.commit()
            self._env.sync(True)
        except lmdb.Error as e:
            # LMDB reports a full disk as its own error; carry errno so callers see ENOSPC
            raise OSError(28 if "space" in str(e).lower() else 5, str(e)) from e
        finally:
            self._env.close()

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
