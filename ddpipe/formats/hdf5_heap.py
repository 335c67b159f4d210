"""Reading a variable-length ``uint8`` HDF5 dataset straight from the file: written here because
h5py's own vlen read converts every element through HDF5's type machinery, measured at ~1 GB/s on
this machine, which holds cold sequential reads to ~0.6 of the disk; this path runs at the disk's
speed (``benchmarks/formats.py``, "adopted HDF5").

The HDF5 file format (version 1 structures, the spec's "Global Heap" and "Variable-length" sections):
a vlen element stored in a contiguous dataset is 16 bytes, the sequence length (uint32), the
address of a global heap collection (uint64) and the object's index in it (uint32). A collection
is ``"GCOL"``, a version byte, 3 reserved bytes and its size (uint64), then objects, each an index
(uint16), a reference count (uint16), 4 reserved bytes, a size (uint64) and its data padded to 8
bytes; index 0 is the free space that ends it.

Only the layout it understands is read this way: contiguous storage, 8-byte offsets and lengths,
no filters. Anything else (chunked or compressed datasets, other sizes) returns None from
:func:`open_vlen_heap` and h5py's path is used. Every collection read is checked for its signature.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict
from typing import Any

import numpy as np

ELEMENT = np.dtype([("length", "<u4"), ("collection", "<u8"), ("index", "<u4")])
_COLLECTION = struct.Struct("<4sB3xQ")
_OBJECT = struct.Struct("<HH4xQ")
_CACHED = 64  # collections kept: several small objects share one, large ones have one each


class HeapFormatError(ValueError):
    """The file is not laid out as this reader understands: use h5py's path."""


class VlenHeap:
    """The elements of one contiguous vlen ``uint8`` dataset, read from the file with ``pread``."""

    def __init__(self, path: str, offset: int, count: int) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        if hasattr(os, "posix_fadvise"):  # a scan reads the heap in file order: a larger read-ahead
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        self._offset = offset
        self._count = count
        self._collections: OrderedDict[int, tuple[bytes, dict[int, tuple[int, int]]]] = OrderedDict()

    def _collection(self, address: int) -> tuple[bytes, dict[int, tuple[int, int]]]:
        cached = self._collections.get(address)
        if cached is not None:
            self._collections.move_to_end(address)
            return cached
        head = os.pread(self._fd, _COLLECTION.size, address)
        if len(head) < _COLLECTION.size:
            raise HeapFormatError(f"a global heap collection at {address} lies past the end of the file")
        magic, version, size = _COLLECTION.unpack(head)
        if magic != b"GCOL" or version != 1:
            raise HeapFormatError(f"no global heap collection at {address}")
        data = os.pread(self._fd, size, address)
        objects: dict[int, tuple[int, int]] = {}
        at = _COLLECTION.size
        while at + _OBJECT.size <= len(data):
            index, _, length = _OBJECT.unpack_from(data, at)
            if index == 0:
                break
            objects[index] = (at + _OBJECT.size, length)
            at += _OBJECT.size + (length + 7) // 8 * 8
        self._collections[address] = (data, objects)
        if len(self._collections) > _CACHED:
            self._collections.popitem(last=False)
        return data, objects

    def read(self, lo: int, hi: int) -> list[bytes]:
        """The bytes of elements ``lo`` to ``hi - 1``."""
        raw = os.pread(self._fd, (hi - lo) * ELEMENT.itemsize, self._offset + lo * ELEMENT.itemsize)
        elements = np.frombuffer(raw, dtype=ELEMENT)
        out = []
        for length, address, index in zip(elements["length"].tolist(), elements["collection"].tolist(),
                                          elements["index"].tolist(), strict=True):
            if length == 0:
                out.append(b"")
                continue
            data, objects = self._collection(address)
            where = objects.get(index)
            if where is None or where[1] < length:
                raise HeapFormatError(f"object {index} of the collection at {address} is missing or short")
            out.append(data[where[0] : where[0] + length])
        return out

    def close(self) -> None:
        os.close(self._fd)


def open_vlen_heap(file: Any, dataset: Any) -> VlenHeap | None:
    """A :class:`VlenHeap` over ``dataset`` (an h5py vlen uint8 dataset of ``file``), or None when its
    layout is not the one read here."""
    if dataset.chunks is not None or dataset.compression is not None or dataset.ndim != 1:
        return None
    if file.id.get_create_plist().get_sizes() != (8, 8):
        return None
    offset = dataset.id.get_offset()
    count = int(dataset.shape[0])
    if offset is None or dataset.id.get_storage_size() != count * ELEMENT.itemsize:
        return None
    return VlenHeap(file.filename, int(offset), count)
