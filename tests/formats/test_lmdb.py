from __future__ import annotations

import os
from pathlib import Path

import lmdb
import msgpack

from .conformance import FormatConformance, example_samples


class TestLMDBConformance(FormatConformance):
    format_name = "lmdb"


def test_one_file_per_shard_readable_with_plain_lmdb(tmp_path: Path) -> None:
    items = example_samples()
    path = tmp_path / "s.lmdb"
    TestLMDBConformance().write(path, items)
    assert os.listdir(tmp_path) == ["s.lmdb"] and path.is_file()  # no directory, no lock file
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        assert msgpack.unpackb(txn.get(b"%012d" % 5)) == items[5]
        assert txn.stat()["entries"] == len(items) + 1  # the samples and the __ddpipe__ record
    env.close()
