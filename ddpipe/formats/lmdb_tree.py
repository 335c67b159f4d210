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
overflow pages, which it does not read), at about a microsecond a record.

The on-disk layout read here is LMDB 0.9's (``mdb.c``: ``MDB_page``, ``MDB_meta``, ``MDB_db``,
``MDB_node``), on a 64-bit little-endian machine, which is how every LMDB file it maps is laid out.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

PAGE_HEADER = 16
_HEADER = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size
_DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow pages, entries, root
_MAGIC, _VERSION = 0xBEEFC0DE, 1
P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
_MAIN_DB_AT = PAGE_HEADER + 8 + 8 + 8 + _DB.size  # after magic, version, address, map size and the free DB
_TXNID_AT = _MAIN_DB_AT + _DB.size + 8


class TreeError(ValueError):
    """An LMDB file whose pages do not hold together (or hold what ddpipe does not adopt)."""


def page_size(data: bytes | mmap.mmap) -> int:
    """The page size the file's first meta page records (the free database's ``md_pad``)."""
    if len(data) < PAGE_HEADER + 8 + 8 + 8 + 4:
        raise TreeError("shorter than an LMDB meta page")
    psize: int = struct.unpack_from("<I", data, PAGE_HEADER + 8 + 8 + 8)[0]
    if psize < 512 or psize > 65536 or psize & (psize - 1):
        raise TreeError(f"its meta page gives a page size of {psize}")
    return psize


def tree_pages(data: bytes | mmap.mmap) -> list[int]:
    """The branch and leaf pages of the main database of the LMDB file ``data``, found from its newer
    meta page, every read bounded; TreeError for anything that does not hold together."""
    psize = page_size(data)
    pages = len(data) // psize
    metas = []
    for number in (0, 1):
        if (number + 1) * psize > len(data):
            raise TreeError("shorter than its two meta pages")
        at = number * psize
        magic, version = struct.unpack_from("<II", data, at + PAGE_HEADER)
        if _HEADER.unpack_from(data, at)[2] & P_META == 0 or magic != _MAGIC or version != _VERSION:
            raise TreeError(f"page {number} is not an LMDB meta page")
        metas.append((struct.unpack_from("<Q", data, at + _TXNID_AT)[0], at))
    _, meta = max(metas)
    _, db_flags, depth, branches, leaves, overflows, entries, root = _DB.unpack_from(data, meta + _MAIN_DB_AT)
    if db_flags & 0x04:  # MDB_DUPSORT
        raise TreeError("a database of duplicate keys, not one value a key")
    found: dict[int, int] = {}  # page -> its flags
    counted = {"overflow": 0, "entries": 0}

    def walk(page: int, level: int) -> None:
        if not 2 <= page < pages or page in found:
            raise TreeError(f"page {page} is outside the file or reached twice")
        at = page * psize
        number, _, flags, lower, upper = _HEADER.unpack_from(data, at)
        found[page] = flags
        count = (lower - PAGE_HEADER) // 2
        if number != page or lower < PAGE_HEADER or lower > upper or upper > psize or count < 1:
            raise TreeError(f"page {page}: its header does not hold together")
        leaf = level == depth
        if flags & (P_BRANCH | P_LEAF | P_LEAF2 | P_OVERFLOW | P_META) != (P_LEAF if leaf else P_BRANCH):
            raise TreeError(f"page {page}: a {'leaf' if leaf else 'branch'} page was expected at depth {level}")
        for slot in range(count):
            node = struct.unpack_from("<H", data, at + PAGE_HEADER + 2 * slot)[0]
            if not upper <= node <= psize - _NODE.size:
                raise TreeError(f"page {page}: node {slot} lies outside the page")
            lo, hi, node_flags, key_size = _NODE.unpack_from(data, at + node)
            end = node + _NODE.size + key_size
            if not leaf:
                if end > psize:
                    raise TreeError(f"page {page}: node {slot} runs past the page")
                walk(lo | hi << 16 | node_flags << 32, level + 1)
                continue
            size = lo | hi << 16
            if node_flags & (F_SUBDATA | F_DUPDATA):
                raise TreeError("records in sub-databases or duplicates, not one value a key")
            if node_flags & F_BIGDATA:
                if end + 8 > psize:
                    raise TreeError(f"page {page}: node {slot} runs past the page")
                first = struct.unpack_from("<Q", data, at + end)[0]
                runs = (PAGE_HEADER - 1 + size) // psize + 1
                if first < 2 or (first + runs) * psize > len(data):
                    raise TreeError(f"page {page}: record {slot}'s value lies outside the file")
                counted["overflow"] += runs
            elif end + size > psize:
                raise TreeError(f"page {page}: node {slot} runs past the page")
            counted["entries"] += 1

    if entries:
        if not 1 <= depth <= 64:
            raise TreeError(f"a tree of depth {depth}")
        walk(root, 1)
    held = sum(1 for f in found.values() if f & P_BRANCH), sum(1 for f in found.values() if f & P_LEAF)
    if held != (branches, leaves) or (counted["overflow"], counted["entries"]) != (overflows, entries):
        raise TreeError(f"its tree holds {held[0]} branch pages, {held[1]} leaf pages, {counted['overflow']} "
                        f"overflow pages and {counted['entries']} records; its meta page says {branches}, "
                        f"{leaves}, {overflows} and {entries}")
    return sorted(found)


def check_tree(path: Path) -> None:
    """TreeError unless the LMDB file at ``path`` holds together (:func:`tree_pages`), read through a
    mapping of its own, bounded: a file cut short is a TreeError, never a fault."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise TreeError("an empty file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            tree_pages(data)
