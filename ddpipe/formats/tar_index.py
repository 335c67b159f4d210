"""DALI's index of a WebDataset tar shard, and the tar's headers it is built from and checked against.

Beside ``shard-000000.tar`` lies ``shard-000000.idx`` in DALI's ``wds2idx`` format (v1.2): a line
``v1.2 <samples>``, then one line per sample listing ``<ext> <data offset> <size> <member name>``
for each of its members. DALI's ``fn.readers.webdataset(index_paths=...)`` reads it, and so does
ddpipe (tar.py) for random access and for sequential reads that skip tar header parsing. A sample is
a run of consecutive members sharing a key, the member name up to the first dot of its last path
component (the rule of the ``webdataset`` library and of DALI).
"""

from __future__ import annotations

import itertools
import os
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..checksum import buffer_checksum
from .tar_scan import Listed, list_plain_tar

IDX_VERSION = "v1.2"
# (extension, data offset, size, member name) of one tar member
Member = tuple[str, int, int, str]


def split_member_name(name: str) -> tuple[str, str]:
    """``"a/b.seg.png"`` -> ``("a/b", "seg.png")``: the WebDataset and DALI rule."""
    dot = name.find(".", name.rfind("/") + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]


def index_path(shard: str | os.PathLike[str]) -> Path:
    """Where DALI (and ddpipe) look for a tar shard's index: the same stem with ``.idx``."""
    return Path(shard).with_suffix(".idx")


def scan_tar_members(path: str | os.PathLike[str]) -> list[list[Member]]:
    """Read a tar's headers (skipping the data) and group its members into samples.

    Raises :class:`CorruptShardError` for a truncated or malformed archive.
    """
    from ..errors import CorruptShardError

    groups: list[list[Member]] = []
    last_key: str | None = None
    first_of: dict[str, str] = {}  # each sample's first member, to name one whose files are apart
    for name, offset, length in _regular_files(path):
        key, ext = split_member_name(name)
        base = key.rsplit("/", 1)[-1]
        if not base or not ext or base.startswith("."):
            continue  # hidden or extension-less files are not sample fields (as in webdataset)
        member = (ext, offset, length, name)
        if key == last_key:
            if any(m[0] == ext for m in groups[-1]):
                raise CorruptShardError(f"sample {key!r} has field {ext!r} twice", path=path)
            groups[-1].append(member)
        else:
            if key in first_of:
                raise CorruptShardError(
                    f"the files of sample {key!r} are not together ({first_of[key]!r}, then other samples' "
                    f"files, then {name!r}): readers group a sample's adjacent files only; pack the "
                    "tar with `tar --sort=name`", path=path)
            first_of[key] = name
            groups.append([member])
            last_key = key
    size = os.path.getsize(path)
    for group in groups:
        for _, offset, length, name in group:
            if offset + length > size:
                raise CorruptShardError(f"truncated tar: member {name!r} runs past the end", path=path)
    return groups


def _regular_files(path: str | os.PathLike[str]) -> Listed:
    """(name, data offset, size) of the tar's regular files: read from its headers where they are the
    common kinds (tar_scan.py), else as Python's tarfile lists them."""
    from ..errors import CorruptShardError

    listed = list_plain_tar(path)
    if listed is not None:
        return listed
    try:
        with tarfile.open(path, mode="r:") as tf:
            return [(info.name, info.offset_data, info.size) for info in tf if info.isfile()]
    except (tarfile.TarError, EOFError) as e:
        raise CorruptShardError(f"truncated or corrupt tar: {e}", path=path) from None


def format_dali_index(groups: list[list[Member]]) -> str:
    lines = [f"{IDX_VERSION} {len(groups)}"]
    for group in groups:
        lines.append(" ".join(f"{ext} {offset} {size} {name}" for ext, offset, size, name in group))
    return "\n".join(lines) + "\n"


def parse_dali_index(text: str, path: str | os.PathLike[str]) -> list[list[Member]]:
    from ..errors import CorruptShardError

    lines = text.splitlines()
    try:
        head = lines[0].split() if lines else []
        if len(head) != 2 or not head[1].isdecimal():
            raise ValueError(f"its first line is {lines[0][:60] if lines else ''!r}, not '{IDX_VERSION} <samples>'")
        version, count = head
        if version != IDX_VERSION:
            raise ValueError(f"version {version!r}, expected {IDX_VERSION}")
        rows = list(map(str.split, lines[1:]))
        for parts in rows:
            if not parts or len(parts) % 4:
                raise ValueError(f"bad line {' '.join(parts)!r}")
        if len(rows) != int(count):
            raise ValueError(f"header says {count} samples, found {len(rows)}")
        # the members are made in one pass over all the tokens, not tuple by tuple (a third less time
        # per sample), with one string per extension however many members have it (a fifth less memory
        # for the indexes a dataset keeps: KnownIndexes)
        tokens = list(itertools.chain.from_iterable(rows))
        members = list(zip(map(sys.intern, tokens[0::4]), map(int, tokens[1::4]), map(int, tokens[2::4]), tokens[3::4],
                           strict=True))
    except (IndexError, ValueError) as e:
        raise CorruptShardError(f"bad DALI index: {e}", path=path) from None
    groups, at = [], 0
    for parts in rows:
        n = len(parts) // 4
        groups.append(members[at : at + n])
        at += n
    return groups


def read_dali_index(path: str | os.PathLike[str]) -> list[list[Member]]:
    return _parse_index_bytes(Path(path).read_bytes(), path)


def _parse_index_bytes(data: bytes, path: str | os.PathLike[str]) -> list[list[Member]]:
    from ..errors import CorruptShardError

    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise CorruptShardError("bad DALI index: not ASCII text", path=path) from None
    return parse_dali_index(text, path)


@dataclass(frozen=True)
class ParsedIndex:
    """A DALI index file as parsed, named by the digest of its bytes."""

    digest: str
    groups: list[list[Member]]  # shared by every reader given it: read, never changed
    end: int  # where the data of its furthest member ends


class KnownIndexes:
    """The DALI indexes a dataset's reads have parsed, by the digest of their bytes, and the shards
    (by checksum) each was found to agree with. A rank reads the same shards every epoch (sticky
    assignment): parsing each index again and checking it against its tar's headers again took about
    a tenth of a reading process's processor time (benchmarks/feed.py). The same index bytes parse
    the same, and agree with the same shard bytes, so a changed index, or a shard whose bytes no
    longer hash to what its check found, is parsed and checked afresh. Kept up to ``limit`` members
    (a few hundred bytes each; ImageNet has 2.6 million): indexes past it are parsed each time.
    Shared by a dataset's reading threads: each step is one dictionary or set operation."""

    LIMIT = 1_000_000

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._parsed: dict[str, ParsedIndex] = {}
        self._agreed: set[tuple[str, str]] = set()  # (index digest, shard checksum)
        self._last_agreed: dict[str, ParsedIndex] = {}  # by shard checksum: the index last found to agree
        self._members = 0

    def read(self, path: Path) -> ParsedIndex:
        """The index file at ``path``, parsed (:class:`CorruptShardError` for a bad one)."""
        data = path.read_bytes()
        digest = buffer_checksum(data)
        known = self._parsed.get(digest)
        if known is None:
            groups = _parse_index_bytes(data, path)
            known = ParsedIndex(digest, groups, max((o + s for g in groups for _, o, s, _ in g), default=0))
            members = sum(map(len, groups))
            if self._members + members <= self.limit:
                self._parsed[digest] = known
                self._members += members
        return known

    def agree(self, digest: str, checksum: str) -> bool:
        """An index of ``digest`` was found to agree with a shard whose bytes hash to ``checksum``."""
        return (digest, checksum) in self._agreed

    def agreed(self, digest: str, checksum: str) -> None:
        parsed = self._parsed.get(digest)
        if parsed is not None:  # kept for as long as the parse it names
            self._agreed.add((digest, checksum))
            self._last_agreed[checksum] = parsed

    def last_agreed(self, checksum: str) -> ParsedIndex | None:
        """The index last found to agree with a shard whose bytes hash to ``checksum``, if kept."""
        return self._last_agreed.get(checksum)

    def __reduce__(self) -> tuple[type[KnownIndexes], tuple[int]]:
        return KnownIndexes, (self.limit,)  # a process sent the dataset parses its own


def check_dali_index(shard: str | os.PathLike[str]) -> None:
    """Raise :class:`CorruptShardError` unless the shard's index, if it has one, agrees with its tar
    headers (a shard without one, adopted with ``--out`` in a directory not to be written, is read by
    scanning them)."""
    from ..errors import CorruptShardError

    idx = index_path(shard)
    if not idx.exists():
        return
    if read_dali_index(idx) != scan_tar_members(shard):
        raise CorruptShardError("DALI index disagrees with the tar; rebuild it with 'ddpipe index'", path=idx)


def write_dali_index(shard: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None) -> int:
    """Scan ``shard`` and write its DALI index to ``dest`` (default beside it); return the sample count."""
    groups = scan_tar_members(shard)
    Path(dest or index_path(shard)).write_text(format_dali_index(groups))
    return len(groups)


def check_index_against_headers(shard: str | os.PathLike[str], groups: list[list[Member]],
                                content: memoryview) -> None:
    """Raise :class:`CorruptShardError` unless every index entry points at its member's data: the tar
    header just before it names the same member and size. An index edited to swap two offsets
    would otherwise swap two samples silently. ``content``: the shard's bytes (its mapping)."""
    from ..errors import CorruptShardError

    members = [(offset, size, name) for group in groups for _, offset, size, name in group]
    for i in np.flatnonzero(~_plain_headers_match(content, members)).tolist():
        offset, size, name = members[i]
        header = bytes(content[offset - 512 : offset]) if offset >= 512 else b""
        if not _header_matches(header, name, size):
            raise CorruptShardError(f"DALI index entry {name!r} (offset {offset}) does not match the tar "
                                    "header there: the index was changed; rebuild it with 'ddpipe index'",
                                    path=index_path(shard))


def _plain_headers_match(content: memoryview, members: list[tuple[int, int, str]]) -> np.ndarray:
    """Per member, whether its header is the plain one ddpipe, Python's tarfile and GNU tar write for
    it (its whole name in the name field, NUL-padded, no prefix, the size as 11 octal digits and
    NUL), compared for all members at once: a header check member by member took ~2 us each, 8% of
    reading an epoch without decoding. False only means "parse this one" (:func:`_header_matches`)."""
    data = np.frombuffer(content, dtype=np.uint8)
    blocks = data[: len(data) // 512 * 512].reshape(-1, 512)  # a tar is 512-byte blocks, headers among them
    offsets = np.array([m[0] for m in members], dtype=np.int64)
    block = offsets // 512 - 1
    aligned = (offsets % 512 == 0) & (block >= 0) & (block < len(blocks))
    headers = blocks[np.where(aligned, block, 0)]
    names = np.frombuffer(b"".join(m[2].encode().ljust(100, b"\0")[:100] for m in members), dtype=np.uint8)
    sizes = np.frombuffer(b"".join(b"%011o\0" % m[1] for m in members), dtype=np.uint8)
    ok: np.ndarray = aligned & np.all(headers[:, :100] == names.reshape(-1, 100), axis=1)
    ok &= np.all(headers[:, 124:136] == sizes.reshape(-1, 12), axis=1)
    ok &= headers[:, 345] == 0
    return ok


def _header_matches(header: bytes, name: str, size: int) -> bool:
    if len(header) != 512:
        return False
    try:
        recorded = int(header[124:136].strip(b"\0 ") or b"0", 8)
    except ValueError:
        return False
    short = header[:100].split(b"\0", 1)[0]
    prefix = header[345:500].split(b"\0", 1)[0]
    full = prefix + b"/" + short if prefix else short
    wanted = name.encode()
    # a name over 100 bytes lives in a PAX or GNU header before this one, truncated here
    return recorded == size and (full == wanted or (len(wanted) > 100 and short == wanted[:100]))
