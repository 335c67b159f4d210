"""The list files a conversion reads: CSV and TSV (path, label), the 'path label' lines of Caffe's
ImageNet lists (train.txt, val.txt), and MXNet's im2rec .lst (index, label, path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ddpipe
from ddpipe import ConvertOptions, SourceError, convert

from ..conftest import run_cli


def labels_by_key(root: Path) -> dict[str, int]:
    return {str(s["__key__"]): int(s["cls"]) for s in ddpipe.open_dataset(root)}


@pytest.fixture
def listed(raw_images: Path, tmp_path: Path) -> list[tuple[str, int]]:
    """Each image's path relative to tmp_path (one with a space in its name), and a label."""
    files = sorted(raw_images.rglob("*.jpg"))
    spaced = tmp_path / "with space.jpg"
    spaced.write_bytes(files[0].read_bytes())
    return [(os.path.relpath(f, tmp_path), i % 3) for i, f in enumerate([*files[1:], spaced])]


def test_caffe_and_mxnet_lists_give_the_labels_a_csv_gives(listed: list[tuple[str, int]], tmp_path: Path) -> None:
    (tmp_path / "list.csv").write_text("".join(f"{p},{c}\n" for p, c in listed))
    (tmp_path / "train.txt").write_text("".join(f"{p} {c}\n" for p, c in listed))
    # as im2rec writes it: labels as floats
    (tmp_path / "train.lst").write_text("".join(f"{i}\t{c:f}\t{p}\n" for i, (p, c) in enumerate(listed)))
    options = ConvertOptions(samples_per_shard=5, progress=False)
    convert(tmp_path / "list.csv", tmp_path / "c", options)
    want = labels_by_key(tmp_path / "c")
    assert len(want) == len(listed) and sorted(set(want.values())) == [0, 1, 2]
    for name in ("train.txt", "train.lst"):
        convert(tmp_path / name, tmp_path / name.replace(".", "_"), options)
        assert labels_by_key(tmp_path / name.replace(".", "_")) == want, name


def test_an_mxnet_list_of_several_labels_a_row_is_refused_naming_the_row(listed: list[tuple[str, int]],
                                                                         tmp_path: Path) -> None:
    lst = tmp_path / "multi.lst"
    lst.write_text(f"0\t1\t{listed[0][0]}\n1\t2\t0\t{listed[1][0]}\n")
    with pytest.raises(SourceError, match=r"multi.lst: row 2 has 4 columns; an im2rec \.lst row is index, label, "
                                          r"path \(one label\)"):
        convert(lst, tmp_path / "o", ConvertOptions(progress=False))
    assert not (tmp_path / "o").exists()


def test_a_line_of_a_path_alone_is_one_line_naming_the_row(listed: list[tuple[str, int]], tmp_path: Path) -> None:
    txt = tmp_path / "val.txt"
    txt.write_text(f"{listed[0][0]} 0\n{listed[1][0]}\n")
    proc = run_cli("convert", txt, tmp_path / "o", "--quiet")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "val.txt: row 2 has 1 column(s); expected 'path label'" in proc.stderr


@pytest.mark.parametrize(("labels", "classes"), [
    (["0", "--1", "1"], ["--1", "0", "1"]),  # was int()'s traceback: '-' stripped, then int('--1')
    (["0", "²", "1"], ["0", "1", "²"]),  # str.isdigit() takes '²': int('²') raised
])
def test_labels_that_are_not_all_class_indices_are_class_names(labels: list[str], classes: list[str],
                                                               listed: list[tuple[str, int]], tmp_path: Path) -> None:
    (tmp_path / "list.csv").write_text("".join(f"{p},{c}\n" for (p, _), c in zip(listed[:3], labels, strict=True)),
                                        encoding="utf-8")
    manifest = convert(tmp_path / "list.csv", tmp_path / "o", ConvertOptions(progress=False))
    assert list(manifest.classes) == classes


def test_a_negative_class_index_is_refused_naming_its_row(listed: list[tuple[str, int]], tmp_path: Path) -> None:
    (tmp_path / "list.csv").write_text(f"{listed[0][0]},0\n{listed[1][0]},-1\n")
    with pytest.raises(SourceError, match=r"list.csv: row 2's label is -1: labels are class indices from 0, or "
                                          r"class names"):
        convert(tmp_path / "list.csv", tmp_path / "o", ConvertOptions(progress=False))
    assert not (tmp_path / "o").exists()
