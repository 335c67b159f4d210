"""How a shard file is mapped: paged in whole only where all of it will be read."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import pickle
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ddpipe
from ddpipe.formats import get_format
from ddpipe.formats.mapped import KEPT_FILES, SCAN_WHOLE_LIMIT, FileMapping, KeptMappings, MappedFile

from ..helpers import make_dataset, mapped_under


def test_a_scan_pages_in_whole_only_a_shard_sized_file_read_from_its_start(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.write_bytes(os.urandom(1 << 16))
    mapped = MappedFile(small)
    assert bytes(mapped.for_scan(from_start=False)[:8]) == small.read_bytes()[:8]
    assert not mapped.paged_in  # a share that starts mid-file asks ahead of itself instead
    mapped.for_scan(from_start=True)
    assert mapped.paged_in
    # an adopted file larger than any shard (sparse here: no disk used) may be read only in part
    large = tmp_path / "large"
    with open(large, "wb") as f:
        f.truncate(SCAN_WHOLE_LIMIT + (1 << 20))
    big = MappedFile(large)
    assert len(big.for_scan(from_start=True)) == SCAN_WHOLE_LIMIT + (1 << 20)
    assert not big.paged_in


def test_an_empty_file_cannot_be_mapped(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty file"):
        MappedFile(empty).content(whole=True)


def test_a_file_hashed_through_its_mapping_is_read_through_it_after(tmp_path: Path) -> None:
    """Hashing through a mapping gives the manifest's checksum of the file and leaves the mapping
    paged in whole, so that a scan after it (the reader that takes over a mapping hashed ahead)
    maps nothing again; a mapping not kept still gives the same checksum."""
    from ddpipe.checksum import file_checksum
    from ddpipe.formats.mapped import hash_mapped

    path = tmp_path / "shard"
    path.write_bytes(os.urandom(3 << 20))
    mapped = MappedFile(path)
    assert mapped.checksum() == file_checksum(path)
    assert mapped.paged_in
    first = mapped.content()
    assert mapped.for_scan(from_start=True).obj is first.obj  # the same mapping, not a new one
    kept, dropped = hash_mapped(MappedFile(path), keep=True), hash_mapped(MappedFile(path), keep=False)
    assert kept.checksum == dropped.checksum == file_checksum(path)
    assert isinstance(kept.mapped, MappedFile) and kept.mapped.paged_in and dropped.mapped is None
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty file"):
        hash_mapped(MappedFile(empty), keep=True)


@settings(max_examples=100, deadline=None)
@given(size=st.integers(1, 1 << 16), data=st.data())
def test_a_views_address_is_where_its_bytes_are(size: int, data: st.DataObject) -> None:
    """``address_of`` (what a reading process places an image by) of any slice of a mapping, a
    bytearray or an array is the start of its parent's bytes plus where the slice starts in them."""
    import mmap

    import numpy as np

    from ddpipe.formats.mapped import address_of

    start = data.draw(st.integers(0, size - 1))
    stop = data.draw(st.integers(start, size))
    mapping = mmap.mmap(-1, size)
    mapping[start:stop] = os.urandom(stop - start)
    array = np.frombuffer(mapping, dtype=np.uint8)
    for whole in (memoryview(mapping), memoryview(bytearray(size)), array.data):
        base = array.__array_interface__["data"][0] if whole.obj is mapping else address_of(whole)
        assert address_of(whole[start:stop]) - base == start
    assert bytes((ctypes.c_char * (stop - start)).from_address(address_of(memoryview(mapping)[start:stop]))) == \
        mapping[start:stop]


def test_kept_mappings_keep_hashed_files_up_to_their_limit_and_only_while_the_path_names_them(
        tmp_path: Path) -> None:
    files = []
    for k in range(3):
        files.append(tmp_path / f"f{k}")
        files[-1].write_bytes(os.urandom(1 << 16))
    kept = KeptMappings(limit=2 << 16)
    digests = [MappedFile(f, kept).checksum() for f in files]
    assert len(kept) == 2  # the third would pass the limit
    few = KeptMappings(files=1)
    for f in files:
        MappedFile(f, few).checksum()
    assert len(few) == 1
    again = MappedFile(files[0], kept)
    assert again.content().obj is kept.find(files[0], FileMapping)  # its mapping taken from those kept, paged in
    assert again.paged_in and again.checksum() == digests[0]
    assert kept.find(files[2], FileMapping) is None
    files[1].unlink()
    assert kept.find(files[1], FileMapping) is None and len(kept) == 1  # gone from its path: let go
    moved = tmp_path / "moved"
    files[0].rename(moved)
    files[0].write_bytes(moved.read_bytes())  # another file of the same bytes at the path
    assert kept.find(files[0], FileMapping) is None and len(kept) == 0


def test_a_format_sent_to_another_process_keeps_no_mappings(tmp_path: Path) -> None:
    fmt = get_format("wds")
    path = tmp_path / "f"
    path.write_bytes(os.urandom(1 << 12))
    fmt.mapping(path, keep=True).checksum()
    assert len(fmt.kept) == 1
    assert len(pickle.loads(pickle.dumps(fmt)).kept) == 0


@contextlib.contextmanager
def descriptors_allowed(soft: int) -> Iterator[None]:
    """This process allowed ``soft`` open descriptors for a while (skipped past its hard limit)."""
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft > hard:
        pytest.skip(f"this process may open at most {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (before, hard))


@pytest.mark.parametrize("fmt", ["wds", "hdf5", "lmdb"])
@pytest.mark.parametrize("descriptors", [1024, 8 * (KEPT_FILES[0] + 8)])
def test_a_dataset_keeps_as_many_files_mapped_as_the_descriptors_it_may_open_allow(
        tmp_path: Path, fmt: str, descriptors: int) -> None:
    """Each kept file holds a descriptor: an eighth of the process's may be held, and never fewer than
    128 files (the share of the usual soft limit, 1024). A global shuffle over more shards than are
    kept maps them again, at nearly every sample."""
    shards = KEPT_FILES[0] + 8
    root = make_dataset(tmp_path / fmt, fmt, [2] * shards, payload=64)
    with descriptors_allowed(descriptors):
        stream = ddpipe.EncodedStream(root, 4, shuffle="global")
        assert sum(len(batch) for batch in stream) == 2 * shards
        assert len(mapped_under(root)) == (128 if descriptors == 1024 else shards)
        del stream
        gc.collect()
