"""One shard from the source to node-local storage: streamed, hashed on the way, verified against the
manifest, then renamed into place, so a reader never sees a partial or corrupt copy."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from .checksum import CHECKSUM_ALGORITHM
from .errors import ChecksumMismatchError, MissingShardError
from .formats import atomic
from .manifest import ShardInfo
from .throttle import SourceLimits

if TYPE_CHECKING:
    from .dataset import Dataset

_CHUNK = 8 << 20


class CopyStopped(Exception):
    """A copy given up because whoever made it was told to stop (a stager closed); nothing of it is left."""


# write(chunk) for each chunk of a copy; a fill returns False when it has nothing to give
Write = Callable[[memoryview], None]


def write_verified(dest: Path, info: ShardInfo, fill: Callable[[Write], bool], *, named: str | Path,
                   stop: threading.Event | None = None) -> bool:
    """Write ``dest`` from the chunks ``fill`` hands its argument, under a hidden temporary name,
    hashed on the way, and rename it into place only if it matches ``info`` (checksum and size).
    False, leaving ``dest`` as it was, if ``fill`` had nothing to give; a mismatch raises
    :class:`ChecksumMismatchError` naming ``named``, a full disk :class:`DiskFullError`, and ``stop``
    set :class:`CopyStopped` at the next chunk, the temporary file removed."""
    tmp = atomic.partial_path(dest)
    h = xxhash.xxh3_64()
    copied = 0

    def write(chunk: memoryview) -> None:
        nonlocal copied
        if stop is not None and stop.is_set():
            raise CopyStopped(f"the copy of {named} was stopped")
        h.update(chunk)
        out.write(chunk)
        copied += len(chunk)

    try:
        with open(tmp, "wb") as out:
            if not fill(write):
                atomic.discard(tmp)
                return False
        actual = f"{CHECKSUM_ALGORITHM}:{h.hexdigest()}"
        if actual != info.checksum or copied != info.bytes:
            raise ChecksumMismatchError(named, expected=info.checksum, actual=f"{actual} ({copied} bytes)")
        # a cache needs no fsync: after a crash a short or empty copy fails its stamp and is fetched again
        atomic.commit(tmp, dest, durable=False)
    except OSError as e:
        atomic.discard(tmp)
        atomic.raise_if_disk_full(e, dest)
        raise
    except BaseException:
        atomic.discard(tmp)
        raise
    return True


def verified_copy(source: Path, dest: Path, info: ShardInfo, limits: SourceLimits | None = None,
                  stop: threading.Event | None = None) -> int:
    """Copy ``source`` to ``dest`` if its bytes hash to ``info.checksum``; return the bytes copied.

    The copy is written under a hidden temporary name and renamed only once verified. A missing
    source, a checksum mismatch or a full disk raises, naming the file, and leaves ``dest`` as it was.
    """
    def fill(write: Write) -> bool:
        if limits:
            limits.on_open()
        try:
            src = open(source, "rb", buffering=0)  # noqa: SIM115 - closed below
        except FileNotFoundError:
            raise MissingShardError("source shard is missing", path=source) from None
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        with src:
            while n := src.readinto(buf):
                if limits:
                    limits.on_read(n)
                write(view[:n])
        return True

    write_verified(dest, info, fill, named=source, stop=stop)
    return info.bytes


def verified_stream(chunks: Iterable[memoryview], dest: Path, info: ShardInfo, named: str,
                    limits: SourceLimits | None = None, stop: threading.Event | None = None) -> int:
    """:func:`verified_copy` from a stream of chunks (an object read by ranged requests) named ``named``."""
    def fill(write: Write) -> bool:
        if limits:
            limits.on_open()
        for chunk in chunks:
            if limits:
                limits.on_read(len(chunk))
            write(chunk)
        return True

    write_verified(dest, info, fill, named=named, stop=stop)
    return info.bytes


def copy_shard(dataset: Dataset, shard: int, dest: Path, limits: SourceLimits | None = None,
               stop: threading.Event | None = None) -> None:
    """Copy a shard of ``dataset`` from its source (a file, or an object streamed) to ``dest``, hashed
    on the way and renamed into place only if it matches the manifest; ``stop`` set gives it up,
    leaving nothing."""
    info = dataset.manifest.shards[shard]
    if dataset.storage is None:
        verified_copy(dataset.shard_path(shard), dest, info, limits, stop)
    else:
        verified_stream(dataset.storage.chunks(info.file, info.bytes), dest, info, dataset.storage.url(info.file),
                        limits, stop)


def copy_sidecars(dataset: Dataset, shard: int, dest_dir: Path) -> None:
    """Copy a shard's sidecars (a tar's index) from its source into ``dest_dir``; a tar without an
    index has none to copy (its reader scans it instead)."""
    if dataset.storage is None:
        for sidecar in dataset.format.sidecar_files(dataset.shard_path(shard)):
            try:
                data = sidecar.read_bytes()
            except FileNotFoundError:
                continue
            atomic.atomic_write_bytes(dest_dir / sidecar.name, data)
        return
    names, _ = dataset.object_names(dataset.manifest.shards[shard])
    for name in names[1:]:
        with contextlib.suppress(MissingShardError):
            dataset.storage.download(name, dest_dir / Path(name).name)


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
