"""The checksum manifests record for every shard: xxh3_64 over the whole file (several GB/s on one
core, so checking a shard as it is read costs little next to decoding it)."""

from __future__ import annotations

import os
from collections.abc import Callable

import xxhash

CHECKSUM_ALGORITHM = "xxh3_64"
_CHUNK = 8 << 20


def file_checksum(path: str | os.PathLike[str], on_chunk: Callable[[int, memoryview], None] | None = None) -> str:
    """The checksum of a whole file as recorded in manifests: ``"xxh3_64:<hex>"``. ``on_chunk(offset,
    bytes)`` sees each chunk as it passes (to check something else in the same read)."""
    h = xxhash.xxh3_64()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    at = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            if on_chunk is not None:
                on_chunk(at, view[:n])
            at += n
    return f"{CHECKSUM_ALGORITHM}:{h.hexdigest()}"
