"""A shard damaged after conversion, read with the check turned off (``verify=False``): whatever bytes
changed, the read gives samples or a CorruptShardError naming the shard, never another exception and
never a crash. (With the check on, no damaged shard is parsed at all: tests/test_integrity.py.) LMDB
follows the page numbers a damaged file holds without bounds: before ddpipe walked each file's tree
first (formats/lmdb_tree.py), a flipped bit killed the process with SIGBUS or SIGABRT."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ddpipe

from ..helpers import make_dataset


@pytest.fixture(scope="module", params=["wds", "hdf5", "lmdb"])
def shard(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, bytes]:
    root = make_dataset(tmp_path_factory.mktemp(request.param) / "ds", request.param, [10, 10])
    first = sorted(p for p in root.iterdir() if p.suffix in (".tar", ".h5", ".lmdb"))[0]
    return root, first, first.read_bytes()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 7)), min_size=1, max_size=3),
       in_head=st.booleans(), shuffle=st.sampled_from(["none", "global"]))
def test_a_damaged_shard_read_unchecked_is_samples_or_a_corrupt_shard_error(
        shard: tuple[Path, Path, bytes], flips: list[tuple[int, int]], in_head: bool, shuffle: str) -> None:
    """In order (a scan) or one sample at a time in any order (a global shuffle's random reads)."""
    root, path, intact = shard
    damaged = bytearray(intact)
    for at, bit in flips:  # the first 4 KB hold HDF5's, tar's and LMDB's structure: half the examples hit them
        damaged[at % (4096 if in_head else len(damaged))] ^= 1 << bit
    path.write_bytes(bytes(damaged))
    try:
        stream = ddpipe.EncodedStream(root, 4, shuffle=shuffle, verify=False)
        assert sum(len(batch.indices) for batch in stream) == 20
    except ddpipe.CorruptShardError as e:
        assert str(path) in str(e) and "\n" not in str(e)
    finally:
        path.write_bytes(intact)
