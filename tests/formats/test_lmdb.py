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


def test_a_shard_hashed_through_lmdbs_own_mapping_is_then_scanned_without_a_page_fault(tmp_path: Path) -> None:
    """A shard hashed ahead is hashed through the mapping LMDB itself reads (LMDBFile): the checksum is
    the file's, and the reader that takes it over scans without faulting a page in on the reading
    thread, where a reader with an environment of its own faults its pages in as it goes (on the
    reading thread: what made LMDB the slowest format to feed DALI). A file that is not LMDB is
    hashed all the same (its checksum then tells it apart) and leaves no environment open."""
    import resource

    from ddpipe.checksum import file_checksum
    from ddpipe.formats.lmdb import LMDBFile, LMDBFormat, LMDBReader
    from ddpipe.formats.mapped import hash_mapped
    from ddpipe.sample import KEY

    path = tmp_path / "s.lmdb"
    TestLMDBConformance().write(path, [{KEY: f"k{i}", "jpg": os.urandom(60_000)} for i in range(64)])

    def faults_scanning(reader: LMDBReader) -> int:
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        assert sum(1 for _ in reader.scan()) == 64
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

    with LMDBReader(path) as fresh:
        assert faults_scanning(fresh) > 4  # 3.8 MB of values: at least one fault per 16 pages
    hashed = hash_mapped(LMDBFormat().mapping(path), keep=True)
    assert hashed.checksum == file_checksum(path) and isinstance(hashed.mapped, LMDBFile)
    with LMDBReader(path) as reader:
        reader.adopt_mapping(hashed.mapped)
        assert reader.mapped_file() is hashed.mapped
        assert faults_scanning(reader) == 0

    other = tmp_path / "other.lmdb"
    other.write_bytes(os.urandom(1 << 16))
    assert LMDBFile(other).checksum() == file_checksum(other)


def test_lmdbs_mapping_is_taken_only_where_it_is_the_files_one_mapping(tmp_path: Path) -> None:
    """The environment's mapping is told apart from the process's other mappings of the file: with a
    plain mapping of the same file beside it, neither is taken for LMDB's (the hash then goes through
    a mapping of its own, and is still the file's)."""
    from ddpipe.checksum import file_checksum
    from ddpipe.formats.lmdb import LMDBFile, lmdb_mapping_start
    from ddpipe.formats.mapped import MappedFile

    path = TestLMDBConformance().write(tmp_path / "s.lmdb", example_samples(40))
    size = path.stat().st_size
    assert lmdb_mapping_start(path, size) is None  # nothing maps it yet
    shard = LMDBFile(path)
    shard.env()
    assert lmdb_mapping_start(path, size) is not None
    beside = MappedFile(path)
    with beside.content():
        assert lmdb_mapping_start(path, size) is None
        assert shard.checksum() == file_checksum(path)
    shard.close()
