"""Datasets that other tools wrote, adopted in place by ``ddpipe index`` and read: HDF5 and LMDB
layouts, Caffe datums and pickles give every sample with its label, as views or copies, on two ranks;
damage and changes after indexing are errors naming what, never a crash or a pickle run."""

from __future__ import annotations

import io
import os
from pathlib import Path

import h5py
import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import ddpipe
from ddpipe.sample import BAD

from ..conftest import run_cli
from ..helpers import read_in_own_process
from . import foreign_data as fd
from .adopted import LAYOUTS, adopt


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_adopted_in_place_reads_every_sample_with_its_label(name: str, tmp_path: Path) -> None:
    root = adopt(name, tmp_path)
    ds = ddpipe.open_dataset(root)
    assert len(ds) == LAYOUTS[name][2]
    assert ds.manifest.classes == tuple(str(c) for c in range(fd.CLASSES))
    labels = ds.manifest.sample_labels()  # recorded at adoption, for ddpipe plan
    assert labels is not None and labels.tolist() == [int(sample["cls"]) for sample in ds]
    for sample in ds:
        field = next(f for f in ("jpg", "ppm") if f in sample)
        pixel = np.asarray(Image.open(io.BytesIO(sample[field])).convert("RGB"))[5, 5]
        expected = np.array(fd.colour(int(sample["cls"])))
        assert np.abs(pixel.astype(int) - expected).max() <= 8, sample["__key__"]  # the image matches its label
    report = run_cli("verify", root, "--decode")
    assert report.returncode == 0 and "OK" in report.stdout, report.stdout + report.stderr


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_adopted_data_converts_to_shards_of_the_same_samples(name: str, tmp_path: Path) -> None:
    """``ddpipe convert`` of an adopted dataset writes the samples its readers give, each parsed
    from its record (a msgpack map, a datum, a pickle), not the record as stored."""
    root = adopt(name, tmp_path)
    ddpipe.convert(root, tmp_path / "shards", ddpipe.ConvertOptions(format="wds"))
    adopted = [{field: bytes(value) if field != "__key__" else value for field, value in sample.items()}
               for sample in ddpipe.open_dataset(root)]
    assert [dict(sample) for sample in ddpipe.open_dataset(tmp_path / "shards")] == adopted


@pytest.mark.parametrize("name", [name for name in LAYOUTS if "lmdb" in name or "caffe" in name])
def test_an_adopted_lmdb_read_one_record_at_a_time_gives_what_a_scan_gives(name: str, tmp_path: Path) -> None:
    """Random reads (a global shuffle's) find each record where the tree walk found it, not through
    LMDB: the same samples, in any order, as a scan."""
    root = adopt(name, tmp_path)
    ds = ddpipe.open_dataset(root)
    with ds.open_shard(0) as reader:
        scanned = [reader.parse(sample) for sample in reader.scan()]
    order = np.random.default_rng(0).permutation(len(scanned)).tolist()
    with ds.open_shard(0) as reader:
        assert [reader.parse(reader[i]) for i in order] == [scanned[i] for i in order]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_adopted_data_read_as_views_gives_what_a_read_copies(name: str, tmp_path: Path) -> None:
    """Read for DALI (views), adopted data gives the samples a plain read copies, each checked
    against its digest; an image stored whole in an LMDB or an encoded Datum, or in an HDF5 file's
    variable-length rows, is a view of the file in memory (DALI reads it there, uncopied), and it
    outlives the read."""
    from ddpipe.reading import read_samples

    root = adopt(name, tmp_path)
    ds = ddpipe.open_dataset(root)
    everything = np.arange(len(ds))
    copies = list(read_samples(ds, everything))
    views = list(read_samples(ds, everything, views=True))
    assert [{k: v if isinstance(v, str) else bytes(v) for k, v in s.items()} for s in views] == copies
    in_place = {isinstance(s[f], memoryview) for s in views for f in ("jpg", "ppm") if f in s}
    assert in_place == {name in ("caffe-encoded", "lmdb-label-in-key", "lmdb-labels-file", "h5-vlen", "h5-one-hot",
                                  "h5-float-labels", "h5-float-attribute")}


@pytest.mark.parametrize("layout", ["grey", "grey-chw"])
def test_grey_pixels_read_as_grey_images(layout: str, tmp_path: Path) -> None:
    """MNIST's layout (rows x columns of uint8, a dataset of class numbers beside it), and torchvision's."""
    root = fd.h5_pixels(tmp_path / "grey", layout)
    assert run_cli("index", root).returncode == 0
    ds = ddpipe.open_dataset(root)
    for sample in ds:
        image = Image.open(io.BytesIO(sample["ppm"]))
        assert image.mode == "L" and image.size == (24, 20)
        assert set(np.asarray(image).ravel().tolist()) == {40 * int(sample["cls"]) + 20}, sample["__key__"]
    report = run_cli("verify", root, "--decode")
    assert report.returncode == 0 and "OK" in report.stdout, report.stdout + report.stderr


@pytest.mark.parametrize("dtype", ["float32", "float64", "uint16"])
@pytest.mark.parametrize("named", [False, True])
def test_pixels_of_another_type_than_uint8_are_named_with_what_to_do(dtype: str, named: bool, tmp_path: Path) -> None:
    """Normalised floats (0-1, or a mean taken off) or 16-bit pixels have no one right scale to 8 bits:
    refused, but naming the array found and its type, not only that no images were found."""
    root = tmp_path / "floats"
    root.mkdir()
    with h5py.File(root / "part0.h5", "w") as h:
        h["x"] = np.zeros((6, 20, 24, 3), dtype=dtype)
        h["y"] = np.arange(6) % 3
    proc = run_cli("index", root, *(["--images", "x"] if named else []))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert f"'x' holds {dtype} pixels (6 x 20 x 24 x 3)" in proc.stderr and "uint8" in proc.stderr, proc.stderr
    assert "part0.h5" in proc.stderr and not (root / "index.json").exists()


@pytest.mark.mpi
def test_adopted_datasets_load_on_two_ranks_exactly_once(tmp_path: Path) -> None:
    """Every layout through the Loader on 2 real ranks: every shuffle mode, staging, and decoding."""
    import json

    from ..conftest import mpiexec

    roots = [adopt(name, tmp_path) for name in LAYOUTS]
    out = tmp_path / "report.json"
    code = """if True:
        import json, sys, ddpipe
        from ddpipe.comm import init_comm
        c = init_comm(timeout=120)
        report = {}
        for root in sys.argv[2:]:
            for mode in ("none", "local", "partial", "global"):
                stage = {} if mode == "global" else {"stage_dir": sys.argv[1] + "/stage"}
                ld = ddpipe.EncodedStream(root, 4, shuffle=mode, exchange_fraction=0.5, round_size=4,
                                   comm=c, **stage)
                keys = [s["__key__"] for b in ld for s in b]
                report[root + " " + mode] = c.allgather(keys)
            ld = ddpipe.Loader(root, 4, decoder="dali-cpu", device="cpu", shuffle="partial", comm=c,
                               decode=ddpipe.DecodeOptions(size=16, resize_shorter=16, threads=1))
            report[root + " decoded"] = c.allgather(sum(len(y) for _, y in ld))
        if c.world.rank == 0:
            open(sys.argv[1] + "/report.json", "w").write(json.dumps(report))
    """
    proc = mpiexec(2, "-c", code, tmp_path, *roots, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    for root, (name, (_, _, n)) in zip(roots, LAYOUTS.items(), strict=True):
        for mode in ("none", "local", "partial", "global"):
            per_rank = report[f"{root} {mode}"]
            keys = [k for r in per_rank for k in r]
            assert len(set(keys)) == n and len(keys) == 2 * -(-n // 2), (name, mode)  # once, bar padding
            assert len(per_rank[0]) == len(per_rank[1]), (name, mode)
        assert sum(report[f"{root} decoded"]) == 2 * -(-n // 2), name


def _mixed_vlen_file(path: Path) -> list[bytes]:
    """A vlen dataset of small objects that share a heap collection, large ones, empty ones, and an
    element rewritten after the first write; the bytes h5py reads of each."""
    import h5py

    rng = np.random.default_rng(0)
    sizes = [0, 1, 7, 8, 9, 500, 4000, 5000, 70000, 3, 0, 123456, 16, 2]
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("images", (len(sizes),), dtype=h5py.vlen_dtype(np.uint8))
        for i, n in enumerate(sizes):
            ds[i] = rng.integers(0, 256, n, dtype=np.uint8)
        ds[5] = rng.integers(0, 256, 900, dtype=np.uint8)  # rewritten: a new heap object
        return [bytes(x.tobytes()) for x in ds[()]]


def test_vlen_images_read_from_the_file_match_h5py(tmp_path: Path) -> None:
    """The direct read of a vlen dataset (formats/hdf5_heap.py) gives h5py's bytes, scanned and one
    element at a time in any order (random access)."""
    from ddpipe.formats.foreign_hdf5 import ForeignHDF5Reader

    path = tmp_path / "mixed.h5"
    expected = _mixed_vlen_file(path)
    with ForeignHDF5Reader(path, {"images": "images"}) as reader:
        assert reader._heap is not None  # the direct path, not h5py's
        assert [s["jpg"] for s in reader.scan()] == expected
        assert [s["jpg"] for s in reader.scan(9)] == expected[9:]
    order = np.random.default_rng(1).permutation(len(expected)).tolist()
    with ForeignHDF5Reader(path, {"images": "images"}) as reader:  # a fresh mapping: nothing read before
        assert [reader[i]["jpg"] for i in order] == [expected[i] for i in order]


@pytest.fixture(scope="module")
def mixed_vlen(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """The mixed file, and the places of what a read of one element follows: the dataset's table of
    elements and the first bytes of each heap collection (headers, object headers)."""
    import h5py

    from ddpipe.formats.hdf5_heap import ELEMENT

    path = tmp_path_factory.mktemp("vlen") / "mixed.h5"
    _mixed_vlen_file(path)
    with h5py.File(path, "r") as f:
        start, count = int(f["images"].id.get_offset()), f["images"].shape[0]
    table = np.frombuffer(path.read_bytes()[start : start + count * ELEMENT.itemsize], dtype=ELEMENT)
    places = list(range(start, start + count * ELEMENT.itemsize))
    for address in set(table["collection"].tolist()) - {0}:
        places += range(address, address + 48)
    return path, places


@settings(max_examples=150, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 7)), min_size=1, max_size=4),
       order=st.permutations(range(14)))
def test_a_damaged_vlen_file_read_one_element_at_a_time_gives_bytes_or_a_shard_error(
        mixed_vlen: tuple[Path, list[int]], flips: list[tuple[int, int]], order: list[int]) -> None:
    """Elements read one at a time from the file (their table, collections and bytes at places the
    file gives) come out as bytes or as one CorruptShardError naming the file, never another error,
    whatever bits of the table and the collections' headers are flipped."""
    from ddpipe.errors import CorruptShardError
    from ddpipe.formats.foreign_hdf5 import ForeignHDF5Reader

    original, places = mixed_vlen
    damaged = bytearray(original.read_bytes())
    for at, bit in flips:
        damaged[places[at % len(places)]] ^= 1 << bit
    path = original.with_name("damaged.h5")
    path.write_bytes(damaged)
    try:
        with ForeignHDF5Reader(path, {"images": "images"}) as reader:
            for i in order:
                try:
                    assert isinstance(reader[i]["jpg"], bytes)
                except CorruptShardError as e:
                    assert e.path == str(path)
    except CorruptShardError as e:  # the file does not open
        assert e.path == str(path)


@pytest.mark.parametrize("every", [1, 4, 64])
def test_an_adopted_lmdb_scans_from_any_sample_by_the_keys_it_recorded(every: int, tmp_path: Path) -> None:
    """A rank's share of an adopted LMDB starts near its first sample by a key the manifest recorded
    (every ``every``-th), not after reading every record before it; either way, the same samples."""
    from ddpipe.convert.adopt_lmdb import index_lmdb

    root = fd.lmdb_caffe(tmp_path / "caffe")
    index_lmdb(root, seek_every=every)
    dataset = ddpipe.open_dataset(root)
    assert len(dataset.manifest.layout["seek_keys"]) == -(-len(dataset) // every)
    whole = [s["__key__"] for s in dataset]
    with dataset.format.reader(root / "data.mdb") as reader:
        for start in range(len(dataset) + 1):
            assert [s["__key__"] for s in reader.scan(start)] == whole[start:], start


def test_an_adopted_lmdb_that_lost_a_record_is_an_error_naming_it(tmp_path: Path) -> None:
    """A record deleted after indexing: a scan from the start finds one record fewer than the manifest
    says, and one from a sample whose recorded seek key is the deleted one says that key is missing;
    both errors name the file."""
    import base64

    import lmdb

    from ddpipe.convert.adopt_lmdb import index_lmdb
    from ddpipe.errors import CorruptShardError

    root = fd.lmdb_caffe(tmp_path / "caffe")
    index_lmdb(root, seek_every=4)
    dataset = ddpipe.open_dataset(root)
    gone = base64.b64decode(dataset.manifest.layout["seek_keys"][2])  # sample 8's
    env = lmdb.open(str(root / "data.mdb"), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        assert txn.delete(gone)
    env.close()
    with dataset.format.reader(root / "data.mdb") as reader:
        with pytest.raises(CorruptShardError, match=rf"data\.mdb.*holds {len(dataset) - 1} records, "
                                                     rf"index\.json says {len(dataset)}"):
            list(reader.scan(0))
        with pytest.raises(CorruptShardError, match=r"data\.mdb.*is missing"):
            list(reader.scan(9))


class _Planted:
    """A pickle that creates a file when unpickled (as a changed value of an adopted LMDB could)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.marker),))


def test_a_pickle_changed_after_indexing_never_runs(tmp_path: Path) -> None:
    import pickle

    root = adopt("lmdb-pickle", tmp_path)
    marker = tmp_path / "ran"
    # after indexing, one value overwritten in place, the file's size unchanged: a pickle that calls
    # os.mkdir, padded to the old value's length (unpickling stops at its STOP opcode)
    mdb = root / "data.mdb"
    data = mdb.read_bytes()
    old = pickle.dumps((fd.jpeg(3), 3 % fd.CLASSES), protocol=4)
    planted = pickle.dumps(_Planted(marker), protocol=4)
    assert data.count(old) == 1 and len(planted) < len(old)
    mdb.write_bytes(data.replace(old, planted + bytes(len(old) - len(planted))))
    # digest first: the record that changed is refused as stored, before anything unpickles it
    with pytest.raises(ddpipe.DigestMismatchError, match=r"'3'.*digest differs"):
        list(ddpipe.open_dataset(root))
    loader = ddpipe.EncodedStream(root, 5, shuffle="none")
    with pytest.raises(ddpipe.CorruptShardError):
        list(loader)
    proc = run_cli("verify", root)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    proc = run_cli("convert", root, tmp_path / "out", "--format", "wds", "--quiet")
    assert proc.returncode == 1 and "digest differs" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "index.json").exists()
    assert not marker.exists()  # nothing in the file ran


def test_plain_pickles_of_every_protocol_still_read() -> None:
    import pickle

    from ddpipe.formats.lmdb_values import read_value

    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        for record in ((b"\xff\xd8\xffimg", 3), [b"\xff\xd8\xffimg", 3], {"image": b"\xff\xd8\xffimg", "label": 3}):
            assert read_value("pickle", pickle.dumps(record, protocol=protocol)) == (b"\xff\xd8\xffimg", 3)


def test_a_record_changed_after_indexing_is_refused_before_it_is_parsed(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record kind that needs parsing (msgpack here) is checked against its digest as stored:
    a changed record never reaches the parser, under any reader path."""
    from ddpipe.formats import lmdb_values

    root = adopt("lmdb-msgpack", tmp_path)
    mdb = root / "data.mdb"
    data = mdb.read_bytes()
    # a record stored once (LMDB's free pages may hold stale copies of others)
    i, old = next((i, r) for i in range(25) if data.count(r := msgpack.packb({"image": fd.jpeg(i),
                                                                             "label": i % fd.CLASSES})) == 1)
    changed = msgpack.packb({"image": fd.jpeg(i)[:-9], "label": 0})  # another label, the file's size kept
    mdb.write_bytes(data.replace(old, changed + bytes(len(old) - len(changed))))
    parsed: list[bytes] = []
    real = lmdb_values.read_value

    def read_value(kind: str, value: bytes | memoryview) -> tuple[bytes | memoryview, int | str | None]:
        parsed.append(bytes(value))
        return real(kind, value)

    monkeypatch.setattr("ddpipe.formats.foreign_lmdb.read_value", read_value)
    with pytest.raises(ddpipe.DigestMismatchError, match="digest differs"):
        list(ddpipe.open_dataset(root))
    skipped = list(ddpipe.open_dataset(root).iter_shard(0, on_corrupt=lambda shard, error: None))
    assert sum(BAD in s for s in skipped) == 1 and len(skipped) == 25
    assert len(parsed) >= 24 and not any(v.startswith(changed) for v in parsed)  # the others parsed, that one never


def test_an_adopted_lmdb_damaged_where_lmdb_looks_for_records_is_an_error_not_a_crash(tmp_path: Path) -> None:
    """An adopted LMDB is checked record by record, after LMDB has found each record: one flipped bit
    in the flags of a leaf page LMDB moves on to (a 16-bit word 10 bytes into its header) failed an
    assertion in LMDB and killed the reader (SIGABRT) under the default checks. In a process of its
    own, the damage must be one CorruptShardError naming the file."""
    root = adopt("lmdb-msgpack", tmp_path)
    mdb = root / "data.mdb"
    data = bytearray(mdb.read_bytes())
    leaf = data.index(b"%08d" % 20) // 4096 * 4096  # a page holding later records
    assert leaf > data.index(b"%08d" % 0)  # not the first LMDB reaches
    data[leaf + 10] ^= 0x02  # no longer marked a leaf
    mdb.write_bytes(bytes(data))
    proc = read_in_own_process(root)
    assert proc.returncode == 0, f"the reader died ({proc.returncode}): {proc.stderr[-500:]}"
    assert proc.stdout.startswith("refused:") and str(mdb) in proc.stdout, proc.stdout
