"""A tar's regular files (name, data offset, size), read from its headers at the pace of the disk.

Python's ``tarfile`` takes ~50 us a member to list a tar (a TarInfo built, every field decoded), so
indexing ImageNet's 2.5 million members in tars took minutes. The common headers are read here
instead: ustar and GNU ones, PAX extended headers (their ``path``), GNU long names and directories.
Anything else (a bad header checksum, links, sparse files, global PAX headers, a size past ustar's
8 GB, a name that is not ASCII) returns None, and the caller lists the tar with ``tarfile``:
what is read here is what ``tarfile`` reads, and what is not is ``tarfile``'s to judge.
"""

from __future__ import annotations

import mmap
import os

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_FILE_TYPES = (b"0", b"\0")
_DIRECTORY = b"5"
_PAX, _GNU_LONG_NAME = b"x", b"L"
# PAX keys that say nothing of where a file's data lie or what it is called
_PAX_IGNORED = frozenset({"mtime", "atime", "ctime", "uid", "gid", "uname", "gname", "mode", "comment"})

Listed = list[tuple[str, int, int]]  # (name, data offset, size) of each regular file, in order


def list_plain_tar(path: str | os.PathLike[str]) -> Listed | None:
    """The tar's regular files, or None where it holds anything read otherwise (see the module)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < _BLOCK:
            return None  # empty or cut short: tarfile's error
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _walk(data, size)


def _walk(data: mmap.mmap, size: int) -> Listed | None:
    listed: Listed = []
    at = 0
    name: str | None = None  # from a PAX header or a GNU long name, for the next header
    extended = False  # whether the header before was one of those
    while at + _BLOCK <= size:
        header = data[at : at + _BLOCK]
        if header == _ZERO_BLOCK:
            return listed if not extended else None
        recorded = _octal(header[148:156])
        if recorded is None or recorded != sum(header) - sum(header[148:156]) + 8 * 32:
            return None
        kind = header[156:157]
        member_size = _octal(header[124:136])
        if member_size is None:
            return None
        body = at + _BLOCK
        if extended and kind in (_PAX, _GNU_LONG_NAME):
            return None  # two in a row: tarfile merges them in an order of its own
        extended = kind in (_PAX, _GNU_LONG_NAME)
        if kind in _FILE_TYPES:
            own = _text(header[0:100])
            prefix = _text(header[345:500])
            if own is None or prefix is None:
                return None
            if kind == b"\0" and own.endswith("/"):  # an old tar's directory
                name, at = None, body
                continue
            listed.append((name if name is not None else f"{prefix}/{own}" if prefix else own, body, member_size))
            at = body + -(-member_size // _BLOCK) * _BLOCK
            name = None
        elif kind == _DIRECTORY:
            name, at = None, body
        elif kind in (_PAX, _GNU_LONG_NAME):
            if body + member_size > size:
                return None
            content = data[body : body + member_size]
            if kind == _PAX:
                read, name = _pax_path(content)
            else:
                name = _text(content)
                read = name is not None
            if not read:
                return None
            at = body + -(-member_size // _BLOCK) * _BLOCK
        else:
            return None
    # no end-of-archive block: whole only where the last member ends the file; a header or data cut
    # short is tarfile's to judge (it refuses some and passes others)
    return listed if at == size and not extended else None


def _octal(field: bytes) -> int | None:
    digits = field.split(b"\0", 1)[0].strip(b" ")
    if not digits:
        return 0
    try:
        return int(digits, 8)
    except ValueError:
        return None  # base-256, or not a number: tarfile's


def _text(field: bytes) -> str | None:
    raw = field.split(b"\0", 1)[0]
    return raw.decode("ascii") if raw.isascii() else None


def _pax_path(content: bytes) -> tuple[bool, str | None]:
    """Whether a PAX extended header was read, and its ``path`` record if it has one; not read when it
    has other records that matter (a size, say), or is malformed."""
    name: str | None = None
    at = 0
    while at < len(content):
        space = content.find(b" ", at)
        if space < 0:
            return False, None
        try:
            record_length = int(content[at:space])
        except ValueError:
            return False, None
        record = content[space + 1 : at + record_length]
        if record_length <= space - at or not record.endswith(b"\n") or b"=" not in record:
            return False, None
        key, value = record[:-1].split(b"=", 1)
        if key == b"path" and value.isascii():
            name = value.decode("ascii")
        elif key.decode("ascii", "replace") not in _PAX_IGNORED:
            return False, None
        at += record_length
    return True, name
