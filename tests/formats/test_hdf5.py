from __future__ import annotations

from pathlib import Path

import h5py

from .conformance import FormatConformance, example_samples


class TestHDF5Conformance(FormatConformance):
    format_name = "hdf5"


def test_documented_layout_reads_with_plain_h5py(tmp_path: Path) -> None:
    items = example_samples()
    path = tmp_path / "s.h5"
    TestHDF5Conformance().write(path, items)
    with h5py.File(path, "r") as f:
        assert f.attrs["samples"] == len(items)
        g = f["fields/jpg"]
        o = g["offsets"]
        i = 11
        assert g["data"][o[i] : o[i + 1]].tobytes() == items[i]["jpg"]
        k = f["fields/__key__"]
        assert k["data"][k["offsets"][i] : k["offsets"][i + 1]].tobytes().decode() == items[i]["__key__"]
        assert not f["fields/jpg/data"].chunks  # contiguous: one read per block of samples


def test_samples_with_different_fields(tmp_path: Path) -> None:
    items = [{"__key__": "a", "jpg": b"1"}, {"__key__": "b", "png": b"22", "cls": b"0"}, {"__key__": "c", "jpg": b""}]
    path = tmp_path / "s.h5"
    TestHDF5Conformance().write(path, items)
    with TestHDF5Conformance().fmt.reader(path) as r:
        assert list(r) == items
