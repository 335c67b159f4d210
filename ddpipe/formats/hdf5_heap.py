"""Reading a variable-length ``uint8`` HDF5 dataset straight from the file: written here because
h5py's own vlen read converts every element through HDF5's type machinery, measured at ~1 GB/s on
this machine, which holds cold sequential reads to ~0.6 of the disk; this path runs at the disk's
speed (``benchmarks/formats.py``, "adopted HDF5"). It reads the file's mapping (mapped.py), the one
the shard's checksum is taken through, so that a checked scan reads the file from the disk once.

The HDF5 file format (version 1 structures, the spec's "Global Heap" and "Variable-length" sections):
a vlen element stored in a contiguous dataset is 16 bytes, the sequence length (uint32), the
address of a global heap collection (uint64) and the object's index in it (uint32). A collection
is ``"GCOL"``, a version byte, 3 reserved bytes and its size (uint64), then objects, each an index
(uint16), a reference count (uint16), 4 reserved bytes, a size (uint64) and its data padded to 8
bytes; index 0 is the free space that ends it.

Only the layout it understands is read this way: contiguous storage, 8-byte offsets and lengths,
no filters. Anything else (chunked or compressed datasets, other sizes) returns None from
:func:`vlen_table` and h5py's path is used. Every collection read is checked for its signature.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Any

import numpy as np

from .mapped import MappedFile

ELEMENT = np.dtype([("length", "<u4"), ("collection", "<u8"), ("index", "<u4")])
_COLLECTION = struct.Struct("<4sB3xQ")
_OBJECT = struct.Struct("<HH4xQ")
_CACHED = 64  # collections kept: several small objects share one, large ones have one each
_ONE_PAGE = 4096


class HeapFormatError(ValueError):
    """The file is not laid out as this reader understands: use h5py's path."""


class VlenHeap:
    """The elements of one contiguous vlen ``uint8`` dataset, read from the file's mapping (mapped.py):
    a check before the scan has paged it in, so the scan reads no byte from the disk again."""

    def __init__(self, file: MappedFile, offset: int, count: int) -> None:
        self._file = file
        self._offset = offset
        self._count = count
        # address -> {object index: (data offset, length)}, offsets in the file
        self._collections: OrderedDict[int, dict[int, tuple[int, int]]] = OrderedDict()
        self._table_asked = False  # the table of elements asked for (see element)

    def _collection(self, content: memoryview, address: int) -> dict[int, tuple[int, int]]:
        cached = self._collections.get(address)
        if cached is not None:
            self._collections.move_to_end(address)
            return cached
        if address + _COLLECTION.size > len(content):
            raise HeapFormatError(f"a global heap collection at {address} lies past the end of the file")
        magic, version, size = _COLLECTION.unpack_from(content, address)
        if magic != b"GCOL" or version != 1:
            raise HeapFormatError(f"no global heap collection at {address}")
        end = min(address + size, len(content))
        objects: dict[int, tuple[int, int]] = {}
        at = address + _COLLECTION.size
        while at + _OBJECT.size <= end:
            index, _, length = _OBJECT.unpack_from(content, at)
            if index == 0:
                break
            objects[index] = (at + _OBJECT.size, length)
            at += _OBJECT.size + (length + 7) // 8 * 8
        self._collections[address] = objects
        if len(self._collections) > _CACHED:
            self._collections.popitem(last=False)
        return objects

    def read(self, lo: int, hi: int, *, from_start: bool = False) -> list[memoryview]:
        """Views of the bytes of elements ``lo`` to ``hi - 1`` in the file's mapping. ``from_start``:
        they are part of a scan from the first element (see :meth:`MappedFile.for_scan`)."""
        content = self._file.for_scan(from_start=from_start)
        table = content[self._offset + lo * ELEMENT.itemsize : self._offset + hi * ELEMENT.itemsize]
        if len(table) != (hi - lo) * ELEMENT.itemsize:
            raise HeapFormatError("the dataset's elements lie past the end of the file")
        elements = np.frombuffer(table, dtype=ELEMENT)
        ask_ahead = not self._file.paged_in
        out = []
        for length, address, index in zip(elements["length"].tolist(), elements["collection"].tolist(),
                                          elements["index"].tolist(), strict=True):
            if length == 0:
                out.append(content[0:0])
                continue
            if ask_ahead:
                self._file.ask_ahead(address)
            where = self._collection(content, address).get(index)
            if where is None or where[1] < length or where[0] + length > len(content):
                raise HeapFormatError(f"object {index} of the collection at {address} is missing or short")
            out.append(content[where[0] : where[0] + length])
        return out

    def element(self, i: int) -> memoryview:
        """A view of the bytes of element ``i`` alone (random access), what it reads asked for first and
        read alone (:meth:`MappedFile.ask`): the dataset's table of elements once, whole (16 bytes an
        element), then the element's collection and bytes together."""
        at, length = self.place(i)
        return self._file.content()[at : at + length]

    def place(self, i: int) -> tuple[int, int]:
        """Where the bytes of element ``i`` lie in the file, and their length (read as :meth:`element`)."""
        content = self._file.content()
        if not self._table_asked:
            self._file.ask(self._offset, self._offset + self._count * ELEMENT.itemsize)
            self._table_asked = True
        at = self._offset + i * ELEMENT.itemsize
        entry = content[at : at + ELEMENT.itemsize]
        if len(entry) != ELEMENT.itemsize:
            raise HeapFormatError("the dataset's elements lie past the end of the file")
        length, address, index = (int(v) for v in np.frombuffer(entry, dtype=ELEMENT)[0])
        if length == 0:
            return 0, 0
        if address not in self._collections:  # its header, the object's, its bytes, and what ends a collection
            self._file.ask(address, address + _COLLECTION.size + _OBJECT.size + length + _ONE_PAGE)
        where = self._collection(content, address).get(index)
        if where is None or where[1] < length or where[0] + length > len(content):
            raise HeapFormatError(f"object {index} of the collection at {address} is missing or short")
        return where[0], length


def vlen_table(file: Any, dataset: Any) -> int | None:
    """Where the table of elements of ``dataset`` (an h5py vlen uint8 dataset of ``file``) lies in
    the file, or None when its layout is not the one read here."""
    if dataset.chunks is not None or dataset.compression is not None or dataset.ndim != 1:
        return None
    if file.id.get_create_plist().get_sizes() != (8, 8):
        return None
    offset = dataset.id.get_offset()
    if offset is None or dataset.id.get_storage_size() != int(dataset.shape[0]) * ELEMENT.itemsize:
        return None
    return int(offset)
