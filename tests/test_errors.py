from __future__ import annotations

import pickle

import pytest

from ddpipe.errors import (
    ChecksumMismatchError,
    CorruptShardError,
    DdpipeError,
    DiskFullError,
    ManifestError,
    MissingShardError,
    SampleError,
    SourceError,
)

ERRORS = [
    SourceError("not an image", path="/data/a.jpg"),
    ChecksumMismatchError("/d/s.tar", expected="xxh3_64:1", actual="xxh3_64:2"),
    SampleError("bad key", key="a.b", path="/d/s.tar"),
    MissingShardError("missing", path="/d/s.tar"),
    CorruptShardError("truncated", path="/d/s.h5"),
    DiskFullError("no space", path="/d/s.lmdb"),
    ManifestError("not a ddpipe manifest", path="/d/index.json"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_errors_survive_pickling_from_worker_processes(error: DdpipeError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and back.path == error.path
    assert error.path is not None and error.path in str(back)


def test_errors_subclass_the_builtins_callers_expect() -> None:
    assert isinstance(MissingShardError("x", path="p"), FileNotFoundError)
    assert isinstance(ChecksumMismatchError("p", expected="a", actual="b"), ValueError)
    assert isinstance(DiskFullError("x", path="p"), OSError)
    assert ChecksumMismatchError("p", expected="a", actual="b").expected == "a"
