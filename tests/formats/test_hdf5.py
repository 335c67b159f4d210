from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py
import pytest

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


def h5py_opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files h5py opens from now on, as they are opened."""
    opened: list[str] = []
    real = h5py.File

    def counted(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(h5py, "File", counted)  # the module ddpipe.formats.hdf5 opens files through
    return opened


def test_a_checked_stream_opens_each_shard_through_h5py_once_and_a_changed_one_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its layout is kept by the shard's checksum (learnt.Learnt): a later epoch's shard whose bytes
    hash to it is opened without h5py; one that hashes to anything else is refused, and once repaired
    read again. An unchecked stream knows no checksum: it keeps a layout by the version of the file
    it was found in (its inode, size and time), and asks h5py again for a file written since."""
    import ddpipe

    from ..helpers import make_dataset

    opened = h5py_opens(monkeypatch)
    root = make_dataset(tmp_path / "ds", "hdf5", [8, 8, 8], payload=1000)
    names = sorted(p.name for p in root.glob("*.h5"))

    def epoch(stream: ddpipe.EncodedStream, e: int) -> list[str]:
        opened.clear()
        stream.set_epoch(e)
        assert sum(len(batch) for batch in stream) == 24
        return sorted(opened)

    checked = ddpipe.EncodedStream(root, 4, shuffle="local")
    assert epoch(checked, 0) == names
    assert epoch(checked, 1) == []
    shard = root / names[1]
    good = shard.read_bytes()
    shard.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(ddpipe.ChecksumMismatchError, match=names[1]):
        epoch(checked, 2)
    shard.write_bytes(good)
    assert epoch(checked, 3) == []
    unchecked = ddpipe.EncodedStream(root, 4, shuffle="local", verify=False)
    assert (epoch(unchecked, 0), epoch(unchecked, 1)) == (names, [])
    written = shard.stat()
    shard.write_bytes(good)  # written again: another version, whatever the clock's grain
    os.utime(shard, ns=(written.st_atime_ns, written.st_mtime_ns + 1_000_000))
    assert epoch(unchecked, 2) == [names[1]]


@pytest.mark.parametrize("verify", [True, False])
def test_a_global_shuffle_opens_each_shard_through_h5py_once_however_often_it_reopens_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verify: bool) -> None:
    """Random access keeps a few shards open (OPEN_SHARDS) and reopens the others as their samples come.
    A reopen trusts the bytes its epoch's first open checked, as it trusts the samples it reads, and
    opens the shard from the layout learnt then, not through h5py (docs/benchmarks.md,
    feed-global-reopen); a later epoch's first open hashes the shard before opening it, as a scan's
    hash ahead does, and finds its layout by that checksum. Unchecked, no bytes are known: the layout
    is kept by the version of the file it was found in, and found by it in a later epoch."""
    import ddpipe
    from ddpipe.dataset import OPEN_SHARDS

    from ..helpers import make_dataset

    opened = h5py_opens(monkeypatch)
    root = make_dataset(tmp_path / "ds", "hdf5", [3] * (OPEN_SHARDS + 4), payload=200)
    names = sorted(p.name for p in root.glob("*.h5"))
    stream = ddpipe.EncodedStream(root, 4, shuffle="global", verify=verify)

    def epoch(e: int) -> list[str]:
        opened.clear()
        stream.set_epoch(e)
        assert sum(len(batch) for batch in stream) == 3 * len(names)
        return sorted(opened)

    assert (epoch(0), epoch(1)) == (names, [])
