"""One shard from the source to node-local storage: streamed, hashed on the way, verified against the
manifest, then renamed into place, so a reader never sees a partial or corrupt copy."""

from __future__ import annotations

from pathlib import Path

import xxhash

from ..checksum import CHECKSUM_ALGORITHM
from ..errors import ChecksumMismatchError, MissingShardError
from ..formats import atomic
from ..manifest import ShardInfo
from ..throttle import SourceLimits

_CHUNK = 8 << 20


def verified_copy(source: Path, dest: Path, info: ShardInfo, limits: SourceLimits | None = None) -> int:
    """Copy ``source`` to ``dest`` if its bytes hash to ``info.checksum``; return the bytes copied.

    The copy is written under a hidden temporary name and renamed only once verified. A missing
    source, a checksum mismatch or a full disk raises, naming the file, and leaves ``dest`` as it was.
    """
    tmp = atomic.partial_path(dest)
    h = xxhash.xxh3_64()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    copied = 0
    try:
        if limits:
            limits.on_open()
        try:
            src = open(source, "rb", buffering=0)  # noqa: SIM115 - closed below, with the copy
        except FileNotFoundError:
            raise MissingShardError("source shard is missing", path=source) from None
        with src, open(tmp, "wb") as out:
            while n := src.readinto(buf):
                if limits:
                    limits.on_read(n)
                h.update(view[:n])
                out.write(view[:n])
                copied += n
        actual = f"{CHECKSUM_ALGORITHM}:{h.hexdigest()}"
        if actual != info.checksum or copied != info.bytes:
            raise ChecksumMismatchError(source, expected=info.checksum, actual=f"{actual} ({copied} bytes)")
        # a cache needs no fsync: after a crash a short or empty copy fails its stamp and is fetched again
        atomic.commit(tmp, dest, durable=False)
    except OSError as e:
        atomic.discard(tmp)
        atomic.raise_if_disk_full(e, dest)
        raise
    except BaseException:
        atomic.discard(tmp)
        raise
    return copied


def is_staged(dest: Path, info: ShardInfo) -> bool:
    """A staged copy is trusted when it has the manifest's size and its verification stamp; a copy
    damaged later is caught by the stamp's size and mtime, or by ``ddpipe verify`` on the stage."""
    stamp = stamp_path(dest)
    try:
        st = dest.stat()
        recorded = stamp.read_text().split()
    except (OSError, ValueError):
        return False
    return st.st_size == info.bytes and recorded == [info.checksum, str(st.st_size), str(st.st_mtime_ns)]


def stamp_path(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.verified")


def write_stamp(dest: Path, info: ShardInfo) -> None:
    st = dest.stat()
    atomic.atomic_write_bytes(stamp_path(dest), f"{info.checksum} {st.st_size} {st.st_mtime_ns}\n".encode())


def remove_staged(dest: Path) -> None:
    """Evict a staged copy: its stamp first, so the copy is never trusted half-removed."""
    for p in (stamp_path(dest), dest):
        atomic.discard(p)
