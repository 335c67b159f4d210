"""Datasets that other tools wrote, adopted in place by ``ddpipe index``: HDF5 and LMDB layouts,
Caffe datums, pickles only when allowed, a read-only directory, and errors that lead somewhere."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
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
from ..formats.conformance import example_samples
from ..helpers import read_in_own_process
from . import foreign_data as fd

LAYOUTS: dict[str, tuple[Callable[[Path], Path], list[str], int]] = {
    "h5-vlen": (fd.h5_vlen, [], 30),
    "h5-fixed": (fd.h5_fixed, [], 20),
    "h5-one-hot": (fd.h5_one_hot, [], 30),
    "h5-float-labels": (fd.h5_float_labels, [], 30),
    "h5-float-attribute": (lambda p: fd.h5_float_labels(p, attribute=True), [], 30),
    "h5-pixels": (fd.h5_pixels, [], 30),
    "h5-pixels-chw": (lambda p: fd.h5_pixels(p, "chw"), [], 30),
    "lmdb-label-in-key": (fd.lmdb_images_label_in_key, [], 25),
    "lmdb-labels-file": (fd.lmdb_images_labels_file, ["--labels-file", "labels.txt"], 25),
    "lmdb-msgpack": (fd.lmdb_msgpack, [], 25),
    "lmdb-pickle": (fd.lmdb_pickle, ["--allow-pickle"], 25),
    "caffe-encoded": (fd.lmdb_caffe, [], 25),
    "caffe-raw": (lambda p: fd.lmdb_caffe(p, encoded=False), [], 25),
}


def hashes(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())
            if p.is_file() and p.name != "index.json"}


def adopt(name: str, tmp: Path) -> Path:
    make, flags, _ = LAYOUTS[name]
    root = make(tmp / name)
    before = hashes(root)
    proc = run_cli("index", root, *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert hashes(root) == before  # the data files' bytes unchanged: only index.json was written
    return root


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


def test_pickles_are_refused_unless_allowed(tmp_path: Path) -> None:
    root = fd.lmdb_pickle(tmp_path / "pkl")
    proc = run_cli("index", root)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "pickles" in proc.stderr and "runs code" in proc.stderr and "--allow-pickle" in proc.stderr
    assert not (root / "index.json").exists()


@pytest.mark.parametrize("name", ["h5-vlen", "caffe-encoded"])
def test_a_read_only_directory_is_refused_before_its_files_are_read(name: str, tmp_path: Path) -> None:
    """Refused once every file had been read and hashed (minutes for an ImageNet): here, with files
    this user may not read, the answer was about them. With --out the manifest goes there. Run as a
    user file modes refuse (root, without its override of them)."""
    import sys

    from ..conftest import launch
    from ..helpers import as_a_user_file_modes_refuse

    as_user = as_a_user_file_modes_refuse()
    make, flags, n = LAYOUTS[name]
    root = make(tmp_path / "ro")
    before = hashes(root)
    out = tmp_path / "out"
    out.mkdir()
    index = [*as_user, sys.executable, "-m", "ddpipe", "index", str(root), *flags]
    files = [p for p in root.iterdir() if p.is_file()]
    try:
        root.chmod(0o555)
        for p in files:
            p.chmod(0o000)
        unread = launch(index, timeout=120)  # hang bounds
        unreadable = launch([*index, "--out", str(out)], timeout=120)
        for p in files:
            p.chmod(0o444)
        kept = launch([*index, "--out", str(out)], timeout=120)
    finally:
        root.chmod(0o755)
    assert unread.returncode == 1
    assert unread.stderr == f"ddpipe: error: {root}: the data directory is read-only: write the manifest " \
                            "elsewhere with --out DIR\n"
    first = sorted(files)[0]  # named in the system's words (an HDF5 file's were a line of HDF5's own)
    what = "HDF5 file" if first.suffix == ".h5" else "LMDB environment"
    assert unreadable.returncode == 1
    assert unreadable.stderr == f"ddpipe: error: {first}: not a readable {what}: Permission denied\n"
    assert kept.returncode == 0, kept.stderr
    assert hashes(root) == before and not (root / "index.json").exists()
    assert len(ddpipe.open_dataset(out)) == n


@pytest.mark.parametrize("name", ["tars", "h5-vlen", "caffe-encoded"])
def test_an_out_directory_that_cannot_be_made_is_refused_before_any_file_is_read(name: str, tmp_path: Path) -> None:
    """An --out under a file, or in a directory this user may not write, was found only when the
    manifest was written, after every file had been read and hashed: here, with files this user may not
    read, the answer was about them. Run as a user file modes refuse (root, without its override)."""
    import sys

    from ..conftest import launch
    from ..helpers import as_a_user_file_modes_refuse

    as_user = as_a_user_file_modes_refuse()
    if name == "tars":
        root = tmp_path / name
        ddpipe.write_dataset(root, iter(example_samples(6)), samples_per_shard=3)
        (root / "index.json").unlink()
    else:
        root = LAYOUTS[name][0](tmp_path / name)
    before = hashes(root)
    (tmp_path / "a-file").write_text("")
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    files = [p for p in root.iterdir() if p.is_file()]
    try:
        read_only.chmod(0o555)
        for p in files:
            p.chmod(0o000)
        index = [*as_user, sys.executable, "-m", "ddpipe", "index", str(root), "--out"]
        under_a_file = launch([*index, str(tmp_path / "a-file" / "m")], timeout=120)  # hang bounds
        a_file = launch([*index, str(tmp_path / "a-file")], timeout=120)
        unwritable = launch([*index, str(read_only / "m")], timeout=120)
        unwritable_itself = launch([*index, str(read_only)], timeout=120)
    finally:
        read_only.chmod(0o755)
        for p in files:
            p.chmod(0o644)
    assert [p.returncode for p in (under_a_file, a_file, unwritable, unwritable_itself)] == [1] * 4
    assert under_a_file.stderr == f"ddpipe: error: {tmp_path}/a-file/m: --out cannot be made: " \
                                  f"{tmp_path}/a-file is not a directory\n"
    assert a_file.stderr == f"ddpipe: error: {tmp_path}/a-file: --out cannot be made: it is not a directory\n"
    assert unwritable.stderr == f"ddpipe: error: {read_only}/m: --out cannot be written: {read_only} is read-only\n"
    assert unwritable_itself.stderr == f"ddpipe: error: {read_only}: --out cannot be written: it is read-only\n"
    assert hashes(root) == before and not (root / "index.json").exists() and not any(read_only.iterdir())


def test_the_manifest_can_live_in_another_directory(tmp_path: Path) -> None:
    root = fd.lmdb_caffe(tmp_path / "caffe" / "train_lmdb")
    before = hashes(root)
    out = tmp_path / "manifests" / "train"
    proc = run_cli("index", root, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert not (root / "index.json").exists() and hashes(root) == before
    assert len(ddpipe.open_dataset(out)) == 25


NAMES = ["zebra", "ant", "moose", "bee", "cat"]  # class i's name: not in class order when sorted


def true_class(sample: dict[str, bytes]) -> int:
    """The class an image's colour encodes (foreign_data.colour)."""
    pixel = np.asarray(Image.open(io.BytesIO(sample["jpg"])).convert("RGB"))[5, 5].astype(int)
    return min(range(fd.CLASSES), key=lambda c: int(np.abs(pixel - np.array(fd.colour(c))).max()))


NAMED: dict[str, Callable[[Path, list[str]], Path]] = {
    "h5-fixed": lambda p, names: fd.h5_class_names(p, names, "fixed"),
    "h5-vlen": lambda p, names: fd.h5_class_names(p, names, "vlen"),
    "h5-attribute": lambda p, names: fd.h5_class_names(p, names, "attribute"),
    "lmdb-msgpack-map": lambda p, names: fd.lmdb_msgpack_named(p, names),
    "lmdb-msgpack-pair": lambda p, names: fd.lmdb_msgpack_named(p, names, pairs=True),
}


@pytest.mark.parametrize("stored", list(NAMED))
def test_labels_stored_as_class_names_become_the_classes(stored: str, tmp_path: Path) -> None:
    root = NAMED[stored](tmp_path / "named", NAMES)
    proc = run_cli("index", root)
    assert proc.returncode == 0, proc.stderr
    ds = ddpipe.open_dataset(root)
    assert ds.manifest.classes == tuple(sorted(NAMES))
    for sample in ds:
        assert ds.manifest.classes[int(sample["cls"])] == NAMES[true_class(sample)], sample["__key__"]
    report = run_cli("verify", root, "--decode")
    assert report.returncode == 0 and "OK" in report.stdout, report.stdout + report.stderr


def test_datasets_that_are_neither_images_nor_labels_are_passed_over(tmp_path: Path) -> None:
    """A file's other datasets (a scalar description, an empty list, a table) are no candidates."""
    import h5py

    root = fd.h5_class_names(tmp_path / "more", NAMES)
    with h5py.File(root / "train.h5", "a") as h:
        h["description"] = np.bytes_(b"made by a script")  # a scalar
        h["empty"] = np.zeros(0, dtype="S4")
        h["boxes"] = np.zeros((20, 4), dtype=np.float32)
        h["weights"] = np.linspace(0.5, 1.5, 20)  # floats, but no class numbers
        h["codes"] = np.zeros((20, 4, 4), dtype=np.uint8)  # bytes, but too small to be images
    proc = run_cli("index", root)
    assert proc.returncode == 0, proc.stderr
    assert ddpipe.open_dataset(root).manifest.classes == tuple(sorted(NAMES))


@pytest.mark.parametrize("stored", ["h5-fixed", "lmdb-msgpack-map"])
def test_class_names_given_keep_their_order_and_must_name_every_label(stored: str, tmp_path: Path) -> None:
    root = NAMED[stored](tmp_path / "named", NAMES)
    (tmp_path / "classes.txt").write_text("\n".join(NAMES) + "\n")
    assert run_cli("index", root, "--classes", tmp_path / "classes.txt").returncode == 0
    ds = ddpipe.open_dataset(root)
    assert ds.manifest.classes == tuple(NAMES)
    assert all(int(sample["cls"]) == true_class(sample) for sample in ds)
    (root / "index.json").unlink()
    (tmp_path / "four.txt").write_text("\n".join(NAMES[:4]) + "\n")
    proc = run_cli("index", root, "--classes", tmp_path / "four.txt")
    assert proc.returncode == 1 and "cat" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (root / "index.json").exists()


@pytest.mark.parametrize("stored", ["h5-vlen", "lmdb-msgpack-map"])
def test_an_empty_class_name_is_refused(stored: str, tmp_path: Path) -> None:
    root = NAMED[stored](tmp_path / "blank", [*NAMES[:4], ""])
    proc = run_cli("index", root)
    assert proc.returncode == 1 and "empty or blank class name" in proc.stderr and str(root) in proc.stderr
    assert proc.stderr.count("\n") == 1 and not (root / "index.json").exists()


@pytest.mark.parametrize("stored", ["h5-fixed", "lmdb-msgpack-pair"])
def test_labels_stored_as_strings_of_digits_are_class_numbers(stored: str, tmp_path: Path) -> None:
    root = NAMED[stored](tmp_path / "digits", [str(c) for c in range(fd.CLASSES)])
    assert run_cli("index", root).returncode == 0
    ds = ddpipe.open_dataset(root)
    assert ds.manifest.classes == tuple(str(c) for c in range(fd.CLASSES))
    assert all(int(sample["cls"]) == true_class(sample) for sample in ds)


@pytest.mark.parametrize("dtype", ["uint8", "int64", "bool"])
def test_one_hot_labels_keep_a_class_for_every_column(dtype: str, tmp_path: Path) -> None:
    """Eight columns, images of five classes: the classes are the columns (a model's head is sized by
    them), and each image takes the column of its 1."""
    root = fd.h5_one_hot(tmp_path / "wide", dtype, columns=8)
    assert run_cli("index", root).returncode == 0
    ds = ddpipe.open_dataset(root)
    assert ds.manifest.classes == tuple(str(c) for c in range(8))
    assert [int(sample["cls"]) for sample in ds] == [i % fd.CLASSES for i in range(30)]


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12).flatmap(lambda c: st.tuples(st.just(c), st.lists(st.integers(0, c - 1), min_size=1,
                                                                             max_size=40))),
       st.sampled_from(["uint8", "int32", "float16", "float64", "bool"]), st.data())
def test_one_hot_rows_give_their_class_and_any_other_row_is_named(shape: tuple[int, list[int]], dtype: str,
                                                                   data: st.DataObject) -> None:
    from ddpipe.formats.foreign_hdf5 import one_hot_classes

    columns, classes = shape
    rows = np.eye(columns, dtype=dtype)[classes]
    assert one_hot_classes(rows).tolist() == classes
    bad = data.draw(st.integers(0, len(classes) - 1))
    other = (classes[bad] + data.draw(st.integers(1, columns - 1))) % columns
    junk: list[float] = {"bool": [1.0], "uint8": [1.0, 2.0], "int32": [1.0, 2.0, -1.0]}.get(dtype,
                                                                                          [1.0, 2.0, -1.0, 0.5])
    rows[bad, other] = data.draw(st.sampled_from(junk))  # two classes, or a value no one-hot row holds
    with pytest.raises(ValueError, match=f"not one-hot: row {bad} "):
        one_hot_classes(rows)


def test_hdf5_indexed_without_labels_says_so_and_how_to_name_them(tmp_path: Path) -> None:
    """Soft labels (label smoothing) are no classes: not a candidate, and refused named, saying which row."""
    import h5py

    root = fd.h5_vlen(tmp_path / "soft", files=1)
    with h5py.File(root / "part0.h5", "a") as h:
        del h["labels"]
        h["labels"] = 0.9 * np.eye(fd.CLASSES, dtype=np.float32)[np.arange(15) % fd.CLASSES] + 0.02
    proc = run_cli("index", root)
    assert proc.returncode == 0 and "no labels found" in proc.stderr and "--labels" in proc.stderr, proc.stderr
    named = run_cli("index", root, "--labels", "labels")
    assert named.returncode == 1 and "shape (15, 5) are not one-hot: row 0" in named.stderr, named.stderr
    assert named.stderr.count("\n") == 1 and "Traceback" not in named.stderr
    assert "index.json" not in os.listdir(root) or "labels" not in (root / "index.json").read_text()


def test_float_labels_that_are_no_class_numbers_are_refused_naming_one(tmp_path: Path) -> None:
    import h5py

    root = fd.h5_vlen(tmp_path / "scores", files=1)
    with h5py.File(root / "part0.h5", "a") as h:
        del h["labels"]
        h["labels"] = np.r_[np.arange(6.0), 6.5, np.arange(8.0)]
    proc = run_cli("index", root)
    assert proc.returncode == 0 and "no labels found" in proc.stderr, proc.stderr
    named = run_cli("index", root, "--labels", "labels")
    assert named.returncode == 1 and "label 6 is 6.5" in named.stderr and "part0.h5" in named.stderr, named.stderr
    assert named.stderr.count("\n") == 1 and "Traceback" not in named.stderr


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


def test_msgpack_pairs_with_float_labels_keep_whole_ones_and_refuse_the_rest(tmp_path: Path) -> None:
    """A pair's 2.0 is class 2; its 2.5 was cut to class 2 without a word."""
    records = [(b"%08d" % i, msgpack.packb([fd.jpeg(i), float(i % fd.CLASSES)])) for i in range(10)]
    root = fd._lmdb(tmp_path / "whole", records)
    assert run_cli("index", root).returncode == 0
    assert [int(sample["cls"]) for sample in ddpipe.open_dataset(root)] == [i % fd.CLASSES for i in range(10)]
    records[6] = (records[6][0], msgpack.packb([fd.jpeg(6), 1.5]))
    root = fd._lmdb(tmp_path / "soft", records)
    proc = run_cli("index", root)
    assert proc.returncode == 1 and "00000006" in proc.stderr and "1.5 is not a class number" in proc.stderr, \
        proc.stderr
    assert proc.stderr.count("\n") == 1 and not (root / "index.json").exists()


@pytest.mark.parametrize("stored", ["hdf5", "msgpack"])
def test_a_negative_label_is_refused_naming_its_sample(stored: str, tmp_path: Path) -> None:
    """-1, the usual mark of an unlabelled image, went through to training, where a loss fails on it
    (on a GPU, as a device-side assert)."""
    import h5py

    labels = [i % fd.CLASSES for i in range(15)]
    labels[3] = -1
    if stored == "hdf5":
        root = fd.h5_vlen(tmp_path / "neg", files=1)
        with h5py.File(root / "part0.h5", "a") as h:
            del h["labels"]
            h["labels"] = np.array(labels)
        where = root / "part0.h5"
    else:
        root = fd._lmdb(tmp_path / "neg", [(b"%08d" % i, msgpack.packb([fd.jpeg(i), label]))
                                            for i, label in enumerate(labels)])
        where = root / "data.mdb"
    proc = run_cli("index", root)
    assert proc.returncode == 1 and f"{where}: sample 3 has the label -1" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and not (root / "index.json").exists()


def test_ambiguous_hdf5_lists_what_it_found(tmp_path: Path) -> None:
    import h5py

    root = fd.h5_vlen(tmp_path / "two", files=1)
    with h5py.File(root / "part0.h5", "a") as h:
        h.create_dataset("thumbs", data=h["images"][()], dtype=h["images"].dtype)
    proc = run_cli("index", root)
    assert proc.returncode == 1 and "images" in proc.stderr and "thumbs" in proc.stderr
    assert "--images" in proc.stderr and "Traceback" not in proc.stderr
    assert run_cli("index", root, "--images", "thumbs").returncode == 0


@pytest.mark.parametrize(("make", "says"), [(fd.lmdb_caffe, "ddpipe index"), (fd.h5_vlen, "ddpipe index")])
def test_convert_on_adoptable_data_says_which_command_to_run(tmp_path: Path, make: Callable[[Path], Path],
                                                            says: str) -> None:
    root = make(tmp_path / "data")
    proc = run_cli("convert", root, tmp_path / "out", "--format", "wds")
    assert proc.returncode == 1 and says in proc.stderr and str(root) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "no class directories" not in proc.stderr


def test_index_on_something_it_cannot_read_says_what_it_found(tmp_path: Path) -> None:
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "notes.txt").write_text("x")
    proc = run_cli("index", tmp_path / "odd")
    assert proc.returncode == 1 and "notes.txt" in proc.stderr and "nothing to adopt" in proc.stderr


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


@pytest.mark.parametrize("name", ["h5-vlen", "caffe-encoded"])
def test_indexing_again_keeps_the_class_names_and_never_replaces_a_foreign_index_json(name: str,
                                                                                     tmp_path: Path) -> None:
    make, flags, _ = LAYOUTS[name]
    root = make(tmp_path / name)
    names = tmp_path / "names.txt"
    names.write_text("".join(f"class-{c}\n" for c in range(fd.CLASSES)))
    run_cli("index", root, *flags, "--classes", names, check=True)
    run_cli("index", root, *flags, check=True)  # again, to record what a newer ddpipe records
    assert ddpipe.load_manifest(root).classes == tuple(f"class-{c}" for c in range(fd.CLASSES))
    other = tmp_path / f"{name}-theirs"
    root.rename(other)
    (other / "index.json").write_text('{"written by": "another tool"}')
    proc = run_cli("index", other, *flags)
    assert proc.returncode != 0 and "not a ddpipe manifest" in proc.stderr and "Traceback" not in proc.stderr
    assert (other / "index.json").read_text() == '{"written by": "another tool"}'


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
    assert not marker.exists()  # nothing in the file ran


def test_plain_pickles_of_every_protocol_still_read() -> None:
    import pickle

    from ddpipe.formats.lmdb_values import read_value

    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        for record in ((b"\xff\xd8\xffimg", 3), [b"\xff\xd8\xffimg", 3], {"image": b"\xff\xd8\xffimg", "label": 3}):
            assert read_value("pickle", pickle.dumps(record, protocol=protocol)) == (b"\xff\xd8\xffimg", 3)


def test_indexing_files_that_are_not_what_they_say_is_one_line(tmp_path: Path) -> None:
    import io
    import tarfile

    for name, folder in (("data.mdb", "mdb"), ("x.h5", "h5")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_bytes(os.urandom(100_000))
    (tmp_path / "tar").mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as t:
        info = tarfile.TarInfo(b"\xff\xfe.jpg".decode("utf-8", "surrogateescape"))
        info.size = 3
        t.addfile(info, io.BytesIO(b"abc"))
    (tmp_path / "tar" / "a.tar").write_bytes(buf.getvalue())
    for folder, says in (("mdb", "not a readable LMDB environment"), ("h5", "not a readable HDF5 file"),
                         ("tar", "its name is not UTF-8")):
        proc = run_cli("index", tmp_path / folder)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and says in lines[0], proc.stderr
        assert not (tmp_path / folder / "index.json").exists()


@pytest.mark.parametrize(("flags", "says"), [  # h5py's words: "Unable to synchronously open object (...)"
    (["--labels", "nope"], "part0.h5: no dataset 'nope' of labels; found: labels (15 rows)"),
    (["--label-attr", "nope"], "part0.h5: no attribute 'nope' of labels on 'images' or the file; found: none"),
])
def test_hdf5_label_names_the_file_lacks_are_said_with_what_it_has(tmp_path: Path, flags: list[str],
                                                                   says: str) -> None:
    root = fd.h5_vlen(tmp_path / "h5")
    proc = run_cli("index", root, *flags)
    assert proc.returncode == 1 and proc.stderr == f"ddpipe: error: {root}/{says}\n"
    assert not (root / "index.json").exists()


@pytest.mark.parametrize(("flags", "says"), [
    # the record parser's own error, a traceback
    (["--values", "caffe"], "data.mdb: --values caffe does not read the first record (b'img00000_0'): wire type"),
    (["--values", "msgpack"], "data.mdb: --values msgpack does not read the first record (b'img00000_0'): not a"),
    # "data.mdb: unreadable LMDB environment: [Errno 2] No such file or directory: '.../nope.txt'"
    (["--labels-file", "nope.txt"], "nope.txt: cannot read the labels file: No such file or directory"),
])
def test_lmdb_options_that_do_not_fit_the_data_are_one_line(tmp_path: Path, flags: list[str], says: str) -> None:
    root = fd.lmdb_images_label_in_key(tmp_path / "lmdb")
    proc = run_cli("index", root, *flags)
    assert proc.returncode == 1 and proc.stderr.startswith("ddpipe: error: ") and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (root / "index.json").exists()


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


def test_a_key_whose_first_number_is_an_index_gets_its_label_from_the_other(tmp_path: Path) -> None:
    """Keys ``{index:08d}_{label}``: both guessed patterns match, and the index one would make a class
    of every sample; the label one is taken."""
    root = fd._lmdb(tmp_path / "lmdb", [(b"%08d_%d" % (i, i % fd.CLASSES), fd.jpeg(i)) for i in range(40)])
    proc = run_cli("index", root)
    assert proc.returncode == 0, proc.stderr
    ds = ddpipe.open_dataset(root)
    assert ds.manifest.classes == tuple(str(c) for c in range(fd.CLASSES))
    assert [int(s["cls"]) for s in ds] == [i % fd.CLASSES for i in range(40)]


def test_a_guess_that_makes_a_class_of_every_sample_stops_and_asks(tmp_path: Path) -> None:
    root = fd._lmdb(tmp_path / "lmdb", [(b"img_%d" % i, fd.jpeg(i)) for i in range(30)])  # a number: an index
    proc = run_cli("index", root)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "'img_0'" in proc.stderr and "30 classes" in proc.stderr and "--label-regex" in proc.stderr
    assert not (root / "index.json").exists()


def test_class_names_in_the_keys_become_the_classes(tmp_path: Path) -> None:
    """ImageNet-style keys ``n01440764/...``: a --label-regex group that captures a class name."""
    wnids = ["n01440764", "n01443537", "n01484850", "n01491361", "n01494475"]
    root = fd._lmdb(tmp_path / "lmdb", [(f"{wnids[i % 5]}/{i:05d}.JPEG".encode(), fd.jpeg(i)) for i in range(25)])
    proc = run_cli("index", root, "--label-regex", r"^(?P<label>n\d+)/")
    assert proc.returncode == 0, proc.stderr
    ds = ddpipe.open_dataset(root)
    assert ds.manifest.classes == tuple(wnids)
    for sample in ds:  # each sample's class is the one its key names (its colour is its class's)
        assert wnids[int(sample["cls"])] == sample["__key__"][:9]


def test_an_explicit_label_regex_replaces_the_class_names_an_earlier_index_recorded(tmp_path: Path) -> None:
    root = fd._lmdb(tmp_path / "lmdb", [(b"%08d_%d" % (i, i % fd.CLASSES), fd.jpeg(i)) for i in range(40)])
    first = run_cli("index", root, "--label-regex", r"^(?P<label>\d+)_")  # wrong: the index, 40 classes
    assert first.returncode == 0, first.stderr
    assert len(ddpipe.open_dataset(root).manifest.classes) == 40
    again = run_cli("index", root, "--label-regex", r"_(?P<label>\d+)$")
    assert again.returncode == 0, again.stderr
    assert ddpipe.open_dataset(root).manifest.classes == tuple(str(c) for c in range(fd.CLASSES))


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


@pytest.mark.parametrize("label", ["--1", "²"])  # int() raised on each (a '-' stripped; '²' is a digit to str)
def test_a_labels_file_line_whose_label_is_no_integer_is_one_line(label: str, tmp_path: Path) -> None:
    root = fd.lmdb_images_labels_file(tmp_path / "lmdb")
    lines = (root / "labels.txt").read_text().splitlines()
    lines[2] = f"photo-00002.JPEG {label}"
    (root / "labels.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = run_cli("index", root, "--labels-file", "labels.txt")
    assert proc.returncode == 1 and proc.stderr == f"ddpipe: error: {root}/labels.txt: line 3: expected 'key label' " \
        f"with an integer label, found 'photo-00002.JPEG {label}'\n", proc.stderr
    assert not (root / "index.json").exists()
