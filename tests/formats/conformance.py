"""One conformance suite that every shard format inherits (the fsspec abstract-test habit)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpipe.checksum import file_checksum
from ddpipe.errors import CorruptShardError, MissingShardError, SampleError
from ddpipe.formats import ShardFormat, get_format
from ddpipe.formats.atomic import partial_path
from ddpipe.sample import KEY, Sample

_part = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=,@~%", min_size=1,
                max_size=12)
keys = st.lists(_part, min_size=1, max_size=3).map("/".join)
field_names = st.sampled_from(["jpg", "png", "cls", "txt", "json", "seg.png", "a-b_c"])
samples = st.lists(
    st.tuples(keys, st.dictionaries(field_names, st.binary(max_size=2048), min_size=1, max_size=4)),
    min_size=1, max_size=12, unique_by=lambda t: t[0],
).map(lambda items: [{KEY: k, **fields} for k, fields in items])


def example_samples(n: int = 20) -> list[Sample]:
    return [{KEY: f"cls{i % 3}/img_{i:04d}", "jpg": os.urandom(500 + 37 * i), "cls": str(i % 3).encode()}
            for i in range(n)]


class FormatConformance:
    format_name: ClassVar[str]

    @property
    def fmt(self) -> ShardFormat:
        return get_format(self.format_name)

    def write(self, path: Path, items: list[Sample]) -> Path:
        with self.fmt.writer(path) as w:
            for s in items:
                w.write(s)
        return path

    def shard(self, tmp_path: Path, name: str = "s") -> Path:
        return tmp_path / f"{name}{self.fmt.suffix}"

    # every format's subclass runs this same test: the differing executors are deliberate
    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.differing_executors])
    @given(items=samples)
    def test_round_trip_arbitrary_samples(self, tmp_path_factory: pytest.TempPathFactory, items: list[Sample]) -> None:
        path = self.write(self.shard(tmp_path_factory.mktemp("rt")), items)
        with self.fmt.reader(path) as r:
            assert len(r) == len(items)
            assert list(r) == items
            assert [r[i] for i in range(len(items))] == items

    def test_random_access_and_scan_from(self, tmp_path: Path) -> None:
        items = example_samples()
        path = self.write(self.shard(tmp_path), items)
        with self.fmt.reader(path) as r:
            assert r[7] == items[7]
            assert r[-1] == items[-1]
            assert list(r.scan(15)) == items[15:]
            assert list(r.scan(len(items))) == []
            with pytest.raises(IndexError):
                r[len(items)]

    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.differing_executors])
    @given(items=samples, start=st.integers(0, 12))
    def test_views_are_the_samples_a_scan_gives(self, tmp_path_factory: pytest.TempPathFactory, items: list[Sample],
                                                start: int) -> None:
        """What a format gives as views of the shard in memory (DALI reads them in place) are the
        samples a scan copies out, from any start, and stay so once the reader is closed."""
        path = self.write(self.shard(tmp_path_factory.mktemp("views")), items)
        with self.fmt.reader(path) as r:
            views = list(r.scan_views(start))
        assert [{k: v if k == KEY else bytes(v) for k, v in s.items()} for s in views] == items[start:]

    def test_check_through_the_reader_then_scan(self, tmp_path: Path) -> None:
        """A reader's check (through its mapping of the file, where it has one) gives the checksum
        manifests record, and the scan that follows it from the same pages gives the samples."""
        items = example_samples()
        path = self.write(self.shard(tmp_path), items)
        with self.fmt.reader(path) as r:
            assert self.fmt.checksum(r) == file_checksum(path)
            assert list(r) == items
            assert r[3] == items[3]

    def test_same_samples_give_same_bytes(self, tmp_path: Path) -> None:
        items = example_samples()
        a = self.write(self.shard(tmp_path, "a"), items)
        b = self.write(self.shard(tmp_path, "b"), items)
        assert a.read_bytes() == b.read_bytes()

    def test_writer_is_invisible_until_commit(self, tmp_path: Path) -> None:
        path = self.shard(tmp_path)
        w = self.fmt.writer(path)
        for s in example_samples(5):
            w.write(s)
        assert not path.exists()
        assert all(not p.exists() for p in self.fmt.sidecar_files(path))
        w.commit()
        assert path.exists() and not partial_path(path).exists()

    def test_failed_write_leaves_nothing(self, tmp_path: Path) -> None:
        path = self.shard(tmp_path)
        with pytest.raises(RuntimeError), self.fmt.writer(path) as w:
            w.write(example_samples(1)[0])
            raise RuntimeError("producer failed")
        assert sorted(os.listdir(tmp_path)) == []

    def test_failed_rewrite_keeps_the_old_shard(self, tmp_path: Path) -> None:
        path = self.write(self.shard(tmp_path), example_samples(4))
        before = path.read_bytes()
        with pytest.raises(RuntimeError), self.fmt.writer(path) as w:
            w.write(example_samples(1)[0])
            raise RuntimeError("producer failed")
        assert path.read_bytes() == before

    def test_invalid_sample_is_rejected_naming_it(self, tmp_path: Path) -> None:
        w = self.fmt.writer(self.shard(tmp_path))
        with pytest.raises(SampleError, match=r"bad\.key"):
            w.write({KEY: "bad.key", "jpg": b"x"})
        with pytest.raises(SampleError, match="not bytes"):
            w.write({KEY: "k", "jpg": "text"})
        w.abort()

    def test_truncated_shard_is_an_error_naming_the_file(self, tmp_path: Path) -> None:
        path = self.write(self.shard(tmp_path), example_samples())
        data = path.read_bytes()
        path.write_bytes(data[: len(data) * 2 // 3])
        with pytest.raises(CorruptShardError, match=path.name), self.fmt.reader(path) as r:
            list(r)

    def test_garbage_file_is_an_error_naming_the_file(self, tmp_path: Path) -> None:
        path = self.shard(tmp_path)
        path.write_bytes(os.urandom(10_000))
        with pytest.raises(CorruptShardError, match=path.name), self.fmt.reader(path) as r:
            list(r)

    def test_missing_shard(self, tmp_path: Path) -> None:
        with pytest.raises(MissingShardError, match="nope"):
            self.fmt.reader(tmp_path / f"nope{self.fmt.suffix}")
