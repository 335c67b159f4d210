"""The pages LMDB follows to find records (its meta pages and its B-tree's branch and leaf pages),
checked before LMDB opens a file.

Why: LMDB trusts its file. It follows the page numbers and sizes a page holds without bounds, so a
damaged page makes it read past the file's end (SIGBUS) or fail an assertion (SIGABRT): the
process dies, whatever Python does. A shard of ddpipe's own is hashed whole before it is read, but
not with ``verify=False``; an adopted LMDB is checked record by record (one file that many ranks
each read a part of), and a record's digest comes too late for the pages LMDB crossed to reach it.
So every LMDB file is walked first, with bounds on everything (:func:`tree_pages`: every page
number within the file, every node within its page, every value within the file, the counts the
meta page records): a damaged file is then an error naming it, and what LMDB reads after is where
the walk found it. It reads the tree's pages, a few percent of a file of images (the values live in
overflow pages, which it does not read); its cost beside the read it guards: benchmarks/lmdb_tree.py.

The walk also finds where each record's key and value lie (:func:`walk_tree`), every place bounded
within the file: random reads read a record there (lmdb_places.py), and an adopted LMDB's
keys come from there (:func:`tree_keys`), where LMDB, finding a record or listing keys, touches each
record's first page through its mapping, and with it the kernel's read-ahead window around it.

The on-disk layout read here is LMDB 0.9's (``mdb.c``: ``MDB_page``, ``MDB_meta``, ``MDB_db``,
``MDB_node``), on a 64-bit little-endian machine, which is how every LMDB file it maps is laid out.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

PAGE_HEADER = 16
_HEADER = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size
_DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow pages, entries, root
_MAGIC, _VERSION = 0xBEEFC0DE, 1
P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
_MAIN_DB_AT = PAGE_HEADER + 8 + 8 + 8 + _DB.size  # after magic, version, address, map size and the free DB
_TXNID_AT = _MAIN_DB_AT + _DB.size + 8
_T = TypeVar("_T")


class TreeError(ValueError):
    """An LMDB file whose pages do not hold together (or hold what ddpipe does not adopt)."""


def page_size(data: bytes | memoryview | mmap.mmap) -> int:
    """The page size the file's first meta page records (the free database's ``md_pad``)."""
    if len(data) < PAGE_HEADER + 8 + 8 + 8 + 4:
        raise TreeError("shorter than an LMDB meta page")
    psize: int = struct.unpack_from("<I", data, PAGE_HEADER + 8 + 8 + 8)[0]
    if psize < 512 or psize > 65536 or psize & (psize - 1):
        raise TreeError(f"its meta page gives a page size of {psize}")
    return psize


@dataclass(frozen=True)
class Tree:
    """What a walk found: the tree's pages (sorted) and, in key order, where each record's key and
    value lie in the file and their lengths (a value in overflow pages where its first page's data
    starts), every one within the file."""

    pages: list[int]
    key_at: np.ndarray
    key_size: np.ndarray
    value_at: np.ndarray
    value_size: np.ndarray


def tree_pages(data: bytes | memoryview | mmap.mmap) -> list[int]:
    """The branch and leaf pages of the main database of the LMDB file ``data``, found from its newer
    meta page, every read bounded; TreeError for anything that does not hold together."""
    return walk_tree(data).pages


def walk_tree(data: bytes | memoryview | mmap.mmap) -> Tree:
    """The walk of :func:`tree_pages`, and where the records' keys lie."""
    psize = page_size(data)
    pages = len(data) // psize
    _, db_flags, depth, branches, leaves, overflows, entries, root = _DB.unpack_from(data, _newest_meta(data, psize)
                                                                                     + _MAIN_DB_AT)
    if db_flags & 0x04:  # MDB_DUPSORT
        raise TreeError("a database of duplicate keys, not one value a key")
    if entries and not 1 <= depth <= 64:
        raise TreeError(f"a tree of depth {depth}")
    branch_pages: list[int] = []
    seen: set[int] = set()
    level_pages = [root] if entries else []
    # level by level, each level's pages asked for at once (_will_need): a page at a time, a cold file's
    # walk waited on the disk once a page
    for level in range(1, depth if entries else 1):
        _will_need(data, level_pages, psize)
        children: list[int] = []
        for page in level_pages:  # branch pages one by one (a few in a thousand pages)
            if not 2 <= page < pages or page in seen:
                raise TreeError(f"page {page} is outside the file or reached twice")
            seen.add(page)
            branch_pages.append(page)
            children += _branch_children(data, page, psize, level)
            if len(children) > pages:
                raise TreeError(f"more pages at depth {level + 1} than the file holds")
        level_pages = children
    leaf_pages = level_pages
    records = runs = 0
    key_at = key_size = value_at = value_size = np.zeros(0, dtype=np.int64)
    if entries:
        _will_need(data, leaf_pages, psize)
        whole = np.frombuffer(data, np.uint8, pages * psize)
        runs, key_at, key_size, value_at, value_size = _leaf_records(whole, np.asarray(leaf_pages, dtype=np.int64),
                                                                     psize)
        records = len(key_at)
    tree = branch_pages + leaf_pages
    if len(set(tree)) != len(tree):
        raise TreeError("a page is reached twice")
    if (len(branch_pages), len(leaf_pages), runs, records) != (branches, leaves, overflows, entries):
        raise TreeError(f"its tree holds {len(branch_pages)} branch pages, {len(leaf_pages)} leaf pages, {runs} "
                        f"overflow pages and {records} records; its meta page says {branches}, {leaves}, "
                        f"{overflows} and {entries}")
    return Tree(sorted(tree), key_at, key_size, value_at, value_size)


def _newest_meta(data: bytes | memoryview | mmap.mmap, psize: int) -> int:
    """Where the meta page of the newest transaction lies (of the two LMDB writes in turn), both checked."""
    metas = []
    for number in (0, 1):
        if (number + 1) * psize > len(data):
            raise TreeError("shorter than its two meta pages")
        at = number * psize
        magic, version = struct.unpack_from("<II", data, at + PAGE_HEADER)
        if _HEADER.unpack_from(data, at)[2] & P_META == 0 or magic != _MAGIC or version != _VERSION:
            raise TreeError(f"page {number} is not an LMDB meta page")
        metas.append((struct.unpack_from("<Q", data, at + _TXNID_AT)[0], at))
    return max(metas)[1]


def _branch_children(data: bytes | memoryview | mmap.mmap, page: int, psize: int, level: int) -> list[int]:
    """The pages a branch page at depth ``level`` points to, its header and nodes checked."""
    at = page * psize
    number, _, flags, lower, upper = _HEADER.unpack_from(data, at)
    count = (lower - PAGE_HEADER) // 2
    if number != page or lower < PAGE_HEADER or lower > upper or upper > psize or count < 1:
        raise TreeError(f"page {page}: its header does not hold together")
    if flags & (P_BRANCH | P_LEAF | P_LEAF2 | P_OVERFLOW | P_META) != P_BRANCH:
        raise TreeError(f"page {page}: a branch page was expected at depth {level}")
    children = []
    for slot in range(count):
        node = struct.unpack_from("<H", data, at + PAGE_HEADER + 2 * slot)[0]
        if not upper <= node <= psize - _NODE.size:
            raise TreeError(f"page {page}: node {slot} lies outside the page")
        lo, hi, node_flags, key_size = _NODE.unpack_from(data, at + node)
        if node + _NODE.size + key_size > psize:
            raise TreeError(f"page {page}: node {slot} runs past the page")
        children.append(lo | hi << 16 | node_flags << 32)
    return children


def _will_need(data: bytes | memoryview | mmap.mmap, pages: list[int], psize: int) -> None:
    """Ask the kernel for the mapped file's ``pages`` at once, each run of consecutive ones in one call, so
    that the disk serves them together (pages outside the file are left to the walk's checks). Runs
    only: asked for whole, a span of a file of small records with gaps between its runs walked 7
    times slower here than its runs asked for one by one."""
    if not isinstance(data, mmap.mmap):
        return
    runs: list[list[int]] = []  # [first, last] of each run
    for page in sorted({page for page in pages if 0 <= page < len(data) // psize}):
        if runs and page == runs[-1][1] + 1:
            runs[-1][1] = page
        else:
            runs.append([page, page])
    for first, last in runs:
        start = first * psize
        aligned = start - start % mmap.PAGESIZE  # madvise takes whole memory pages
        data.madvise(mmap.MADV_WILLNEED, aligned, (last + 1) * psize - aligned)


def _gather(data: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` bytes of ``data`` from each offset in ``at``, one row each."""
    return data[at[:, None] + np.arange(width)]


def _leaf_records(data: np.ndarray, leaves: np.ndarray,
                  psize: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(overflow pages, then where each record's key and value start in the file and their lengths) of
    the leaf pages ``leaves`` of the file's bytes ``data``, records in key order, every header, node
    and value bounded, all pages' nodes at once (a node at a time in Python cost about a microsecond
    a record)."""
    if ((leaves < 2) | (leaves >= len(data) // psize)).any():
        raise TreeError("a leaf page is outside the file")
    starts = leaves.astype(np.int64) * psize
    header = _gather(data, starts, PAGE_HEADER)
    numbers = header[:, :8].copy().view("<i8").ravel()  # past 2**63: negative, no page
    flags, lower, upper = header[:, 10:].copy().view("<u2").astype(np.int64).T
    counts = (lower - PAGE_HEADER) // 2
    bad = (numbers != leaves) | (lower < PAGE_HEADER) | (lower > upper) | (upper > psize) | (counts < 1) \
        | (flags & (P_BRANCH | P_LEAF | P_LEAF2 | P_OVERFLOW | P_META) != P_LEAF)
    if bad.any():
        raise TreeError(f"page {leaves[bad.argmax()]}: not a leaf page whose header holds together")
    page_of = np.repeat(np.arange(len(leaves)), counts)  # each node's page, and its slot there
    slots = np.arange(len(page_of)) - np.repeat(np.cumsum(counts) - counts, counts)
    nodes = _gather(data, starts[page_of] + PAGE_HEADER + 2 * slots, 2).view("<u2").ravel().astype(np.int64)
    outside = (nodes < upper[page_of]) | (nodes > psize - _NODE.size)
    if outside.any():
        raise TreeError(f"page {leaves[page_of[outside.argmax()]]}: a node lies outside the page")
    lo, hi, node_flags, key_size = _gather(data, starts[page_of] + nodes, _NODE.size).view("<u2") \
        .astype(np.int64).T
    if (node_flags & (F_SUBDATA | F_DUPDATA)).any():
        raise TreeError("records in sub-databases or duplicates, not one value a key")
    ends, sizes, big = nodes + _NODE.size + key_size, lo | hi << 16, (node_flags & F_BIGDATA) != 0
    past = ends + np.where(big, 8, sizes) > psize
    if past.any():
        raise TreeError(f"page {leaves[page_of[past.argmax()]]}: a node runs past the page")
    firsts = _gather(data, starts[page_of[big]] + ends[big], 8).view("<u8").ravel()
    runs = ((PAGE_HEADER - 1 + sizes[big]) // psize + 1).astype(np.uint64)
    pages = np.uint64(len(data) // psize)
    if ((firsts < 2) | (firsts >= pages) | (firsts + runs > pages)).any():  # no wrapping past 2**64
        raise TreeError("a record's value lies outside the file")
    inline = starts[page_of] + ends
    inline[big] = firsts.astype(np.int64) * psize + PAGE_HEADER
    return int(runs.sum()), starts[page_of] + nodes + _NODE.size, key_size, inline, sizes


def check_tree(path: Path) -> list[int]:
    """The tree's pages (:func:`tree_pages`) of the LMDB file at ``path``, read through a mapping of its
    own, bounded: TreeError unless it holds together (a file cut short too, never a fault)."""
    return file_tree(path).pages


def file_tree(path: Path, identity: tuple[int, int] | None = None) -> Tree:
    """The walk of :func:`check_tree`, whole: where each record lies too. ``identity``: the (device,
    inode) the file must be (the one an environment maps), else TreeError."""
    fd = open_as(path, identity)
    try:
        return walk_file(path, lambda data, tree: tree, fd=fd)
    finally:
        os.close(fd)


def open_as(path: Path, identity: tuple[int, int] | None) -> int:
    """A descriptor of ``path``, which must be the file ``identity`` (device, inode) where given: the
    one an environment maps, whatever the path names now. TreeError where it is another."""
    fd = os.open(path, os.O_RDONLY)
    st = os.fstat(fd)
    if identity is not None and (st.st_dev, st.st_ino) != identity:
        os.close(fd)
        raise TreeError("replaced since it was opened")
    return fd


def tree_keys(path: Path) -> list[bytes]:
    """Every record's key of the LMDB file at ``path``, in LMDB's order, read from its leaf pages by the
    walk of :func:`check_tree`. LMDB's own cursor, listing keys, also reads each record's first
    page, which reads the kernel's read-ahead window around it: the whole file, for a list of keys."""
    return walk_file(path, _keys)


def _keys(data: mmap.mmap, tree: Tree) -> list[bytes]:
    return [data[at : at + size] for at, size in zip(tree.key_at.tolist(), tree.key_size.tolist(), strict=True)]


def walk_file(path: Path, result: Callable[[mmap.mmap, Tree], _T], fd: int | None = None) -> _T:
    """``result`` of the walk of the file at ``path`` (or open as ``fd``), through a mapping of its own."""
    with open(path, "rb") if fd is None else open(os.dup(fd), "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise TreeError("an empty file")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    # each page read alone: a fault on a page otherwise reads the kernel's read-ahead window around it
    # (8 MB here), and the tree's pages lie all through the file: a cold walk of an LMDB of images read
    # most of the file (benchmarks/lmdb_tree.py)
    data.madvise(mmap.MADV_RANDOM)
    try:
        out = result(data, walk_tree(data))
    except TreeError as e:  # raised again once the mapping is closed: its traceback holds views of it
        error: TreeError | None = TreeError(str(e))
    else:
        error = None
    data.close()
    if error is not None:
        raise error
    return out
