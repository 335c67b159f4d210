"""One shard file opened checked against its manifest entry, before any of its samples is used: its
size and sample count always, its content (the manifest's checksum) when asked to verify it."""

from __future__ import annotations

from pathlib import Path

from .checksum import file_checksum
from .errors import ChecksumMismatchError, CorruptShardError, MissingShardError
from .formats import ShardFormat, ShardReader
from .formats.mapped import HashedFile, hash_mapped
from .manifest import ShardInfo


def check_shard_file(fmt: ShardFormat, info: ShardInfo, path: Path) -> None:
    """Cheap checks without reading data: the file exists, has the manifest's size, and could hold
    the manifest's number of samples."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise MissingShardError("shard listed in index.json is missing", path=path) from None
    if size != info.bytes:
        what = "truncated" if size < info.bytes else "larger than recorded"
        raise CorruptShardError(f"{what}: index.json says {info.bytes} bytes, file has {size}", path=path)
    if info.samples * fmt.min_sample_bytes > size:
        raise CorruptShardError(f"index.json says {info.samples} samples, more than {size} bytes of "
                                f"{fmt.name} can hold (at least {fmt.min_sample_bytes} bytes each)", path=path)


def open_checked(fmt: ShardFormat, info: ShardInfo, path: Path, *, verify: bool, hashed: HashedFile | None = None,
                 keep: bool = False, vouched: Path | None = None) -> ShardReader:
    """A reader over ``path``, the file of the shard ``info`` describes, checked as
    :meth:`ddpipe.dataset.Dataset.open_shard` says (``verify``, ``hashed``, ``keep``, ``vouched``)."""
    check_shard_file(fmt, info, path)
    ahead = hashed if hashed is not None and hashed.path == path else None
    if hashed is not None and ahead is None and hashed.mapped is not None:
        hashed.mapped.close()  # another file's (an LMDB environment is open once per process)
    # read through the mapping kept of the file, or one then kept (ShardMapping: its reader takes it over)
    own = fmt.mapping(path, keep=True) if keep and ahead is None and fmt.reads_mapped else None
    if own is not None and verify:  # hashed before it is opened, as a file hashed ahead is
        ahead, own = hash_mapped(own, keep=True), None
    known = ahead.checksum if verify and ahead is not None and ahead.checksum == info.checksum else None
    reopened = vouched == path and not verify
    if reopened:
        known = info.checksum
    try:
        reader = fmt.reader_of(path, known, vouched=reopened, by_sample=not verify and not reopened)
    except CorruptShardError:
        # a changed file that no longer opens is said as the change it is, not in its library's words
        # ("actual len exceeds EOA"); only here, where opening failed, is it hashed before the open
        if verify:
            actual = ahead.checksum if ahead is not None else file_checksum(path)
            if actual != info.checksum:
                raise ChecksumMismatchError(path, expected=info.checksum, actual=actual) from None
        raise
    try:
        if ahead is not None and ahead.mapped is not None:
            reader.adopt_mapping(ahead.mapped)
        elif own is not None:  # reopened unchecked: vouched for
            reader.adopt_mapping(own)
        if verify:  # first: the check pages the file in whole, and the count may read scattered pages
            fmt.verify(reader, info.checksum, ahead.checksum if ahead is not None else None)
        elif reopened:  # its bytes vouched for, not the files beside it, unless read as they agreed with them
            fmt.check_sidecars(reader, info.checksum)
        if len(reader) != info.samples:
            raise CorruptShardError(f"holds {len(reader)} samples, index.json says {info.samples}", path=path)
    except BaseException:
        reader.close()
        raise
    return reader
