"""Writing WebDataset tar shards and their DALI index in one pass.

The writer records where each member's data lands as it writes it, so the index is written from
those offsets rather than by reading the finished tar's headers back (a third of a conversion's time
once the images were read). A plain member's header is built here: the bytes Python's ``tarfile``
writes for it (a ustar header, as its PAX format writes for a short ASCII name), in a tenth of its
time; a member that needs a PAX header (a name over 100 bytes, or not ASCII) is left to ``tarfile``.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
from pathlib import Path

from ..sample import KEY, Sample, field_names
from .base import ShardWriter
from .tar_index import Member, format_dali_index, index_path

_BLOCK = 512
_RECORD = 20 * _BLOCK  # tarfile pads the archive to whole records of 20 blocks, as GNU tar does
_MODE, _MTIME = 0o444, 0  # fixed metadata: the same samples give the same bytes
_PLAIN_SIZE_LIMIT = 8**11  # the largest size ustar's 11 octal digits hold
# every field of a plain header but its name, size and checksum: mode, uid, gid as tarfile writes them
_AFTER_NAME = b"%07o\0" % _MODE + b"0000000\0" * 2
# (no device numbers: a regular file's are left empty, as tarfile and GNU tar leave them)
_AFTER_SIZE = (b"%011o\0" % _MTIME) + b" " * 8 + b"0" + b"\0" * 100 + b"ustar\x0000" + b"\0" * (64 + 16 + 155)


def member_header(name: str, size: int) -> bytes:
    """The header block(s) Python's ``tarfile`` (PAX format) writes for a regular file ``name`` of
    ``size`` bytes with ddpipe's fixed metadata."""
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > 100 or not encoded.isascii() or size >= _PLAIN_SIZE_LIMIT:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, _MTIME, _MODE
        info.uname = info.gname = ""
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    header = bytearray(encoded.ljust(100, b"\0") + _AFTER_NAME + b"%011o\0" % size + _AFTER_SIZE + b"\0" * 12)
    header[148:155] = b"%06o\0" % sum(header)  # the checksum field counts as spaces while summed
    return bytes(header)


class TarWriter(ShardWriter):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._idx_final = index_path(self.path)
        self._idx_tmp = self._idx_final.with_name(f".{self._idx_final.name}.partial")
        self._file = open(self.tmp_path, "wb")  # noqa: SIM115 - closed in _finish or _close_quietly
        self._at = 0
        self._groups: list[list[Member]] = []

    def _write(self, sample: Sample) -> None:
        key = sample[KEY]
        group: list[Member] = []
        for field in field_names(sample):
            data = memoryview(sample[field])
            data = (data if data.c_contiguous else memoryview(data.tobytes())).cast("B")
            name = f"{key}.{field}"
            header = member_header(name, data.nbytes)
            self._file.write(header)
            self._file.write(data)
            pad = -data.nbytes % _BLOCK
            self._file.write(bytes(pad))
            group.append((field, self._at + len(header), data.nbytes, name))
            self._at += len(header) + data.nbytes + pad
        self._groups.append(group)

    def _finish(self) -> None:
        end = self._at + 2 * _BLOCK  # two zero blocks end the archive
        self._file.write(bytes(2 * _BLOCK + -end % _RECORD))
        self._file.close()
        Path(self._idx_tmp).write_text(format_dali_index(self._groups))

    def _sidecars(self) -> list[tuple[Path, Path]]:
        return [(self._idx_tmp, self._idx_final)]

    def _close_quietly(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
