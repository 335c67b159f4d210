"""Nothing wrong trained on silently: bytes that differ from the manifest are caught on read, in every
format, on source shards and on staged copies alike."""

from __future__ import annotations

import gc
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import ddpipe
from ddpipe.dataset import OPEN_SHARDS
from ddpipe.errors import ChecksumMismatchError, CorruptShardError, DigestMismatchError
from ddpipe.formats import FORMAT_NAMES
from ddpipe.formats.tar_index import KnownIndexes
from ddpipe.reading import read_samples

from .conftest import run_cli
from .helpers import (
    adopted,
    flip_inside_sample,
    flip_middle_keeping_time,
    image_of,
    make_dataset,
    mapped_under,
    shard_file,
    tiny_samples,
)

EXPECTED = {s["__key__"]: s["bin"] for s in tiny_samples(48, 4, 4000)}


@pytest.fixture(params=FORMAT_NAMES)
def data(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return make_dataset(tmp_path / request.param, request.param, [12, 12, 12, 12], payload=4000)


def epoch(root: Path, **kw: object) -> dict[str, bytes]:
    loader = ddpipe.EncodedStream(root, 4, shuffle="local", **kw)  # type: ignore[arg-type]
    return {s["__key__"]: bytes(s["bin"]) for batch in loader for s in batch}


def test_a_shard_replaced_by_another_of_the_same_size_is_refused(data: Path) -> None:
    first, second = shard_file(data, 0), shard_file(data, 1)
    if first.stat().st_size != second.stat().st_size:
        pytest.skip("this format's shards of equal counts differ in size: the size check catches it")
    shutil.copyfile(second, first)
    for sidecar in ddpipe.get_format(ddpipe.load_manifest(data).format).sidecar_files(second):
        shutil.copyfile(sidecar, sidecar.with_name(sidecar.name.replace(second.stem, first.stem)))
    with pytest.raises(ChecksumMismatchError) as info:
        epoch(data)
    assert info.value.path == str(first)


def test_a_flipped_byte_with_its_time_kept_is_refused(data: Path) -> None:
    flip_middle_keeping_time(shard_file(data, 2))
    with pytest.raises(ChecksumMismatchError, match=shard_file(data, 2).name):
        epoch(data)


def test_every_shuffle_mode_checks(data: Path) -> None:
    flip_middle_keeping_time(shard_file(data, 3))
    for shuffle in ("none", "partial", "global"):
        with pytest.raises(ChecksumMismatchError):
            list(ddpipe.EncodedStream(data, 4, shuffle=shuffle))


def test_a_damaged_staged_copy_is_dropped_and_the_source_read(data: Path, tmp_path: Path,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    stage = tmp_path / "stage"
    assert epoch(data, stage_dir=stage) == EXPECTED  # staged
    copy = next(p for p in stage.rglob(shard_file(data, 1).name))
    flip_middle_keeping_time(copy)
    assert epoch(data, stage_dir=stage) == EXPECTED  # the right bytes, from the source
    assert "staged copy" in capfd.readouterr().err
    assert epoch(data, stage_dir=stage) == EXPECTED and "staged copy" not in capfd.readouterr().err  # re-staged


def swapped_offsets(index: str) -> str:
    """A tar index with the bin members of samples 1 and 2 at each other's offsets: the same size."""
    lines = index.splitlines()
    a, b = lines[2].split(), lines[3].split()
    ia, ib = a.index("bin") + 1, b.index("bin") + 1
    a[ia], b[ib] = b[ib], a[ia]
    lines[2], lines[3] = " ".join(a), " ".join(b)
    return "\n".join(lines) + "\n"


def test_a_tar_index_with_two_offsets_swapped_is_refused(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "wds", "wds", [12, 12], payload=4000)
    idx = shard_file(root, 0).with_suffix(".idx")
    good = idx.read_text()
    bad = swapped_offsets(good)
    assert len(bad) == len(good)  # the same size: only the content tells
    idx.write_text(bad)
    with pytest.raises(CorruptShardError, match="does not match the tar header"):
        epoch(root)
    idx.write_text(good)  # the source repaired; its staged copy's index damaged instead
    want = {k: v for k, v in EXPECTED.items() if int(k[2:]) < 24}
    stage = tmp_path / "stage"
    assert epoch(root, stage_dir=stage) == want
    next(stage.rglob(idx.name)).write_text(bad)
    assert epoch(root, stage_dir=stage) == want  # dropped, and the source read


def test_a_tar_index_changed_between_epochs_of_one_stream_is_refused_then_read_again_once_repaired(
        tmp_path: Path) -> None:
    """A stream checks each index against its tar once, and takes the index as it found it in later
    epochs: an index that changes in between, its size and time kept, is parsed and checked again."""
    root = make_dataset(tmp_path / "wds", "wds", [12, 12], payload=4000)
    idx = shard_file(root, 0).with_suffix(".idx")
    good = idx.read_text()
    stream = ddpipe.EncodedStream(root, 4, shuffle="local")

    def epoch_of(e: int) -> dict[str, bytes]:
        stream.set_epoch(e)
        return {s["__key__"]: bytes(s["bin"]) for batch in stream for s in batch}

    want = {k: v for k, v in EXPECTED.items() if int(k[2:]) < 24}
    assert epoch_of(0) == want
    before = idx.stat()
    idx.write_text(swapped_offsets(good))
    os.utime(idx, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(CorruptShardError, match="does not match the tar header"):
        epoch_of(1)
    idx.write_text(good)
    assert epoch_of(2) == want


@pytest.mark.parametrize("kept", [True, False], ids=["index kept", "index past the limit"])
def test_a_global_shuffle_reopens_a_tar_shard_through_its_index_as_the_epochs_first_open_checked_it(
        tmp_path: Path, kept: bool) -> None:
    """A random access checks each shard it reads whole and its index as the epoch first opens it,
    then reopens it trusting its bytes (OPEN_SHARDS are kept open): the index changed in between, two
    offsets swapped, is not read then where the one checked is kept, and is checked against the tar
    where it is not."""
    root = make_dataset(tmp_path / "wds", "wds", [3] * (OPEN_SHARDS + 2), payload=4000)
    want = {s["__key__"]: s["bin"] for s in tiny_samples(3 * (OPEN_SHARDS + 2), 4, 4000)}
    dataset = ddpipe.open_dataset(root)
    if not kept:
        dataset.format.indexes = KnownIndexes(limit=0)  # type: ignore[attr-defined]
    # shard 0 opened, closed as OPEN_SHARDS others open after it, then reopened; every shard read whole
    order = [0, *range(3, 3 * (OPEN_SHARDS + 2)), 1, 2]
    reads = read_samples(dataset, np.array(order), random_access=True)
    assert bytes(next(reads)["bin"]) == want["s/000000"]
    idx = shard_file(root, 0).with_suffix(".idx")
    before = idx.stat()
    idx.write_text(swapped_offsets(idx.read_text()))
    os.utime(idx, ns=(before.st_atime_ns, before.st_mtime_ns))
    if not kept:
        with pytest.raises(CorruptShardError, match="does not match the tar header"):
            list(reads)
        return
    assert [bytes(s["bin"]) for s in reads] == [want[f"s/{i:06d}"] for i in order[1:]]


def _truncated_in_place(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _replaced_by_a_damaged_copy(path: Path) -> None:
    copy = path.with_name("damaged")
    shutil.copyfile(path, copy)
    flip_middle_keeping_time(copy)
    os.replace(copy, path)  # another file at the path: the mapping kept of the first still reads it


@pytest.mark.parametrize("change", [flip_middle_keeping_time, _truncated_in_place, _replaced_by_a_damaged_copy],
                         ids=["flipped in place", "truncated in place", "replaced"])
@pytest.mark.parametrize("fmt", ["wds", "hdf5", "lmdb"])
@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_a_shard_changed_between_epochs_of_one_stream_is_refused_then_read_again_once_repaired(
        tmp_path: Path, shuffle: str, fmt: str, change: Callable[[Path], None]) -> None:
    """A stream keeps the mappings of the shards it hashed for its next epoch (KeptMappings),
    and hashes each through its mapping every epoch: a shard changed in place is seen changed, and
    one truncated (whose old mapping would fault past the file's end) or replaced is mapped again.
    A global shuffle's random access (each sample read on its own) keeps them as a scan does."""
    root = make_dataset(tmp_path / fmt, fmt, [12, 12, 12, 12], payload=4000)
    stream = ddpipe.EncodedStream(root, 4, shuffle=shuffle)

    def epoch_of(e: int) -> dict[str, bytes]:
        stream.set_epoch(e)
        return {s["__key__"]: bytes(s["bin"]) for batch in stream for s in batch}

    assert epoch_of(0) == EXPECTED
    assert len(stream.dataset.format.kept) == 4
    path = shard_file(root, 1)
    good = path.read_bytes()
    change(path)
    with pytest.raises(CorruptShardError, match=path.name):
        epoch_of(1)
    path.write_bytes(good)
    assert epoch_of(2) == EXPECTED


@pytest.mark.parametrize("keep", [True, False, "staged", "staged with a capacity", "unchecked"])
@pytest.mark.parametrize("fmt", ["wds", "hdf5", "lmdb"])
@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_an_epoch_leaves_its_shards_mapped_unless_told_not_to_or_evictable(
        tmp_path: Path, shuffle: str, fmt: str, keep: bool | str) -> None:
    """The next epoch hashes them through the same mappings; with keep_mapped=False an evicted page is
    read from the device again (a cold epoch). Staged copies are kept where they stay; a capacity may
    evict one, and a mapping would hold its space: never kept then. Nor is an unchecked read's: no
    check would vouch for what its next epoch reads through it. A global shuffle reads each sample on
    its own, and keeps what a scan keeps."""
    if shuffle == "global" and keep == "staged with a capacity":
        pytest.skip("a global shuffle stages a rank's whole share: refused with a capacity")
    root = make_dataset(tmp_path / fmt, fmt, [12, 12, 12, 12], payload=4000)
    stage = tmp_path / "stage"
    options: dict[str, object] = {"keep_mapped": keep} if isinstance(keep, bool) else \
        {"verify": False} if keep == "unchecked" else {"stage_dir": stage}
    if keep == "staged with a capacity":
        options["stage_capacity"] = sum(shard_file(root, k).stat().st_size for k in range(4))  # all fit
    stream = ddpipe.EncodedStream(root, 4, shuffle=shuffle, **options)  # type: ignore[arg-type]
    for epoch in range(2):  # the second reads the staged copies made in the first
        stream.set_epoch(epoch)
        assert sum(len(batch) for batch in stream) == 48
    gc.collect()
    copies = {str(next(stage.rglob(shard_file(root, k).name))) for k in range(4)} if keep == "staged" else set()
    want = {str(shard_file(root, k)) for k in range(4)} if keep is True else copies
    assert mapped_under(tmp_path) == want


def test_a_staged_stream_dropped_mid_epoch_lets_go_of_its_kept_mappings(tmp_path: Path) -> None:
    """Its stager, registered to stop a copy under way as the process ends, held it (and a descriptor a
    kept mapping) until then."""
    root = make_dataset(tmp_path / "wds", "wds", [12, 12, 12, 12], payload=4000)
    stream = ddpipe.EncodedStream(root, 4, shuffle="none", stage_dir=tmp_path / "stage")
    for epoch in range(2):
        stream.set_epoch(epoch)
        assert sum(len(batch) for batch in stream) == 48
    assert len(mapped_under(tmp_path / "stage")) == 4
    stream.set_epoch(2)
    batches = iter(stream)
    next(batches)
    del batches, stream
    gc.collect()
    assert mapped_under(tmp_path) == set()


@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_a_kept_staged_copy_found_damaged_is_let_go_as_it_is_removed(
        tmp_path: Path, shuffle: str, capfd: pytest.CaptureFixture[str]) -> None:
    """Removed to be staged again, it would otherwise stay mapped (and hold its space) until the next
    epoch looked its path up; found by a scan's check or by a random access's."""
    root = make_dataset(tmp_path / "wds", "wds", [12, 12, 12, 12], payload=4000)
    stage = tmp_path / "stage"
    stream = ddpipe.EncodedStream(root, 4, shuffle=shuffle, stage_dir=stage)

    def keys_of(epoch: int) -> list[str]:
        stream.set_epoch(epoch)
        return [s["__key__"] for batch in stream for s in batch]

    keys = [keys_of(0), keys_of(1)]  # the second reads the copies
    copy = next(stage.rglob(shard_file(root, 1).name))
    assert str(copy) in mapped_under(stage)
    flip_middle_keeping_time(copy)
    assert sorted(keys_of(2)) == sorted(keys[1]) == sorted(keys[0])  # the source's samples read instead
    assert copy.name in capfd.readouterr().err
    gc.collect()
    assert not [name for name in mapped_under(stage) if name.endswith("(deleted)")]


@pytest.mark.parametrize("shuffle", ["none", "local", "partial", "global"])
def test_under_skip_a_corrupt_shard_is_dropped_and_counted(data: Path, tmp_path: Path, shuffle: str,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    flip_middle_keeping_time(shard_file(data, 1))
    stage = {"stage_dir": tmp_path / "stage"} if shuffle != "global" else {}
    loader = ddpipe.EncodedStream(data, 4, shuffle=shuffle, on_error="skip", **stage)  # type: ignore[arg-type]
    got = [s["__key__"] for batch in loader for s in batch]
    assert sorted(got) == sorted(k for k in EXPECTED if not 12 <= int(k[2:]) < 24)  # the rest, each once
    assert loader.stats.corrupt_shards == [shard_file(data, 1).name]
    assert loader.stats.skipped == 12
    assert shard_file(data, 1).name in capfd.readouterr().err


def test_a_shard_damaged_where_its_format_opens_it_is_said_to_fail_its_checksum(data: Path) -> None:
    """Its library's refusal was the error (HDF5: "Unable to synchronously open file (actual len
    exceeds EOA)"), though the file was only one that changed since it was indexed."""
    path = shard_file(data, 1)
    head = bytearray(path.read_bytes())
    for i in range(64, 4096):
        head[i] ^= 0xFF
    path.write_bytes(bytes(head))
    with pytest.raises(ChecksumMismatchError, match=f"{path}: checksum mismatch"):
        epoch(data)


@pytest.mark.parametrize("staged", [False, True])
def test_under_skip_a_shard_of_another_size_is_dropped_and_counted(data: Path, tmp_path: Path, staged: bool) -> None:
    """A copy cut short (or grown) was refused as the stream was made, under skip too, though a shard
    failing its checksum is dropped: one damaged shard of thousands stopped a job that asked to go on."""
    with shard_file(data, 1).open("r+b") as f:
        f.truncate(f.seek(0, os.SEEK_END) // 2)
    with shard_file(data, 2).open("ab") as f:
        f.write(b"\0" * 512)
    stage = {"stage_dir": tmp_path / "stage"} if staged else {}
    with pytest.raises(CorruptShardError, match=r"truncated: index\.json says"):
        ddpipe.EncodedStream(data, 4, shuffle="local", **stage)  # type: ignore[arg-type]
    loader = ddpipe.EncodedStream(data, 4, shuffle="local", on_error="skip", **stage)  # type: ignore[arg-type]
    got = [s["__key__"] for batch in loader for s in batch]
    assert sorted(got) == sorted(k for k in EXPECTED if not 12 <= int(k[2:]) < 36)
    assert sorted(loader.stats.corrupt_shards) == [shard_file(data, 1).name, shard_file(data, 2).name]
    assert loader.stats.skipped == 24
    shard_file(data, 3).unlink()  # a missing one is no damage to skip: a wrong path or mount, refused
    with pytest.raises(ddpipe.MissingShardError):
        ddpipe.EncodedStream(data, 4, on_error="skip", **stage)  # type: ignore[arg-type]


def test_checking_can_be_turned_off(data: Path) -> None:
    flip_middle_keeping_time(shard_file(data, 0))
    assert len(epoch(data, verify=False)) == 48  # the user's choice: read as it is


# ddpipe's own shards: each sample's digest, recorded as they are written, checks a rank's share of them
SHARE = np.arange(0, 48, 4)  # 3 of each shard's 12 samples: a rank's share of a global shuffle on four


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_a_random_read_of_a_share_of_each_shard_checks_the_samples_it_reads_not_the_files(
        fmt: str, tmp_path: Path) -> None:
    """A rank of a global shuffle on many nodes reads a share of each shard: where the manifest records
    its samples' digests (ddpipe writes them), it checks each sample it reads against its digest and
    reads nothing else of the file. A read that wants most of a shard still hashes it whole, as does
    one whose node's ranks want most of it together (they share one page cache, which one read of the
    file in order fills), and any read of a manifest written before ddpipe recorded digests."""
    root = make_dataset(tmp_path / fmt, fmt, [12, 12, 12, 12], payload=4000)
    flip_inside_sample(shard_file(root, 1), EXPECTED["s/000017"])  # shard 1's sample 5, outside the share
    dataset = ddpipe.open_dataset(root)
    assert all(info.digests for info in dataset.manifest.shards)
    got = {s["__key__"]: bytes(s["bin"]) for s in read_samples(dataset, SHARE[::-1], random_access=True)}
    assert got == {f"s/{i:06d}": EXPECTED[f"s/{i:06d}"] for i in SHARE}
    with pytest.raises(DigestMismatchError, match="sample 5 \\('s/000017'\\)") as info:
        list(read_samples(dataset, np.array([0, 17, 40]), random_access=True))
    assert info.value.path == str(shard_file(root, 1))
    most_of_shard_1 = np.array([i for i in range(12, 24) if i != 17])
    with pytest.raises(ChecksumMismatchError):
        next(read_samples(dataset, most_of_shard_1, random_access=True))
    with pytest.raises(ChecksumMismatchError):  # four such shares on this node: all of each shard
        list(read_samples(dataset, SHARE, random_access=True, node_ranks=4))
    assert len(list(read_samples(dataset, SHARE, random_access=True, node_ranks=1))) == len(SHARE)
    manifest = root / "index.json"
    doc = json.loads(manifest.read_text())
    for shard in doc["shards"]:
        del shard["digests"]
    manifest.write_text(json.dumps(doc))
    with pytest.raises(ChecksumMismatchError):
        list(read_samples(ddpipe.open_dataset(root), SHARE, random_access=True))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_a_shard_cut_short_while_read_sample_by_sample_is_an_error_naming_it(fmt: str, tmp_path: Path) -> None:
    """A shard read sample by sample (a share of a global shuffle, or unchecked) is read with
    ``pread``, not through a mapping: one cut short in place while its reader is open is an error
    naming it, where a mapping's page past the new end would have killed the process (SIGBUS); and the
    reader leaves no descriptor open once closed."""
    root = make_dataset(tmp_path / fmt, fmt, [12, 12], payload=4000)
    dataset = ddpipe.open_dataset(root)
    path = shard_file(root, 1)
    gc.collect()
    fds = len(os.listdir("/proc/self/fd"))
    with dataset.open_shard(1) as reader:
        assert reader.parse(reader[0])["bin"] == EXPECTED["s/000012"]
        os.truncate(path, path.stat().st_size // 2)
        with pytest.raises(CorruptShardError, match="cut short") as info:
            reader[11]
        assert Path(str(info.value.path)) == path
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == fds


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_a_converted_dataset_records_the_digests_that_check_its_random_reads(
        fmt: str, raw_images: Path, tmp_path: Path) -> None:
    """``ddpipe convert`` (shards written by its jobs, not write_dataset) records them too."""
    total = sum(f.stat().st_size for f in raw_images.rglob("*.jpg"))
    ddpipe.convert(raw_images, tmp_path / "out", ddpipe.ConvertOptions(format=fmt, shard_bytes=total // 4,
                                                                       progress=False))
    root = tmp_path / "out"
    dataset = ddpipe.open_dataset(root)
    first = np.asarray(dataset.manifest.shard_starts())  # each shard's first sample: a share of each
    want = {s["__key__"]: bytes(s["jpg"]) for s in read_samples(dataset, first, random_access=True)}
    assert len(want) == len(dataset.manifest.shards) >= 4
    key, image = image_of(root, int(first[1]))
    flip_inside_sample(shard_file(root, 1), image)
    with pytest.raises(DigestMismatchError, match=f"sample 0 \\({key!r}\\)"):
        list(read_samples(ddpipe.open_dataset(root), first, random_access=True))


def test_adopted_tars_record_the_digests_that_check_a_random_read_of_a_share(tmp_path: Path) -> None:
    """WebDataset tars another tool wrote, adopted in place by ``ddpipe index``: their manifest records
    each sample's digest as a conversion's does."""
    root = make_dataset(tmp_path / "tars", "wds", [12, 12, 12, 12], payload=4000)
    for made in [root / "index.json", *root.glob("*.idx")]:
        made.unlink()
    proc = run_cli("index", root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    flip_inside_sample(shard_file(root, 1), EXPECTED["s/000017"])
    dataset = ddpipe.open_dataset(root)
    assert all(info.digests for info in dataset.manifest.shards)
    assert len(list(read_samples(dataset, SHARE, random_access=True))) == len(SHARE)
    with pytest.raises(DigestMismatchError, match="sample 5 \\('s/000017'\\)"):
        list(read_samples(dataset, np.array([0, 17, 40]), random_access=True))


# Adopted files: one shard each, which many ranks may each read a part of, checked sample by sample
ADOPTED = ["h5-vlen", "caffe-encoded"]


@pytest.mark.parametrize("name", ADOPTED)
def test_an_adopted_file_is_checked_by_what_each_rank_reads(name: str, tmp_path: Path) -> None:

    root = adopted(name, tmp_path)
    dataset = ddpipe.open_dataset(root)
    assert all(info.digests for info in dataset.manifest.shards)
    key, image = image_of(root, 7)
    flip_inside_sample(shard_file(root, 0), image)
    dataset = ddpipe.open_dataset(root)
    # a share that does not hold the changed sample reads (the whole file's checksum would refuse it)
    assert len(list(read_samples(dataset, np.arange(8, 14)))) == 6
    with pytest.raises(DigestMismatchError, match=f"sample 7 \\({key!r}\\)") as info:
        list(read_samples(dataset, np.arange(0, 14)))
    assert info.value.path == str(shard_file(root, 0))
    for shuffle in ("partial", "global"):
        with pytest.raises(DigestMismatchError, match="digest differs"):
            list(ddpipe.EncodedStream(root, 4, shuffle=shuffle))


@pytest.mark.parametrize("name", ADOPTED)
def test_under_skip_only_the_changed_sample_of_an_adopted_file_is_dropped(name: str, tmp_path: Path) -> None:
    root = adopted(name, tmp_path)
    keys = [s["__key__"] for s in ddpipe.open_dataset(root)]
    key, image = image_of(root, 7)
    flip_inside_sample(shard_file(root, 0), image)
    for shuffle in ("partial", "global"):
        loader = ddpipe.EncodedStream(root, 4, shuffle=shuffle, on_error="skip")
        got = [s["__key__"] for batch in loader for s in batch]
        assert sorted(got) == sorted(k for k in keys if k != key)
        assert loader.stats.skipped == 1 and loader.stats.corrupt_shards == [shard_file(root, 0).name]


@pytest.mark.parametrize("name", ADOPTED)
def test_a_changed_sample_in_a_staged_copy_of_an_adopted_file_is_read_from_the_source(
        name: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    root = adopted(name, tmp_path)
    want = {s["__key__"]: bytes(s["jpg"]) for s in ddpipe.open_dataset(root)}
    _, image = image_of(root, 7)
    for shuffle in ("partial", "global"):
        stage = tmp_path / f"stage-{shuffle}"

        def read() -> dict[str, bytes]:
            loader = ddpipe.EncodedStream(root, 4, shuffle=shuffle, stage_dir=stage)  # noqa: B023
            return {s["__key__"]: bytes(s["jpg"]) for batch in loader for s in batch}

        assert read() == want  # staged
        flip_inside_sample(next(stage.rglob(shard_file(root, 0).name)), image)
        assert read() == want  # the source's bytes
        assert "staged copy" in capfd.readouterr().err


def test_sample_digests_that_do_not_read_are_a_manifest_error(tmp_path: Path) -> None:
    root = adopted("h5-vlen", tmp_path)
    doc = json.loads((root / "index.json").read_text())
    doc["shards"][0]["digests"] = doc["shards"][0]["digests"][:-12]
    (root / "index.json").write_text(json.dumps(doc))
    proc = run_cli("inspect", root)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "sample digests" in proc.stderr and "index.json" in proc.stderr


def test_an_lmdb_file_damaged_between_unchecked_epochs_is_walked_again_not_read_through_its_old_environment(
        tmp_path: Path) -> None:
    """Unchecked, nothing tells the next epoch that a file changed, so no mapping is kept: an LMDB
    file's environment kept open would be read through the walk made before the damage (its root now
    past the file's end), where a new one is walked first and refused (lmdb_tree.py)."""
    import struct

    root = make_dataset(tmp_path / "lmdb", "lmdb", [12, 12, 12, 12], payload=4000)
    stream = ddpipe.EncodedStream(root, 4, shuffle="none", verify=False)
    assert sum(len(batch) for batch in stream) == 48
    path = shard_file(root, 1)
    with open(path, "r+b") as f:
        for meta in (0, 4096):  # both meta pages: the main tree's root page number (64-bit layout)
            f.seek(meta + 128)
            f.write(struct.pack("<Q", 1 << 40))
    stream.set_epoch(1)
    with pytest.raises(CorruptShardError, match=path.name):
        sum(len(batch) for batch in stream)
