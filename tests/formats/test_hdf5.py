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


def test_adopted_hdf5_files_read_at_random_again_are_read_where_their_images_lie_without_h5py(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files of variable-length images another tool wrote, adopted in place, of which a rank reads a
    share every epoch, each image checked against its digest. What opening a file through h5py finds
    (its table of images, their labels) and where each image read lies is learnt of the file's version
    in the first epoch; later epochs read the images there, without h5py. A file written anew is
    learnt again; one changed in place at the same size and time is read at the old places, and the
    changed sample's digest says so; one cut short in place under its reader, before anything was
    learnt of it or after, is an error naming it (read with pread, not through a mapping: no SIGBUS)."""
    import numpy as np

    import ddpipe
    from ddpipe.errors import CorruptShardError
    from ddpipe.reading import read_samples

    from ..helpers import adopted, flip_inside_sample

    root = adopted("h5-vlen", tmp_path)  # two files of 15
    files = sorted(root.glob("*.h5"))
    dataset = ddpipe.open_dataset(root)
    share = np.array([20, 3, 16, 9, 29])
    opened = h5py_opens(monkeypatch)

    def epoch(verify: bool = True) -> tuple[list[tuple[str, bytes, bytes]], list[str]]:
        opened.clear()
        got = [(s["__key__"], bytes(s["jpg"]), bytes(s["cls"]))
               for s in read_samples(dataset, share, random_access=True, verify=verify)]
        return got, sorted(opened)

    first, opened_first = epoch()
    with ddpipe.open_dataset(root).open_shard(1) as reader:  # through h5py, as before anything was learnt
        assert [s for s in first if s[0].startswith("part1/")] == [
            (s["__key__"], bytes(s["jpg"]), bytes(s["cls"])) for s in (reader[5], reader[1], reader[14])]
    assert opened_first == [f.name for f in files]
    assert epoch() == epoch(verify=False) == (first, [])
    copy = tmp_path / "copy.h5"
    copy.write_bytes(files[0].read_bytes())
    os.replace(copy, files[0])  # the same bytes in another file
    assert epoch() == (first, [files[0].name])
    assert epoch() == (first, [])
    flip_inside_sample(files[1], first[0][1])  # sample 20 (file 1's sixth), its size and time kept
    with pytest.raises(ddpipe.DigestMismatchError, match="sample 5 \\('part1/00000005'\\)"):
        epoch()
    assert opened == []
    with dataset.open_shard(0) as reader:
        os.truncate(files[0], 1024)  # its metadata, before its images
        with pytest.raises(CorruptShardError, match="cut short") as info:
            reader[9]
        assert Path(str(info.value.path)) == files[0]
    assert opened == []
    fresh = adopted("h5-vlen", tmp_path / "fresh")
    with ddpipe.open_dataset(fresh).open_shard(1) as reader:  # nothing learnt of it: opened through h5py
        assert (reader[5]["__key__"], bytes(reader[5]["cls"])) == (first[0][0], first[0][2])
        path = fresh / files[1].name
        os.truncate(path, 4096)  # a page: its last images lie past it
        with pytest.raises(CorruptShardError, match="cut short") as info:
            reader[14]
        assert Path(str(info.value.path)) == path
