"""Labels of adopted datasets: class numbers, class names (stored, given, or in the keys), one-hot
rows, labels files; what is no class is refused naming the sample."""

from __future__ import annotations

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

from ..conftest import run_cli
from . import foreign_data as fd

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

    root = fd.h5_vlen(tmp_path / "scores", files=1)
    with h5py.File(root / "part0.h5", "a") as h:
        del h["labels"]
        h["labels"] = np.r_[np.arange(6.0), 6.5, np.arange(8.0)]
    proc = run_cli("index", root)
    assert proc.returncode == 0 and "no labels found" in proc.stderr, proc.stderr
    named = run_cli("index", root, "--labels", "labels")
    assert named.returncode == 1 and "label 6 is 6.5" in named.stderr and "part0.h5" in named.stderr, named.stderr
    assert named.stderr.count("\n") == 1 and "Traceback" not in named.stderr


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


def test_a_labels_file_is_read_once_for_every_epoch_until_it_is_written_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every epoch opens an adopted LMDB again, and with it the labels file beside it, whose lines (an
    ImageNet's) took seconds to read: they are kept by the version of the file, and read again once
    it is written anew (each sample's digest, taken with its label as indexed, then refuses a label
    changed since)."""
    from ddpipe.formats import lmdb_labels

    from ..helpers import adopted

    root = adopted("lmdb-labels-file", tmp_path)
    read: list[str] = []
    read_file = lmdb_labels.read_labels_file

    def counted(path: Path) -> dict[str, int]:
        read.append(path.name)
        return read_file(path)

    monkeypatch.setattr(lmdb_labels, "read_labels_file", counted)
    stream = ddpipe.EncodedStream(root, 5)

    def epoch(e: int) -> dict[str, bytes]:
        stream.set_epoch(e)
        return {s["__key__"]: bytes(s["cls"]) for batch in stream for s in batch}

    first = epoch(0)
    assert epoch(1) == first and read == ["labels.txt"]
    indexed = (root / "labels.txt").read_text()
    shifted = [f"{line.rsplit(' ', 1)[0]} {(int(line.rsplit(' ', 1)[1]) + 1) % fd.CLASSES}"
               for line in indexed.splitlines()]
    (root / "labels.txt").write_text("\n".join(shifted) + "\n\n")  # another size: a version of its own
    with pytest.raises(ddpipe.DigestMismatchError, match=r"sample \d+ \('photo-\d+_JPEG'\)"):
        epoch(2)
    (root / "labels.txt").write_text(indexed)
    assert epoch(3) == first and read == ["labels.txt"] * 3
