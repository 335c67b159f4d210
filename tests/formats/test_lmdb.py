from __future__ import annotations

import os
from pathlib import Path

import lmdb
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.sample import KEY

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


@pytest.mark.parametrize(("meta", "error"), [(None, "not a ddpipe LMDB shard"),
                                           (b'{"layout": 2, "samples": 3}', "unsupported LMDB layout 2"),
                                           (b"{not json", "unreadable or truncated LMDB shard")])
def test_an_lmdb_file_without_ddpipes_record_is_an_error_naming_it(tmp_path: Path, meta: bytes | None,
                                                                    error: str) -> None:
    """An LMDB file whose ``__ddpipe__`` record is missing, of another layout, or not JSON: an error
    naming the file and what is wrong with it, before any sample is read."""
    from ddpipe.errors import CorruptShardError
    from ddpipe.formats.lmdb import META_KEY, LMDBReader, sample_key

    path = tmp_path / "other.lmdb"
    env = lmdb.open(str(path), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        for i in range(3):
            txn.put(sample_key(i), msgpack.packb({KEY: f"k{i}", "jpg": b"x"}))
        if meta is not None:
            txn.put(META_KEY, meta)
    env.close()
    with LMDBReader(path) as reader, pytest.raises(CorruptShardError, match=rf"other\.lmdb.*{error}"):
        len(reader)


@pytest.mark.parametrize("views", [False, True])
def test_a_scan_finds_its_start_past_a_missing_sample_and_stops_at_one(tmp_path: Path, views: bool) -> None:
    """A shard whose sample 4 is gone (its record deleted, the count left at 10): a scan from sample 5
    finds it where it now lies and reads it to the end; one from sample 0 gives samples 0-3 and then
    an error naming the shard and sample 4; random reads of the others still read them."""
    from ddpipe.errors import CorruptShardError
    from ddpipe.formats.lmdb import LMDBReader, sample_key

    items = example_samples(10)
    path = TestLMDBConformance().write(tmp_path / "s.lmdb", items)
    env = lmdb.open(str(path), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        assert txn.delete(sample_key(4))
    env.close()

    def scanned(reader: LMDBReader, start: int) -> list[dict[str, object]]:
        scan = reader.scan_views(start) if views else reader.scan(start)
        return [{name: value if isinstance(value, str) else bytes(value) for name, value in sample.items()}
                for sample in scan]

    with LMDBReader(path) as reader:
        assert scanned(reader, 5) == items[5:]
        got = []
        with pytest.raises(CorruptShardError, match=r"s\.lmdb.*sample 4 is missing"):
            for sample in (reader.scan_views(0) if views else reader.scan(0)):
                got.append(sample[KEY])
        assert got == [item[KEY] for item in items[:4]]
        assert reader.parse(reader[7]) == items[7]
        with pytest.raises(CorruptShardError, match="sample 4 is missing"):
            reader[4]


def test_a_shard_hashed_through_lmdbs_own_mapping_is_then_scanned_without_a_page_fault(tmp_path: Path) -> None:
    """A shard hashed ahead is hashed through the mapping LMDB itself reads (LMDBFile): the checksum is
    the file's, and the reader that takes it over scans without faulting a page in on the reading
    thread, where a reader with an environment of its own faults its pages in as it goes (on the
    reading thread: what made LMDB the slowest format to feed DALI). A file that is not LMDB is
    hashed all the same (its checksum then tells it apart) and leaves no environment open."""
    import resource

    from ddpipe.checksum import file_checksum
    from ddpipe.formats.lmdb import LMDBFormat, LMDBReader
    from ddpipe.formats.lmdb_env import LMDBFile
    from ddpipe.formats.mapped import hash_mapped
    from ddpipe.sample import KEY

    path = tmp_path / "s.lmdb"
    TestLMDBConformance().write(path, [{KEY: f"k{i}", "jpg": os.urandom(60_000)} for i in range(64)])

    def faults_scanning(reader: LMDBReader) -> int:
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        assert sum(1 for _ in reader.scan()) == 64
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

    def mapped_in(file: Path) -> int:
        """Bytes of ``file`` in this process's page tables (the Rss of its mappings)."""
        total, this_file = 0, False
        for line in Path("/proc/self/smaps").read_text().splitlines():
            fields = line.split()
            if not fields[0].endswith(":"):  # a mapping's own line: address range ... [path]
                this_file = len(fields) >= 6 and fields[5] == str(file)
            elif this_file and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
        return total

    with LMDBReader(path) as fresh:
        assert mapped_in(path) < path.stat().st_size
        assert faults_scanning(fresh) > 4  # 3.8 MB of values: at least one fault per 16 pages
    hashed = hash_mapped(LMDBFormat().mapping(path), keep=True)
    assert hashed.checksum == file_checksum(path) and isinstance(hashed.mapped, LMDBFile)
    assert mapped_in(path) >= path.stat().st_size  # every page in before the reader takes it over
    with LMDBReader(path) as reader:
        reader.adopt_mapping(hashed.mapped)
        assert reader.mapped_file() is hashed.mapped
        # none of the file's pages: a fault or two is the interpreter's heap growing for the samples
        assert faults_scanning(reader) <= 2

    other = tmp_path / "other.lmdb"
    other.write_bytes(os.urandom(1 << 16))
    assert LMDBFile(other).checksum() == file_checksum(other)


@pytest.mark.parametrize("kind", ["shard", "no samples", "no records"])
def test_lmdbs_mapping_is_found_where_lmdb_maps_the_file(tmp_path: Path, kind: str) -> None:
    """The environment's mapping is found where LMDB maps the file, another mapping of the file beside
    it or not: its bytes are the file's, and the hash through it is the file's checksum. A file
    without records has none found, and is hashed through a mapping of its own."""
    from ddpipe.checksum import file_checksum
    from ddpipe.formats.lmdb_env import LMDBFile
    from ddpipe.formats.mapped import MappedFile

    path = tmp_path / "s.lmdb"
    if kind == "no records":
        lmdb.open(str(path), subdir=False, lock=False).close()
    else:
        TestLMDBConformance().write(path, example_samples(40 if kind == "shard" else 0))
    beside = MappedFile(path)
    with beside.content():  # a plain mapping of the same file, made first
        shard = LMDBFile(path)
        mapping = shard.mapping()
        if kind == "no records":
            assert mapping is None
        else:
            assert mapping is not None and bytes(memoryview(mapping).cast("B")) == path.read_bytes()
        assert shard.checksum() == file_checksum(path)
        del mapping
        shard.close()


def test_two_readers_of_one_shard_at_once_share_its_environment(tmp_path: Path) -> None:
    """LMDB lets a process open a file's environment once: two streams over one LMDB dataset (a
    training loader and an evaluation one, say), each checking and reading the same shards at the
    same time, both read everything, and once both are gone (their datasets keep each shard's mapping,
    and so its environment, for their next epoch) the environment is closed."""
    import gc

    import ddpipe
    from ddpipe.sample import KEY

    root = tmp_path / "d"
    ddpipe.write_dataset(root, iter([{KEY: f"k{i:03d}", "jpg": os.urandom(3000), "cls": b"%d" % (i % 2)}
                                     for i in range(60)]), format="lmdb", samples_per_shard=16)
    a, b = (ddpipe.EncodedStream(root, 8, shuffle="none") for _ in range(2))
    got_a, got_b = [], []
    for x, y in zip(a, b, strict=True):  # the two in step: each shard is open in both at once
        got_a += [s[KEY] for s in x]
        got_b += [s[KEY] for s in y]
    assert got_a == got_b == [f"k{i:03d}" for i in range(60)]
    del a, b, x, y
    gc.collect()
    for shard in sorted(root.glob("*.lmdb")):  # no environment left open: a plain open is allowed again
        lmdb.open(str(shard), subdir=False, readonly=True, lock=False).close()


def test_views_hold_the_environment_open_until_the_last_goes(tmp_path: Path) -> None:
    """Fields scanned as views are views of the file where LMDB maps it, so they outlive their reader:
    the environment stays open while one is held and closes when the last goes."""
    import gc

    from ddpipe.formats.lmdb import LMDBReader
    from ddpipe.sample import KEY

    items = example_samples()
    path = TestLMDBConformance().write(tmp_path / "s.lmdb", items)

    def open_elsewhere() -> bool:
        try:
            lmdb.open(str(path), subdir=False, readonly=True, lock=False).close()
        except lmdb.Error:
            return False
        return True

    with LMDBReader(path) as reader:
        views = list(reader.scan_views())
    assert all(isinstance(s["jpg"], memoryview) for s in views)
    assert not open_elsewhere()  # held open by the views
    assert [{k: v if k == KEY else bytes(v) for k, v in s.items()} for s in views] == items
    one = views[3]["jpg"]
    del views
    gc.collect()
    assert not open_elsewhere()
    assert bytes(one) == items[3]["jpg"]
    del one
    gc.collect()
    assert open_elsewhere()


_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.", min_size=1, max_size=40)
_values = st.one_of(st.binary(max_size=300), st.integers(256, 70_000).map(lambda n: b"\x07" * n))
_records = st.builds(lambda key, fields: {"__key__": key, **fields}, st.text(max_size=40),
                     st.dictionaries(_names.filter(lambda n: n != "__key__"), _values, max_size=14))


@settings(max_examples=200, deadline=None)
@given(record=_records, other=st.one_of(st.none(), st.integers(-(1 << 63), (1 << 64) - 1), st.lists(st.booleans())),
       cut=st.integers(0, 1 << 20), pad=st.binary(max_size=8))
def test_a_record_parsed_in_place_is_the_one_msgpack_unpacks(record: dict[str, object], other: object, cut: int,
                                                              pad: bytes) -> None:
    """A record as the writer packs it is parsed in place into the fields msgpack gives, each a view;
    a record of any other shape, or cut short, is left to msgpack (None), never misread, whatever
    bytes follow it."""
    from ddpipe.formats.lmdb import record_views

    packed = msgpack.packb(record, use_bin_type=True)
    whole = memoryview(pad + packed + pad)
    views = record_views(whole, len(pad), len(pad) + len(packed))
    assert views is not None
    assert {k: v if isinstance(v, str) else bytes(v) for k, v in views.items()} == msgpack.unpackb(packed)
    assert all(isinstance(v, memoryview) for k, v in views.items() if k != "__key__")
    end = len(pad) + cut % len(packed)  # cut short
    assert record_views(whole, len(pad), end) is None
    # a place outside the bytes given (a record LMDB gave that lies elsewhere): nothing read there
    assert record_views(whole, -1, len(packed)) is None and record_views(whole, len(pad), len(whole) + 1) is None
    if other is not None:  # a field that is no bytes
        odd = msgpack.packb({**record, "odd": other}, use_bin_type=True)
        assert record_views(memoryview(odd + pad), 0, len(odd)) is None


def test_a_node_pointer_damaged_after_conversion_is_an_error_not_a_crash(tmp_path: Path) -> None:
    """LMDB follows what its pages hold without bounds: one flipped bit in a leaf page's array of node
    offsets (after its 16-byte header) made it read a node from the next pages and a value past the
    file's end, killing the reader with SIGBUS. Read unchecked (``verify=False``; the shard's checksum
    would catch it first), in a process of its own, the damage must be one CorruptShardError naming
    the shard."""
    from ..helpers import make_dataset, read_in_own_process

    root = make_dataset(tmp_path / "ds", "lmdb", [10, 10])
    shard = sorted(root.glob("*.lmdb"))[0]
    data = bytearray(shard.read_bytes())
    leaf = data.index(b"%012d" % 0) // 4096 * 4096  # the page holding the records
    data[leaf + 16 + 2 * 3 + 1] ^= 0x20  # the fourth record's node offset, 8 KB further on
    shard.write_bytes(bytes(data))
    proc = read_in_own_process(root, verify=False)
    assert proc.returncode == 0, f"the reader died ({proc.returncode}): {proc.stderr[-500:]}"
    assert proc.stdout.startswith("refused:") and str(shard) in proc.stdout, proc.stdout


def _many_records(path: Path, n: int) -> None:
    env = lmdb.open(str(path), subdir=False, map_size=1 << 30)
    with env.begin(write=True) as txn:
        for i in range(n):  # small values inline in leaf pages, large ones in overflow pages
            txn.put(b"%08d" % i, bytes([i % 251]) * (50 if i % 3 else 5000))
    env.close()


def test_the_tree_walk_finds_the_pages_and_keys_lmdb_has(tmp_path: Path) -> None:
    from ddpipe.formats.lmdb_tree import check_tree, tree_keys, tree_pages

    path = tmp_path / "many.mdb"
    _many_records(path, 20_000)
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    stat = env.stat()
    with env.begin() as txn:
        keys = [bytes(key) for key in txn.cursor().iternext(keys=True, values=False)]
    env.close()
    assert stat["depth"] >= 3  # branch pages under branch pages
    assert len(tree_pages(path.read_bytes())) == stat["branch_pages"] + stat["leaf_pages"]
    assert check_tree(path) == tree_pages(path.read_bytes())  # the file's own mapping, its pages asked for ahead
    assert tree_keys(path) == keys  # read from the leaf pages, in LMDB's order


@pytest.mark.parametrize("walk", ["its own", "its environment's"])
def test_placed_records_hold_each_key_and_value_where_lmdb_finds_them(tmp_path: Path, walk: str) -> None:
    """Random reads find every record's key and value (inline, and in overflow pages) as LMDB's own
    cursor gives them, in its order, and look a key up (LMDB's default order) or say it is not there:
    through a walk of their own, or the one the file's environment made as it opened (a reader reopened
    while its environment stays open)."""
    import random

    from ddpipe.formats.lmdb_env import lease_environment
    from ddpipe.formats.lmdb_places import PlacedRecords

    path = tmp_path / "many.mdb"
    _many_records(path, 20_000)
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        records = [(bytes(key), bytes(value)) for key, value in txn.cursor()]
    env.close()
    st = path.stat()
    lease = lease_environment(path)
    walked = lease.placed() if walk == "its environment's" else None
    assert walked is not None or walk == "its own"
    placed = PlacedRecords(path, (st.st_dev, st.st_ino), walked)
    del walked
    lease.release()
    keys = placed.keys
    assert len(keys) == len(records) and list(keys) == [key for key, _ in records]
    for j in [0, 1, len(records) - 1, *random.Random(0).sample(range(len(records)), 300)]:
        key, value = records[j]
        assert keys[j] == key and keys[j - len(records)] == key and placed.value(j) == value
        assert keys.find(key) == j
    assert keys[5:8] == [key for key, _ in records[5:8]]
    for absent in (b"", b"%08d" % len(records), b"00000001x", b"0000000", b"\xff"):
        assert keys.find(absent) is None
    with pytest.raises(IndexError):
        keys[len(records)]
    placed.close()


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tree") / "t.mdb"
    _many_records(path, 400)
    return path


@settings(max_examples=300, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 7)), min_size=1, max_size=4))
def test_the_tree_walk_of_any_damaged_file_holds_or_is_a_tree_error(small_tree: Path,
                                                                    flips: list[tuple[int, int]]) -> None:
    """The walk reads nothing outside the file whatever its bytes say (struct's, numpy's, mmap's and
    Python's own errors, an offset past the end, would show here), and what it lets through names only
    pages within the file, each once: the pages LMDB will then follow. Walked from a file, as ddpipe
    walks it: through a mapping whose pages are asked for ahead."""
    from ddpipe.formats.lmdb_tree import TreeError, check_tree, tree_keys

    damaged = bytearray(small_tree.read_bytes())
    for at, bit in flips:
        damaged[at % (4096 * 8)] ^= 1 << bit  # the meta, branch and first leaf pages
    path = small_tree.with_name("damaged.mdb")
    path.write_bytes(damaged)
    try:
        pages = check_tree(path)
        keys = tree_keys(path)
    except TreeError:
        return
    assert all(isinstance(key, bytes) for key in keys)
    assert pages == sorted(set(pages)) and all(2 <= page < len(damaged) // 4096 for page in pages), pages


def test_random_reads_read_the_file_the_reader_opened_or_say_it_was_replaced(tmp_path: Path) -> None:
    """A random read finds a record where the tree walk found it, reading the file by its path: a file
    renamed over the shard after its reader opened it (and checked it) is not read in its place."""
    import ddpipe

    from ..helpers import make_dataset

    root = make_dataset(tmp_path / "ds", "lmdb", [10, 10])
    ds = ddpipe.open_dataset(root)
    with ds.open_shard(0, verify=True) as reader:
        first = reader.parse(reader[3])
        other = tmp_path / "other.lmdb"
        other.write_bytes(ds.shard_path(1).read_bytes())
        os.replace(other, ds.shard_path(0))
        assert reader.parse(reader[3]) == first  # the records' places were found before the rename
    with ds.open_shard(0) as reader:  # the replacement, opened now: its own records
        assert reader.parse(reader[3]) != first
    with ds.open_shard(0) as reader:
        next(reader.scan())  # the environment opens on the file now there
        os.replace(tmp_path / "ds" / ds.manifest.shards[1].file, ds.shard_path(0))
        with pytest.raises(ddpipe.CorruptShardError, match="replaced since it was opened"):
            reader[3]


def _records_made(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    """The files whose record places (PlacedRecords) are made, and the files whose trees are walked,
    as they are."""
    from ddpipe.formats import lmdb_places, lmdb_tree

    made: list[str] = []
    walked: list[str] = []
    make, walk = lmdb_places.PlacedRecords.__init__, lmdb_tree.walk_file

    def counted_make(self: lmdb_places.PlacedRecords, path: Path, *args: object, **kwargs: object) -> None:
        made.append(Path(path).name)
        make(self, path, *args, **kwargs)  # type: ignore[arg-type]

    def counted_walk(path: Path, *args: object, **kwargs: object) -> object:
        walked.append(Path(path).name)
        return walk(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lmdb_places.PlacedRecords, "__init__", counted_make)
    for module in (lmdb_tree, lmdb_places):  # each walks files: lmdb_places where it has no walk to place by
        monkeypatch.setattr(module, "walk_file", counted_walk)
    return made, walked


def test_a_global_shuffle_places_each_shards_records_once_however_often_it_reopens_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random access keeps a few shards open (OPEN_SHARDS) and reopens the others as their samples come.
    Where each record lies is made once while the shard's environment is open (its mapping kept from
    one epoch to the next), from the walk made as it opened, and shared by every reopen."""
    import ddpipe
    from ddpipe.dataset import OPEN_SHARDS

    from ..helpers import make_dataset

    made, walked = _records_made(monkeypatch)
    root = make_dataset(tmp_path / "ds", "lmdb", [3] * (OPEN_SHARDS + 4), payload=200)
    names = sorted(p.name for p in root.glob("*.lmdb"))
    stream = ddpipe.EncodedStream(root, 4, shuffle="global")

    def epoch(e: int) -> tuple[list[str], list[str]]:
        made.clear()
        walked.clear()
        stream.set_epoch(e)
        assert sum(len(batch) for batch in stream) == 3 * len(names)
        return sorted(made), sorted(walked)

    assert epoch(0) == (names, names)  # each walked as its environment opened, its records placed from that walk
    assert epoch(1) == ([], [])


def _environments_opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files LMDB opens an environment on, as it does."""
    opened: list[str] = []
    open_env = lmdb.open

    def counted(path: str, *args: object, **kwargs: object) -> lmdb.Environment:
        opened.append(Path(path).name)
        return open_env(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(lmdb, "open", counted)
    return opened


def test_a_share_read_sample_by_sample_learns_where_each_shards_records_lie_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's share of a global shuffle on many nodes reads a few samples of each shard an epoch,
    each checked against its digest. Where a shard's records lie is learnt of the file's version
    (inode, size, time) in the first epoch; later epochs read them there without opening LMDB or
    walking the tree. A file written anew is learnt again; one changed in place at the same size
    and time is read at the old places, and the changed sample's digest says so."""
    import numpy as np

    import ddpipe
    from ddpipe.reading import read_samples

    from ..helpers import flip_inside_sample, make_dataset, shard_file

    root = make_dataset(tmp_path / "ds", "lmdb", [8] * 4, payload=300)
    names = sorted(p.name for p in root.glob("*.lmdb"))
    dataset = ddpipe.open_dataset(root)
    share = np.array([25, 1, 17, 9])  # one sample of each shard's eight: checked sample by sample
    opened = _environments_opened(monkeypatch)
    _, walked = _records_made(monkeypatch)

    def epoch() -> tuple[list[tuple[str, bytes]], list[str], list[str]]:
        opened.clear()
        walked.clear()
        got = [(s[KEY], bytes(s["bin"])) for s in read_samples(dataset, share, random_access=True)]
        return got, sorted(opened), sorted(walked)

    first, opened_first, walked_first = epoch()
    assert [key for key, _ in first] == [f"s/{i:06d}" for i in share]
    assert opened_first == walked_first == names
    assert epoch() == (first, [], [])
    copy = tmp_path / "copy.lmdb"
    copy.write_bytes(shard_file(root, 2).read_bytes())
    os.replace(copy, shard_file(root, 2))  # the same bytes in another file
    assert epoch() == (first, [names[2]], [names[2]])
    assert epoch() == (first, [], [])
    flip_inside_sample(shard_file(root, 1), first[3][1])  # sample 9 (shard 1's second), its size and time kept
    with pytest.raises(ddpipe.DigestMismatchError, match="sample 1 \\('s/000009'\\)"):
        epoch()
    assert opened == [] and walked == []


def test_an_adopted_lmdb_read_at_random_walks_its_tree_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its environment walks its tree as it opens (before LMDB reads a page); its records are placed from
    that walk, not from a second one."""
    import ddpipe

    from ..helpers import adopted

    root = adopted("caffe-encoded", tmp_path)
    made, walked = _records_made(monkeypatch)
    stream = ddpipe.EncodedStream(root, 4, shuffle="global")
    assert sum(len(batch) for batch in stream) == 25
    assert len(made) == len(walked) == 1


def test_an_adopted_lmdb_read_at_random_again_reads_its_records_where_they_lie_without_lmdb(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One adopted file may hold a whole dataset, of which a rank reads a share every epoch, each
    record checked against its digest. Where its records lie, and which are samples, is learnt of the
    file's version in the first epoch; later epochs read them there without opening LMDB or walking
    its tree. A record changed in place, the file's size and time kept, is read at its old place and
    refused by its digest."""
    import numpy as np

    import ddpipe
    from ddpipe.reading import read_samples

    from ..helpers import adopted, flip_inside_sample, shard_file

    root = adopted("caffe-encoded", tmp_path)
    dataset = ddpipe.open_dataset(root)
    share = np.array([20, 3, 11, 7])
    opened = _environments_opened(monkeypatch)
    _, walked = _records_made(monkeypatch)

    def epoch() -> tuple[list[tuple[str, bytes, bytes]], int, int]:
        opened.clear()
        walked.clear()
        got = [(s[KEY], bytes(s["jpg"]), bytes(s["cls"])) for s in read_samples(dataset, share, random_access=True)]
        return got, len(opened), len(walked)

    first, opened_first, walked_first = epoch()
    assert [key for key, *_ in first] == [list(dataset)[i][KEY] for i in share]
    assert opened_first == walked_first == 1
    assert epoch() == (first, 0, 0)
    flip_inside_sample(shard_file(root, 0), first[2][1])  # the image of the share's third sample
    with pytest.raises(ddpipe.DigestMismatchError, match=f"sample 11 \\({first[2][0]!r}\\)"):
        epoch()
    assert opened == [] and walked == []
