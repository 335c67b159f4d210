"""HDF5 shards: one file per shard, laid out for sequential reads.

Layout (version 1), readable with plain h5py::

    /                      attrs: ddpipe_layout=1, samples=N
    /fields/<name>/data     uint8 [total bytes]   every sample's bytes of this field, back to back
    /fields/<name>/offsets  int64 [N + 1]         sample i is data[offsets[i]:offsets[i + 1]]
    /fields/<name>/present  uint8 [N]             1 where sample i has this field
    /fields/__key__/...     the keys, UTF-8, in the same scheme

    f = h5py.File("shard-000000.h5"); g = f["fields/jpg"]; o = g["offsets"]
    jpeg = g["data"][o[i]:o[i + 1]].tobytes()

Why: datasets are contiguous and uncompressed, so a sequential scan reads each field front to back
and random access is one small read, both straight from the file's mapping at the place HDF5 gives
for the data set; per-sample datasets or variable-length types would cost an HDF5 object lookup per
sample.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..errors import CorruptShardError
from ..sample import KEY, Sample, owned
from .atomic import is_disk_full
from .base import ShardFormat, ShardReader, ShardWriter
from .learnt import FileVersion, Learnt, LearntOfFile
from .mapped import MappedFile, ShardMapping
from .random_reads import RandomReads

LAYOUT_VERSION = 1


@dataclass(frozen=True)
class ShardLayout:
    """Where a shard's fields lie in its file, as h5py found them: each field's first byte, each
    sample's offsets from it, and which samples have it."""

    samples: int
    base: dict[str, int]
    offsets: dict[str, list[int]]
    present: dict[str, list[bool]]


class HDF5Reader(ShardReader):
    """Reads a ddpipe HDF5 shard through h5py for its layout, and each field's bytes from the file's
    mapping (mapped.py) at the data set's place in the file: a checked scan then reads the file from
    the disk once, where reading the data sets through h5py after the check read it twice. Given
    ``layout`` (the file's bytes are known to be those of a shard it was found in), h5py is not asked.
    Samples read one at a time from a file not mapped are read with ``pread`` (random_reads.py)."""

    def __init__(self, path: str | os.PathLike[str], layout: ShardLayout | None = None) -> None:
        super().__init__(path)
        self._mapped = MappedFile(self.path)
        self._reads_mapped = False  # through the mapping: one adopted, asked for, or scanned; else pread
        self._reads = RandomReads(self.path)  # samples read one at a time from a file not mapped
        self.layout = layout if layout is not None else self._read_layout()
        self._n = self.layout.samples
        self._base = self.layout.base  # where each field's data starts in the file
        self._offsets = self.layout.offsets
        self._present = self.layout.present

    def _read_layout(self) -> ShardLayout:
        base: dict[str, int] = {}
        every_offsets: dict[str, list[int]] = {}
        present: dict[str, list[bool]] = {}
        try:
            with h5py.File(self.path, "r") as file:
                if file.attrs.get("ddpipe_layout") != LAYOUT_VERSION:
                    raise self._corrupt("not a ddpipe HDF5 shard (no ddpipe_layout attribute)")
                n = int(file.attrs["samples"])
                fields = file["fields"]
                for name in fields:
                    g = fields[name]
                    base[name] = self._data_place(name, g["data"])
                    offsets = np.asarray(g["offsets"][()])
                    present[name] = g["present"][()].astype(bool).tolist()
                    if offsets.shape != (n + 1,) or offsets[0] != 0 or offsets[-1] != g["data"].shape[0] \
                            or (np.diff(offsets) < 0).any() or len(present[name]) != n:
                        raise self._corrupt(f"field {name!r}: offsets disagree with its data")
                    every_offsets[name] = offsets.tolist()
        except CorruptShardError:
            raise
        except (OSError, KeyError, ValueError, RuntimeError, TypeError) as e:  # h5py: RuntimeError for some damage
            raise self._corrupt(f"unreadable or truncated HDF5 shard: {e}") from None
        if KEY not in every_offsets:
            raise self._corrupt("no keys stored")
        return ShardLayout(n, base, every_offsets, present)

    def _data_place(self, name: str, data: Any) -> int:
        """Where a field's bytes start in the file: ddpipe writes them contiguous and unfiltered."""
        if not isinstance(data, h5py.Dataset) or data.chunks is not None or data.compression is not None \
                or data.ndim != 1:
            raise self._corrupt(f"field {name!r}: its data is not stored as one contiguous run")
        size = int(data.shape[0])
        place = data.id.get_offset()
        if size == 0:
            return 0
        if place is None or place + size > self._mapped.size:
            raise self._corrupt(f"truncated HDF5 shard: field {name!r} lies past the end of the file")
        return int(place)

    def __len__(self) -> int:
        return self._n

    def _sample(self, content: memoryview, i: int) -> Sample:
        """The ``i``-th sample, its fields views of ``content`` (its key a string)."""
        sample: Sample = {}
        for name, off in self._offsets.items():
            if self._present[name][i]:
                base = self._base[name]
                value = content[base + off[i] : base + off[i + 1]]
                sample[name] = self._key(value, i) if name == KEY else value
        return sample

    def _key(self, stored: memoryview, i: int) -> str:
        try:
            return str(stored, "utf-8")
        except UnicodeDecodeError:
            raise self._corrupt(f"sample {i}: its key is not UTF-8") from None

    def __getitem__(self, index: int) -> Sample:
        i = self._check_index(index)
        if not self._reads_mapped:
            return self._read_sample(i)
        content = self._mapped.for_scan(from_start=False)
        for name, off in self._offsets.items():  # this sample's bytes alone
            if self._present[name][i]:
                self._mapped.ask(self._base[name] + off[i], self._base[name] + off[i + 1])
        return owned(self._sample(content, i))

    def _read_sample(self, i: int) -> Sample:
        """The ``i``-th sample read with ``pread``, a call for each field, from a file not mapped
        (random_reads.py: why); a sample's fields, which lie apart, asked for together first, so that
        a cold sample's reads wait on the disk once."""
        places = [(name, self._base[name] + off[i], off[i + 1] - off[i])
                  for name, off in self._offsets.items() if self._present[name][i]]
        if len(places) > 1:
            for _, at, size in places:
                self._reads.ask(at, at + size)
        sample: Sample = {}
        for name, at, size in places:
            data = self._reads.read(at, size, f"truncated HDF5 shard: sample {i}'s field {name!r}")
            sample[name] = self._key(memoryview(data), i) if name == KEY else data
        return sample

    def scan(self, start: int = 0) -> Iterator[Sample]:
        return map(owned, self.scan_views(start))

    def scan_views(self, start: int = 0) -> Iterator[Sample]:
        # views, as tar shards give them: DALI reads them in place, where a copy of each image cost the
        # reading thread (and the interpreter lock) more than parsing the sample did
        self._reads_mapped = True
        content = self._mapped.for_scan(from_start=start == 0)
        ask_ahead = not self._mapped.paged_in
        images = max(self._offsets, key=lambda name: self._offsets[name][-1])  # the field that is most bytes
        for i in range(start, self._n):
            if ask_ahead:
                self._mapped.ask_ahead(self._base[images] + self._offsets[images][i])
            yield self._sample(content, i)

    def mapped_file(self) -> MappedFile:
        self._reads_mapped = True  # asked for to be hashed, or read, through it
        return self._mapped

    def adopt_mapping(self, mapped: ShardMapping) -> None:
        if isinstance(mapped, MappedFile):  # the mapping this format's files have
            self._mapped = mapped
            self._reads_mapped = True

    def close(self) -> None:
        self._mapped.close()
        self._reads.close()


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
    reads_mapped = True
    pages_in_ahead = True
    name = "hdf5"
    suffix = ".h5"

    def __init__(self) -> None:
        super().__init__()
        # the layouts its reads found (learnt.py), by the checksum of the bytes a checked read found one
        # in; and by file version, for reads sample by sample or unchecked: opening a shard through h5py
        # cost about a fifth of what reading it through a kept mapping costs. A few hundred bytes a sample
        self.layouts = Learnt[str, ShardLayout]()
        self.file_layouts = Learnt[FileVersion, ShardLayout]()

    def reader(self, path: str | os.PathLike[str]) -> ShardReader:
        return HDF5Reader(path)

    def reader_of(self, path: str | os.PathLike[str], checksum: str | None, *, vouched: bool = False,
                  by_sample: bool = False) -> ShardReader:
        """Opened from a layout found before where one is known: of a file of the manifest's bytes, or,
        read sample by sample (a rank's share of a global shuffle may open a shard for a few samples
        an epoch, and h5py's open cost more than reading them), of this version of the file. A file read
        so that has changed since without its size or time changing reads at the old places: its
        samples' digests then differ, or an unchecked read reads what it finds, as it would anyway."""
        if checksum is not None:
            return HDF5Reader(path, self.layouts.get(checksum))
        learnt = LearntOfFile.of(self.file_layouts, path) if by_sample else None
        if learnt is None:
            return HDF5Reader(path)
        reader = HDF5Reader(path, learnt.known)
        learnt.learn(reader.layout, reader.layout.samples)
        return reader

    def verify(self, reader: ShardReader, checksum: str, actual: str | None = None) -> None:
        super().verify(reader, checksum, actual)
        if isinstance(reader, HDF5Reader):
            # the bytes it was found in are the manifest's
            self.layouts.learn(checksum, reader.layout, reader.layout.samples)

    def writer(self, path: str | os.PathLike[str]) -> ShardWriter:
        return HDF5Writer(path)

    def sidecar_files(self, path: str | os.PathLike[str]) -> list[Path]:
        return []
