"""The checksum manifests record for every shard: xxh3_64 over the whole file (several GB/s on one
core, so checking a shard as it is read costs little next to decoding it)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import xxhash

CHECKSUM_ALGORITHM = "xxh3_64"
_CHUNK = 8 << 20


def file_checksum(path: str | os.PathLike[str]) -> str:
    """The checksum of a whole file as recorded in manifests: ``"xxh3_64:<hex>"``."""
    h = xxhash.xxh3_64()
    buf = np.empty(_CHUNK, dtype=np.uint8)  # not bytearray: that zeroes 8 MB per file for nothing
    view = buf.data
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])
    return f"{CHECKSUM_ALGORITHM}:{h.hexdigest()}"


def buffer_checksum(data: Any) -> str:
    """The checksum of a whole file's bytes already in memory (a mapping of it, say): the same as
    :func:`file_checksum` of that file."""
    return f"{CHECKSUM_ALGORITHM}:{xxhash.xxh3_64(data).hexdigest()}"
