"""WebDataset tar shards: conformance, and interop with the webdataset library and DALI both ways."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpipe.formats.tar_index import index_path, parse_dali_index, scan_tar_members, split_member_name
from ddpipe.sample import KEY

from .conformance import FormatConformance, example_samples


class TestTarConformance(FormatConformance):
    format_name = "wds"


def test_split_member_name_follows_webdataset() -> None:
    assert split_member_name("a/b/c.seg.png") == ("a/b/c", "seg.png")
    assert split_member_name("dir.x/key.jpg") == ("dir.x/key", "jpg")


def test_dali_index_matches_dalis_own_indexer(tmp_path: Path) -> None:
    wds2idx = pytest.importorskip("wds2idx", reason="ships with nvidia-dali (ddpipe[dali])")
    shard = TestTarConformance().write(tmp_path / "s.tar", example_samples())
    theirs = tmp_path / "theirs.idx"
    with wds2idx.IndexCreator(str(shard), str(theirs), verbose=False) as creator:
        creator.create_index()
    assert index_path(shard).read_text() == theirs.read_text()


def test_tar_readable_by_webdataset_library(tmp_path: Path) -> None:
    items = example_samples()
    shard = tmp_path / "s.tar"
    TestTarConformance().write(shard, items)
    theirs = list(wds.WebDataset(str(shard), shardshuffle=False))
    assert [t[KEY] for t in theirs] == [s[KEY] for s in items]
    assert [(t["jpg"], t["cls"]) for t in theirs] == [(s["jpg"], s["cls"]) for s in items]


def test_reads_webdataset_shardwriter_output(tmp_path: Path) -> None:
    items = example_samples(30)
    with wds.ShardWriter(str(tmp_path / "wds-%06d.tar"), maxcount=12, verbose=0) as sink:
        for s in items:
            sink.write(dict(s))
    shards = sorted(tmp_path.glob("wds-*.tar"))
    assert len(shards) == 3
    from ddpipe.formats.tar import TarReader

    got = [s for p in shards for s in TarReader(p)]
    assert got == items


def test_reads_plain_tar(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "x1.txt").write_bytes(b"hello")
    (src / "d" / "x1.cls").write_bytes(b"3")
    (src / "d" / "x2.txt").write_bytes(b"world")
    shard = tmp_path / "plain.tar"
    subprocess.run(["tar", "-C", str(src), "--sort=name", "-cf", str(shard), "d"], check=True)
    groups = scan_tar_members(shard)
    assert [[m[0] for m in g] for g in groups] == [["cls", "txt"], ["txt"]]


def test_duplicate_field_in_a_sample_is_corrupt(tmp_path: Path) -> None:
    from ddpipe.errors import CorruptShardError

    shard = tmp_path / "dup.tar"
    with tarfile.open(shard, "w") as tf:
        for _ in range(2):
            info = tarfile.TarInfo("k.jpg")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(CorruptShardError, match="twice"):
        scan_tar_members(shard)


def test_a_samples_files_apart_in_the_tar_are_refused_naming_them(tmp_path: Path) -> None:
    """tar without --sort=name may store a.jpg, b.jpg, a.cls, b.cls: a reader that groups adjacent files
    (webdataset's, DALI's, ours) makes four samples of two, each missing a field; it was adopted so, and
    every sample then failed in the loader for want of an image or a label."""
    from ddpipe.errors import CorruptShardError

    from ..helpers import tar_of

    shard = tar_of(tmp_path / "apart.tar", ["d/a.jpg", "d/b.jpg", "d/a.cls", "d/b.cls"])
    with pytest.raises(CorruptShardError, match=r"apart.tar: the files of sample 'd/a' are not together \('d/a.jpg', "
                                                r"then other samples' files, then 'd/a.cls'\).*tar --sort=name"):
        scan_tar_members(shard)


def test_samples_outlive_their_reader_and_an_abandoned_scan(tmp_path: Path) -> None:
    """The reader maps the shard: closing it mid-scan, or dropping a scan half-read, must neither fail
    nor change a sample already handed out, nor one the suspended scan still gives."""
    from ddpipe.formats.tar import TarReader

    items = example_samples(12)
    shard = TestTarConformance().write(tmp_path / "s.tar", items)
    reader = TarReader(shard)
    scan = reader.scan(2)
    first = [next(scan) for _ in range(3)]
    reader.close()
    first.append(next(scan))
    del scan, reader
    assert first == items[2:6]
    with TarReader(shard) as again:
        assert again[11] == items[11]
        assert list(again.scan(12)) == []


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 180), min_size=2, max_size=6, unique=True))
def test_header_check_accepts_long_names_and_refuses_a_swap(tmp_path: Path, lengths: list[int]) -> None:
    """The index check finds every member where the index says, names past tar's 100-byte field
    included (those headers are parsed, not compared whole); two members' offsets swapped in the
    index is refused."""
    from ddpipe.errors import CorruptShardError
    from ddpipe.formats.tar import TarReader
    from ddpipe.formats.tar_index import check_index_against_headers

    items = [{KEY: "k" * n, "bin": bytes([n]) * (600 + n)} for n in lengths]  # sizes differ: a swap shows
    shard = TestTarConformance().write(tmp_path / f"t{len(lengths)}-{lengths[0]}.tar", items)
    with TarReader(shard) as reader:
        groups = reader.groups
        check_index_against_headers(shard, groups, reader.content())
        swapped = [list(g) for g in groups]
        (e0, o0, s0, n0), (e1, o1, s1, n1) = swapped[0][0], swapped[1][0]
        swapped[0][0], swapped[1][0] = (e0, o1, s0, n0), (e1, o0, s1, n1)
        with pytest.raises(CorruptShardError, match="does not match the tar header"):
            check_index_against_headers(shard, swapped, reader.content())


@settings(max_examples=50, deadline=None)
@given(groups=st.lists(st.lists(st.tuples(st.sampled_from(["jpg", "cls", "seg.png"]), st.integers(0, 2**40),
                                          st.integers(0, 2**31), st.from_regex(r"[a-z0-9_/]{1,12}\.[a-z]{3}",
                                                                               fullmatch=True)),
                                min_size=1, max_size=3), max_size=20))
def test_index_parse_reads_back_what_was_written(groups: list[list[tuple[str, int, int, str]]]) -> None:
    """Samples of one, two and three members mixed: each comes back as it was written, in order."""
    from ddpipe.formats.tar_index import format_dali_index

    assert parse_dali_index(format_dali_index(groups), "x.idx") == groups


def test_index_parse_rejects_garbage(tmp_path: Path) -> None:
    from ddpipe.errors import CorruptShardError

    with pytest.raises(CorruptShardError, match="bad DALI index"):
        parse_dali_index("v9 1\njpg 1 2 x.jpg\n", tmp_path / "x.idx")
    for text in ("v1.2 1\njpg 1 2\n", "v1.2 2\njpg 1 2 x.jpg\n", "v1.2 1\njpg one 2 x.jpg\n",
                 "v1.2 2\njpg 1 2 x.jpg\n\n"):
        with pytest.raises(CorruptShardError, match="bad DALI index"):
            parse_dali_index(text, tmp_path / "x.idx")
    for text in ("", "not an index\n", "v1.2 two\njpg 1 2 x.jpg\n"):  # said as what the first line should be
        with pytest.raises(CorruptShardError, match=r"bad DALI index: its first line is .*, not 'v1\.2 <samples>'$"):
            parse_dali_index(text, tmp_path / "x.idx")


def test_known_indexes_parse_an_index_once_up_to_their_limit_and_a_bad_one_every_time(tmp_path: Path) -> None:
    import pickle

    from ddpipe.errors import CorruptShardError
    from ddpipe.formats.tar import TarFormat
    from ddpipe.formats.tar_index import KnownIndexes

    shard = TestTarConformance().write(tmp_path / "s.tar", example_samples())
    idx = index_path(shard)
    members = sum(map(len, scan_tar_members(shard)))
    kept, over = KnownIndexes(limit=members), KnownIndexes(limit=members - 1)
    assert kept.read(idx) is kept.read(idx)  # the same parse, shared
    assert over.read(idx) is not over.read(idx)  # past the limit: parsed each time, to the same members
    assert over.read(idx).groups == kept.read(idx).groups == scan_tar_members(shard)
    fmt = TarFormat()  # as get_format("wds") makes it for each dataset
    with fmt.reader(shard) as reader:
        fmt.verify(reader, fmt.checksum(reader))
    assert fmt.indexes.read(idx) is fmt.indexes.read(idx)  # kept by the format its dataset has
    assert len(pickle.dumps(fmt)) == len(pickle.dumps(TarFormat()))  # sent to a process without them
    good = idx.read_bytes()
    idx.write_bytes(good.replace(b"v1.2", b"v9.9", 1))
    for _ in range(2):
        with pytest.raises(CorruptShardError, match="bad DALI index"):
            kept.read(idx)
    idx.write_bytes(good)
    assert kept.read(idx).groups == scan_tar_members(shard)


@pytest.mark.dali
def test_dali_webdataset_reader_reads_ddpipe_tars(tmp_path: Path) -> None:
    dali = pytest.importorskip("nvidia.dali", reason="DALI is installed by make test (ddpipe[dali])")
    from nvidia.dali import fn

    items = example_samples(20)
    shards = []
    for k in range(2):
        shards.append(TestTarConformance().write(tmp_path / f"s{k}.tar", items[k * 10 : (k + 1) * 10]))

    @dali.pipeline_def(batch_size=5, num_threads=1, device_id=None)
    def pipe():  # type: ignore[no-untyped-def]
        jpg, cls = fn.readers.webdataset(  # type: ignore[misc]  # DALI's stubs type its readers as returning None
            paths=[str(s) for s in shards], index_paths=[str(index_path(s)) for s in shards],
            ext=["jpg", "cls"], random_shuffle=False, missing_component_behavior="error")
        return jpg, cls

    p = pipe()
    p.build()
    got = []
    for _ in range(4):
        jpg, cls = p.run()
        got += [(np.array(jpg[i]).tobytes(), np.array(cls[i]).tobytes()) for i in range(len(jpg))]
    assert got == [(s["jpg"], s["cls"]) for s in items]


def _written_by_tarfile(path: Path, samples: list[dict[str, bytes | str]]) -> None:
    """The same samples written member by member by Python's tarfile, with ddpipe's fixed metadata."""
    with tarfile.open(path, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for s in samples:
            key = s[KEY]
            assert isinstance(key, str)
            for field in sorted(k for k in s if k != KEY):
                data = s[field]
                assert isinstance(data, bytes)
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size, info.mtime, info.mode, info.uname, info.gname = len(data), 0, 0o444, "", ""
                tf.addfile(info, io.BytesIO(data))


_keys = st.lists(st.from_regex(r"[A-Za-z0-9_\-+=,@~%]{1,60}", fullmatch=True), min_size=1, max_size=3).map("/".join)
_fields = st.from_regex(r"[a-z0-9][a-z0-9_\-.]{0,40}[a-z0-9]|[a-z]", fullmatch=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(samples=st.lists(st.tuples(_keys, st.dictionaries(_fields, st.binary(max_size=1500), min_size=1, max_size=3)),
                        max_size=8, unique_by=lambda s: s[0]))
def test_writer_writes_tarfiles_bytes_and_an_index_that_agrees_with_them(
        tmp_path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> None:
    """The shard is byte for byte what Python's tarfile writes for the same members (names past
    ustar's 100 bytes, in PAX headers, included), and its index is what reading its headers back
    gives: the offsets recorded while writing are where the data lie."""
    items: list[dict[str, bytes | str]] = [{KEY: key, **fields} for key, fields in samples]
    tag = f"{len(items)}-{sum(len(k) for k, _ in samples)}"
    ours, theirs = tmp_path / f"ours-{tag}.tar", tmp_path / f"theirs-{tag}.tar"
    if items:
        TestTarConformance().write(ours, items)
    else:  # a writer with no sample still makes an archive
        from ddpipe.formats import get_format

        with get_format("wds").writer(ours):
            pass
    _written_by_tarfile(theirs, items)
    assert ours.read_bytes() == theirs.read_bytes()
    assert parse_dali_index(index_path(ours).read_text(), index_path(ours)) == scan_tar_members(ours)
