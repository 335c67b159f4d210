"""HDF5 shards: one file per shard, laid out for sequential reads.

Layout (version 1), readable with plain h5py::

    /                      attrs: ddpipe_layout=1, samples=N
    /fields/<name>/data     uint8 [total bytes]   every sample's bytes of this field, back to back
    /fields/<name>/offsets  int64 [N + 1]         sample i is data[offsets[i]:offsets[i + 1]]
    /fields/<name>/present  uint8 [N]             1 where sample i has this field
    /fields/__key__/...     the keys, UTF-8, in the same scheme

    f = h5py.File("shard-000000.h5"); g = f["fields/jpg"]; o = g["offsets"]
    jpeg = g["data"][o[i]:o[i + 1]].tobytes()

Why: datasets are contiguous and uncompressed, so a sequential scan reads each field in a few
large ``pread`` calls (blocks of many samples) and random access is one small read; per-sample
datasets or variable-length types would cost an HDF5 object lookup per sample.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..errors import CorruptShardError
from ..sample import KEY, Sample
from .atomic import is_disk_full
from .base import ShardFormat, ShardReader, ShardWriter

LAYOUT_VERSION = 1
# Samples are read in blocks of about this many bytes per field during a scan.
_BLOCK_BYTES = 8 << 20


class HDF5Reader(ShardReader):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        try:
            self._file = h5py.File(self.path, "r")
            if self._file.attrs.get("ddpipe_layout") != LAYOUT_VERSION:
                raise self._corrupt("not a ddpipe HDF5 shard (no ddpipe_layout attribute)")
            self._n = int(self._file.attrs["samples"])
            fields = self._file["fields"]
            self._data: dict[str, Any] = {}
            self._offsets: dict[str, np.ndarray[Any, Any]] = {}
            self._present: dict[str, np.ndarray[Any, Any]] = {}
            for name in fields:
                g = fields[name]
                self._data[name] = g["data"]
                self._offsets[name] = g["offsets"][()]
                self._present[name] = g["present"][()].astype(bool)
                if len(self._offsets[name]) != self._n + 1 or self._offsets[name][-1] != g["data"].shape[0]:
                    raise self._corrupt(f"field {name!r}: offsets disagree with its data")
        except CorruptShardError:
            raise
        except (OSError, KeyError, ValueError) as e:
            raise self._corrupt(f"unreadable or truncated HDF5 shard: {e}") from None
        if KEY not in self._data:
            raise self._corrupt("no keys stored")

    def __len__(self) -> int:
        return self._n

    def _read(self, name: str, lo: int, hi: int) -> bytes:
        try:
            return bytes(self._data[name][lo:hi].tobytes())
        except OSError as e:
            raise self._corrupt(f"cannot read field {name!r}: {e}") from None

    def __getitem__(self, index: int) -> Sample:
        i = self._check_index(index)
        sample: Sample = {}
        for name, off in self._offsets.items():
            if self._present[name][i]:
                value = self._read(name, int(off[i]), int(off[i + 1]))
                sample[name] = value.decode() if name == KEY else value
        return sample

    def scan(self, start: int = 0) -> Iterator[Sample]:
        # Plain lists and one reused buffer per field: numpy scalars and a fresh 8 MB array per block
        # cost more than the read itself when the data is in the page cache.
        names = list(self._offsets)
        offsets = {name: self._offsets[name].tolist() for name in names}
        present = {name: self._present[name].tolist() for name in names}
        buffers = {name: np.empty(0, dtype=np.uint8) for name in names}
        i = start
        while i < self._n:
            hi = i + 1  # a block of samples whose largest field stays near _BLOCK_BYTES
            while hi < self._n and max(offsets[name][hi + 1] - offsets[name][i] for name in names) <= _BLOCK_BYTES:
                hi += 1
            for name in names:
                lo, size = offsets[name][i], offsets[name][hi] - offsets[name][i]
                if len(buffers[name]) < size:
                    buffers[name] = np.empty(max(size, _BLOCK_BYTES), dtype=np.uint8)
                try:
                    if size:
                        self._data[name].read_direct(buffers[name], np.s_[lo : lo + size], np.s_[0:size])
                except OSError as e:
                    raise self._corrupt(f"cannot read field {name!r}: {e}") from None
            for j in range(i, hi):
                sample: Sample = {}
                for name in names:
                    if present[name][j]:
                        base = offsets[name][i]
                        value = buffers[name][offsets[name][j] - base : offsets[name][j + 1] - base].tobytes()
                        sample[name] = value.decode() if name == KEY else value
                yield sample
            i = hi

    def close(self) -> None:
        self._file.close()


class HDF5Writer(ShardWriter):
    """Buffers one shard's samples in memory (a shard is bounded by the target shard size)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._chunks: dict[str, list[bytes]] = {}
        self._present: dict[str, list[int]] = {}

    def _write(self, sample: Sample) -> None:
        for name in list(self._chunks):
            if name not in sample:
                self._chunks[name].append(b"")
                self._present[name].append(0)
        for name, value in sample.items():
            data = value.encode() if name == KEY else bytes(value)
            if name not in self._chunks:
                self._chunks[name] = [b""] * self.count
                self._present[name] = [0] * self.count
            self._chunks[name].append(data)
            self._present[name].append(1)

    def _finish(self) -> None:
        try:
            self._write_file()
        except (OSError, RuntimeError) as e:
            # HDF5 reports a failed flush on close as RuntimeError; keep the errno visible to callers
            raise OSError(errno.ENOSPC if is_disk_full(e) else errno.EIO, f"HDF5 write failed: {e}") from e
        finally:
            self._chunks.clear()

    def _write_file(self) -> None:
        with h5py.File(self.tmp_path, "w", track_order=False) as f:
            f.attrs["ddpipe_layout"] = LAYOUT_VERSION
            f.attrs["samples"] = self.count
            fields = f.create_group("fields")
            for name in sorted(self._chunks):
                chunks = self._chunks[name]
                g = fields.create_group(name)
                offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
                np.cumsum([len(c) for c in chunks], out=offsets[1:])
                data = np.frombuffer(b"".join(chunks), dtype=np.uint8)
                g.create_dataset("data", data=data, track_times=False)
                g.create_dataset("offsets", data=offsets, track_times=False)
                g.create_dataset("present", data=np.array(self._present[name], dtype=np.uint8), track_times=False)


class HDF5Format(ShardFormat):
    name = "hdf5"
    suffix = ".h5"

    def reader(self, path: str | os.PathLike[str]) -> ShardReader:
        return HDF5Reader(path)

    def writer(self, path: str | os.PathLike[str]) -> ShardWriter:
        return HDF5Writer(path)

    def sidecar_files(self, path: str | os.PathLike[str]) -> list[Path]:
        return []
