"""The checksum manifests record for every shard: xxh3_64 over the whole file (several GB/s on one
core, so checking a shard as it is read costs little next to decoding it)."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import xxhash

from .errors import DigestMismatchError

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


def sample_digest(sample: Mapping[str, Any]) -> int:
    """xxh3_64 of one sample as its reader gives it: each field's name, length and bytes (the key's
    UTF-8), fields in name order, so that a sample whose bytes changed, or that stands where another
    was, no longer matches. The manifest of an adopted file, one shard that many ranks may each read
    a part of, records one per sample: a rank then checks what it reads, not the whole file."""
    h = xxhash.xxh3_64()
    for name in sorted(sample):
        value = sample[name]
        data = value.encode() if isinstance(value, str) else value
        h.update(name.encode())
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return int(h.intdigest())


def pack_digests(digests: Iterable[int]) -> str:
    """Sample digests as the manifest stores them: little-endian uint64, base64 (11 bytes a sample)."""
    return base64.b64encode(np.fromiter(digests, dtype="<u8").tobytes()).decode("ascii")


def unpack_digests(text: str, count: int) -> np.ndarray:
    """The inverse of :func:`pack_digests`; ``ValueError`` unless it holds ``count`` digests."""
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) != 8 * count:
        raise ValueError(f"{len(raw) // 8} sample digests for {count} samples")
    return np.frombuffer(raw, dtype="<u8")


def digest_mismatch(digests: np.ndarray | None, position: int, sample: Mapping[str, Any],
                    path: str) -> DigestMismatchError | None:
    """The error for a sample that does not match its digest (none to match: no error), or None."""
    if digests is None or sample_digest(sample) == digests[position]:
        return None
    return DigestMismatchError(path, position=position, key=str(sample.get("__key__")))
