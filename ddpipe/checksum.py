"""The checksum manifests record for every shard: xxh3_64 over the whole file (several GB/s on one
core, so checking a shard as it is read costs little next to decoding it)."""

from __future__ import annotations

import os

import xxhash

CHECKSUM_ALGORITHM = "xxh3_64"
_CHUNK = 8 << 20


def file_checksum(path: str | os.PathLike[str]) -> str:
    """The checksum of a whole file as recorded in manifests: ``"xxh3_64:<hex>"``."""
    h = xxhash.xxh3_64()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return f"{CHECKSUM_ALGORITHM}:{h.hexdigest()}"
