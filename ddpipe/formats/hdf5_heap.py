"""Reading a variable-length ``uint8`` HDF5 dataset straight from the file: written here because
h5py's own vlen read converts every element through HDF5's type machinery, measured at ~1 GB/s on
this machine, which holds cold sequential reads to ~0.6 of the disk; this path runs at the disk's
speed (``benchmarks/formats.py``, "adopted HDF5"). A scan (:class:`VlenHeap`) reads the file's
mapping (mapped.py), the one the shard's checksum is taken through, so that a checked scan reads the
file from the disk once; a random read (:class:`HeapPlaces`) reads each image with ``pread``.

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
from .random_reads import RandomReads

ELEMENT = np.dtype([("length", "<u4"), ("collection", "<u8"), ("index", "<u4")])
_COLLECTION = struct.Struct("<4sB3xQ")
_OBJECT = struct.Struct("<HH4xQ")
_CACHED = 64  # collections kept: several small objects share one, large ones have one each


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

    def _collection(self, content: memoryview, address: int) -> dict[int, tuple[int, int]]:
        cached = self._collections.get(address)
        if cached is not None:
            self._collections.move_to_end(address)
            return cached
        if address + _COLLECTION.size > len(content):
            raise HeapFormatError(f"a global heap collection at {address} lies past the end of the file")
        size = _collection_size(content, address, address)
        objects = _objects(content, address, address, min(address + size, len(content)))
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


class HeapPlaces:
    """Elements of one contiguous vlen ``uint8`` dataset read one at a time with ``pread``
    (random_reads.py: why), not through the file's mapping: a random read of a few of a file's images
    (a rank's share of a global shuffle). Each element's entry in the dataset's table (16 bytes) is
    read alone, the table asked for whole once; an image's collection, which holds it alone where it
    is large, is read with it in one call, its header, the image's and its bytes together."""

    def __init__(self, reads: RandomReads, offset: int, count: int) -> None:
        self._reads = reads
        self._offset = offset
        self._count = count
        # address -> {object index: (data offset, length)}, offsets in the file, of collections read whole
        self._collections: OrderedDict[int, dict[int, tuple[int, int]]] = OrderedDict()
        self._table_asked = False

    def element(self, i: int) -> tuple[int, bytes]:
        """Where the bytes of element ``i`` lie in the file, and the bytes. HeapFormatError where the
        file is not laid out as expected, CorruptShardError where a read runs past its end."""
        if not self._table_asked:
            self._reads.ask(self._offset, self._offset + self._count * ELEMENT.itemsize)
            self._table_asked = True
        entry = self._reads.read(self._offset + i * ELEMENT.itemsize, ELEMENT.itemsize, f"the table's entry {i}")
        length, address, index = (int(v) for v in np.frombuffer(entry, dtype=ELEMENT)[0])
        if length == 0:
            return 0, b""
        objects = self._collections.get(address)
        if objects is not None:
            self._collections.move_to_end(address)
            at = _object_at(objects, index, length, address)
            return at, self._reads.read(at, length, f"image {i}")
        # the collection's header and its first object's, then that object: image i where it is alone
        head = self._reads.read(address, _COLLECTION.size + _OBJECT.size + length, f"image {i}'s collection")
        size = _collection_size(head, 0, address)
        first, _, first_length = _OBJECT.unpack_from(head, _COLLECTION.size)
        if first == index and first_length >= length:
            return address + _COLLECTION.size + _OBJECT.size, head[_COLLECTION.size + _OBJECT.size :]
        whole = self._reads.read(address, size, f"image {i}'s collection")
        objects = _objects(whole, 0, address, size)
        self._collections[address] = objects
        if len(self._collections) > _CACHED:
            self._collections.popitem(last=False)
        at = _object_at(objects, index, length, address)
        return at, whole[at - address : at - address + length]


def _collection_size(content: bytes | memoryview, start: int, address: int) -> int:
    """The size of the collection whose header is at ``start`` in ``content`` (at ``address`` in the
    file), checked for its signature."""
    magic, version, size = _COLLECTION.unpack_from(content, start)
    if magic != b"GCOL" or version != 1 or size < _COLLECTION.size:
        raise HeapFormatError(f"no global heap collection at {address}")
    return int(size)


def _objects(content: bytes | memoryview, start: int, address: int, end: int) -> dict[int, tuple[int, int]]:
    """The objects of the collection at ``start`` in ``content`` (at ``address`` in the file) up to
    ``end`` in ``content``: {index: (where its data lies in the file, its length)}."""
    objects: dict[int, tuple[int, int]] = {}
    at = start + _COLLECTION.size
    while at + _OBJECT.size <= end:
        index, _, length = _OBJECT.unpack_from(content, at)
        if index == 0:
            break
        objects[index] = (address + at - start + _OBJECT.size, length)
        at += _OBJECT.size + (length + 7) // 8 * 8
    return objects


def _object_at(objects: dict[int, tuple[int, int]], index: int, length: int, address: int) -> int:
    where = objects.get(index)
    if where is None or where[1] < length:
        raise HeapFormatError(f"object {index} of the collection at {address} is missing or short")
    return where[0]


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
