"""Datasets in a bucket (moto's S3 server) and behind an HTTP server: the same samples as from local
files, in every format, on several ranks, staged, resumed, and faults that lose nothing."""

from __future__ import annotations

import gc
import itertools
import shutil
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ddpipe
from ddpipe.errors import ChecksumMismatchError, CorruptShardError, MissingShardError
from ddpipe.staging import StageOptions
from ddpipe.storage import StorageError, open_storage

from ..conftest import mpiexec, run_cli
from ..helpers import mapped_under
from .bucket_data import FAST_FAIL, WORKER, samples, upload_dir
from .servers import RangeServer


@pytest.mark.parametrize("fmt", ["wds", "hdf5", "lmdb"])
def test_a_dataset_converted_into_a_bucket_reads_as_the_local_one(raw_images: Path, local_sets: dict[str, Path],
                                                                  bucket: str, fmt: str) -> None:
    url = f"s3://{bucket}/sets/{fmt}"
    manifest = ddpipe.convert(raw_images, url, ddpipe.ConvertOptions(format=fmt, samples_per_shard=5, progress=False))
    assert manifest == ddpipe.open_dataset(local_sets[fmt]).manifest  # the same shards, byte for byte
    remote = samples(ddpipe.EncodedStream(url, 4, shuffle="none"))
    assert remote == samples(ddpipe.EncodedStream(local_sets[fmt], 4, shuffle="none"))
    assert len(remote) == 24
    verified = run_cli("verify", url)
    assert verified.returncode == 0 and f"{url}: OK" in verified.stdout


def test_a_dataset_behind_an_http_server_reads_as_the_local_one(local_sets: dict[str, Path],
                                                                 http_root: RangeServer) -> None:
    for fmt in ("wds", "hdf5"):
        shutil.copytree(local_sets[fmt], http_root.root / fmt)
        url = f"{http_root.url}/{fmt}"
        assert samples(ddpipe.EncodedStream(url, 4, shuffle="local")) == \
            samples(ddpipe.EncodedStream(local_sets[fmt], 4, shuffle="local"))


@pytest.mark.parametrize("fmt", ["wds", "hdf5", "lmdb"])
def test_a_dataset_behind_a_server_without_ranges_reads_as_the_local_one(fmt: str, local_sets: dict[str, Path],
                                                                         http_root: RangeServer,
                                                                         tmp_path: Path) -> None:
    """``python -m http.server`` answers a ranged GET with the whole file: every read failed with
    "Range request not supported"; the objects are now read whole, one request each."""
    shutil.copytree(local_sets[fmt], http_root.root / fmt)
    http_root.ranges = False
    url = f"{http_root.url}/{fmt}"
    assert samples(ddpipe.EncodedStream(url, 4, shuffle="none")) == \
        samples(ddpipe.EncodedStream(local_sets[fmt], 4, shuffle="none"))
    stage = StageOptions(stage_dir=tmp_path / "stage")
    assert samples(ddpipe.EncodedStream(url, 4, shuffle="local", stage=stage)) == \
        samples(ddpipe.EncodedStream(local_sets[fmt], 4, shuffle="local"))
    verified = run_cli("verify", url, "--decode", "--quiet")
    assert verified.returncode == 0 and f"{url}: OK: 5 shards, 24 samples checked, 24 images decoded" in \
        verified.stdout, verified.stderr


def test_an_object_of_another_size_behind_a_server_without_ranges_is_named(local_sets: dict[str, Path],
                                                                          http_root: RangeServer) -> None:
    shutil.copytree(local_sets["wds"], http_root.root / "wds")
    http_root.ranges = False
    url = f"{http_root.url}/wds"
    shard = ddpipe.open_dataset(url).manifest.shards[1]
    path = http_root.root / "wds" / shard.file
    whole = path.read_bytes()
    path.write_bytes(whole[:1000])
    with pytest.raises(StorageError, match=f"{url}/{shard.file}: the object holds 1,000 bytes, not the "
                                           f"{shard.bytes:,} expected"):
        samples(ddpipe.EncodedStream(url, 4, shuffle="none"))
    path.write_bytes(whole + whole)
    verified = run_cli("verify", url, "--quiet")  # named by its URL (its "//" was lost to a Path)
    assert verified.returncode == 1
    assert f"ddpipe: {url}/{shard.file}: the object holds more than the {shard.bytes:,} bytes expected" in \
        verified.stderr, verified.stderr


def test_a_web_server_is_read_only_and_one_that_lists_nothing_is_said_so(local_sets: dict[str, Path],
                                                                        http_root: RangeServer, tmp_path: Path) -> None:
    """A conversion into a web server failed after the shards were written, in obstore's words and
    the server's HTML; so did indexing one, and ``index --out`` where the server lists nothing."""
    shutil.copytree(local_sets["wds"], http_root.root / "wds")
    (http_root.root / "wds" / "index.json").unlink()
    url = f"{http_root.url}/wds"
    into = run_cli("convert", local_sets["wds"], f"{http_root.url}/new", "--quiet")
    assert into.returncode == 1 and into.stderr == f"ddpipe: error: {http_root.url}/new: a web server is read-only " \
        "to ddpipe: convert into a directory or an s3:// prefix\n", into.stderr
    beside = run_cli("index", url)
    assert beside.returncode == 1 and beside.stderr == f"ddpipe: error: {url}: a web server is read-only to ddpipe, " \
        "so index.json cannot go beside its files: give --out DIR for it (the manifest there names their URL)\n"
    unlisted = run_cli("index", url, "--out", tmp_path / "m")  # http.server answers PROPFIND 501
    assert unlisted.returncode == 1 and unlisted.stderr.count("\n") == 1 and \
        f"{http_root.url} does not list its files (it answers no WebDAV PROPFIND)" in unlisted.stderr
    assert not (http_root.root / "new").exists() and not (tmp_path / "m").exists()


def test_a_dataset_converted_from_a_bucket_into_a_bucket(local_sets: dict[str, Path], bucket: str) -> None:
    upload_dir(local_sets["wds"], f"s3://{bucket}/wds")
    done = run_cli("convert", f"s3://{bucket}/wds", f"s3://{bucket}/as-lmdb", "--format", "lmdb")
    assert done.returncode == 0, done.stderr
    assert samples(ddpipe.EncodedStream(f"s3://{bucket}/as-lmdb", 4, shuffle="none")) == \
        samples(ddpipe.EncodedStream(local_sets["wds"], 4, shuffle="none"))


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_shuffling_partially_from_a_bucket_get_every_sample_once(raw_images: Path, bucket: str,
                                                                       tmp_path: Path, ranks: int) -> None:
    """The README's way: ddpipe convert into the bucket, then a script under mpiexec."""
    url = f"s3://{bucket}/ds"
    converted = run_cli("convert", raw_images, url, "--format", "wds", "--samples-per-shard", "5")
    assert converted.returncode == 0, converted.stderr
    proc = mpiexec(ranks, WORKER, url, tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr
    keys = [k for r in range(ranks) for k in (tmp_path / f"rank-{r}.txt").read_text().split()]
    assert sorted(keys) == sorted(samples(ddpipe.EncodedStream(url, 4, shuffle="none")))
    assert len(keys) == 24


def test_staging_from_a_server_copies_each_shard_once_and_later_epochs_read_locally(
        local_sets: dict[str, Path], http_root: RangeServer, tmp_path: Path) -> None:
    shutil.copytree(local_sets["wds"], http_root.root / "wds")
    loader = ddpipe.EncodedStream(f"{http_root.url}/wds", 4, shuffle="local", stage_dir=tmp_path / "stage")
    first = samples(loader)
    assert first == samples(ddpipe.EncodedStream(local_sets["wds"], 4, shuffle="local"))
    assert loader.stager is not None and loader.stager.stats["copied"] == len(loader.dataset.manifest.shards)
    requests = http_root.requests
    loader.set_epoch(1)
    assert samples(loader) == first
    assert http_root.requests == requests  # the second epoch read the node's copies only
    gc.collect()
    copies = {str(p) for p in (tmp_path / "stage").rglob("*.tar")}
    assert len(copies) == len(loader.dataset.manifest.shards)
    assert mapped_under(tmp_path) == copies  # hashed ahead as a local dataset's are, and kept for the next epoch


def test_resuming_from_a_bucket_yields_exactly_the_rest(local_sets: dict[str, Path], bucket: str) -> None:
    url = f"s3://{bucket}/wds"
    upload_dir(local_sets["wds"], url)
    loader = ddpipe.EncodedStream(url, 4, shuffle="local", seed=3)
    it = iter(loader)
    seen = [s["__key__"] for _ in range(2) for s in next(it)]
    state = loader.state_dict()
    resumed = ddpipe.EncodedStream(url, 4, shuffle="local")
    resumed.load_state_dict(state)
    rest = [s["__key__"] for batch in resumed for s in batch]
    assert sorted(seen + rest) == sorted(samples(ddpipe.EncodedStream(local_sets["wds"], 4)))


def test_a_bucket_read_in_a_process_of_its_own(local_sets: dict[str, Path], bucket: str) -> None:
    """read_in="process": the reading process fetches the shards with a client and a scratch directory
    of its own; the batches are the local files' read by threads, and its scratch goes with it."""
    pytest.importorskip("nvidia.dali")
    import gc
    import tempfile

    import torch

    url = f"s3://{bucket}/wds"
    upload_dir(local_sets["wds"], url)

    def scratch() -> set[Path]:
        return set(Path(tempfile.gettempdir()).glob("ddpipe-objects-*"))

    def batches(where: str | Path, read_in: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        with ddpipe.Loader(where, 4, decoder="dali-cpu", device="cpu", shuffle="local", read_in=read_in, size=16,
                           resize_shorter=16, dtype="uint8", threads=1) as loader:
            return [(x.clone(), y.clone()) for x, y in loader]

    before = scratch()
    got, want = batches(url, "process"), batches(local_sets["wds"], "thread")
    assert len(got) == len(want) == 6
    assert all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(got, want, strict=True))
    gc.collect()  # the parent's dataset, in a reference cycle, takes its own scratch directory with it
    # none left of its own (an earlier test's, collected by the same gc.collect(), may go too)
    assert scratch() - before == set()


def _overwrite(url: str, name: str, change: Any) -> None:
    objects = open_storage(url)
    objects.put_bytes(name, change(objects.get(name)))


def test_an_object_changed_after_indexing_is_named_or_skipped(local_sets: dict[str, Path], bucket: str) -> None:
    url = f"s3://{bucket}/wds"
    upload_dir(local_sets["wds"], url)
    name = ddpipe.open_dataset(url).manifest.shards[1].file

    def flip(data: bytes) -> bytes:  # same size, other bytes: only the checksum tells
        middle = len(data) // 2
        return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]

    _overwrite(url, name, flip)
    with pytest.raises(ChecksumMismatchError, match=f"s3://{bucket}/wds/{name}"):
        samples(ddpipe.EncodedStream(url, 4, shuffle="none"))
    skipping = ddpipe.EncodedStream(url, 4, shuffle="none", on_error="skip")
    kept = samples(skipping)
    assert len(kept) == 24 - 5 and skipping.stats.skipped == 5 and skipping.stats.corrupt_shards == [name]
    _overwrite(url, name, lambda data: data + b"\0" * 512)  # another size: found at open
    with pytest.raises(CorruptShardError, match=f"s3://{bucket}/wds/{name}: index.json says"):
        ddpipe.open_dataset(url)


def test_an_object_changed_mid_epoch_is_refused_when_a_random_access_fetches_it_again(
        http_root: RangeServer) -> None:
    """A global shuffle keeps a few shards open, and an object's scratch copy goes once a few more are
    fetched: a reopen fetches the object again, and was read unchecked (checked once an epoch, as a
    local file is), so bytes changed since its first read came out as samples."""
    from ddpipe.dataset import OPEN_SHARDS
    from ddpipe.reading import read_samples

    from ..helpers import flip_middle_keeping_time, make_dataset

    shards = OPEN_SHARDS + 6  # more than the cache keeps (OPEN_SHARDS + 2)
    root = make_dataset(http_root.root / "wds", "wds", [2] * shards, payload=2000)
    url = f"{http_root.url}/wds"
    dataset = ddpipe.open_dataset(url)
    first = [2 * k for k in range(shards)]  # each shard's first sample, shard 0's first
    read = read_samples(dataset, np.array([*first, 1]), random_access=True)  # then shard 0's second
    assert [s["__key__"] for s in itertools.islice(read, shards)] == [f"s/{k:06d}" for k in first]
    name = dataset.manifest.shards[0].file
    flip_middle_keeping_time(root / name)  # the second sample's bytes: same size, same time
    with pytest.raises(ChecksumMismatchError, match=f"{url}/{name}"):
        next(read)


def test_verify_names_the_object_not_its_scratch_copy(local_sets: dict[str, Path], bucket: str) -> None:
    """A damaged DALI index in a bucket was reported by the path of its copy in this process's
    scratch directory, a file gone when the command ended."""
    url = f"s3://{bucket}/wds"
    upload_dir(local_sets["wds"], url)
    name = ddpipe.open_dataset(url).manifest.shards[1].file.replace(".tar", ".idx")
    _overwrite(url, name, lambda data: b"not an index\n")
    verified = run_cli("verify", url, "--quiet")
    assert verified.returncode == 1
    assert f"ddpipe: {url}/{name}: bad DALI index: its first line is" in verified.stderr, verified.stderr


def test_transient_failures_are_retried(local_sets: dict[str, Path], http_root: RangeServer) -> None:
    shutil.copytree(local_sets["hdf5"], http_root.root / "hdf5")
    http_root.fail_next = 4  # 503 Slow Down, four times
    got = samples(ddpipe.EncodedStream(f"{http_root.url}/hdf5", 4, shuffle="none"))
    assert http_root.failed == 4
    assert got == samples(ddpipe.EncodedStream(local_sets["hdf5"], 4, shuffle="none"))


def test_a_server_that_stays_down_fails_naming_the_object(local_sets: dict[str, Path],
                                                          http_root: RangeServer) -> None:
    shutil.copytree(local_sets["wds"], http_root.root / "wds")
    dataset = ddpipe.open_dataset(f"{http_root.url}/wds", FAST_FAIL)
    http_root.fail_next = 10_000  # down for good (503 Slow Down to every retry)
    with pytest.raises(StorageError, match=rf"{http_root.url}/wds/shard-000000\.(tar|idx): request to .*503"):
        samples(ddpipe.EncodedStream(dataset, 2, shuffle="none"))
    assert http_root.failed >= 2  # retried before giving up


def test_a_server_stopped_mid_epoch_fails_naming_the_object(local_sets: dict[str, Path],
                                                            http_root: RangeServer) -> None:
    shutil.copytree(local_sets["wds"], http_root.root / "wds")
    # reading at most a few samples (and the next shard) ahead of the batches: shards are left to fetch
    loader = ddpipe.EncodedStream(ddpipe.open_dataset(f"{http_root.url}/wds", FAST_FAIL), 2, shuffle="none",
                           prefetch=2)
    it = iter(loader)
    next(it)
    http_root.stop()
    with pytest.raises(StorageError, match=rf"{http_root.url}/wds/shard-"):
        for _ in it:
            pass


def test_what_is_missing_is_one_line_naming_it(local_sets: dict[str, Path], bucket: str) -> None:
    url = f"s3://{bucket}/wds"
    nothing = run_cli("inspect", f"s3://no-such-bucket-{bucket}/wds")
    assert nothing.returncode != 0 and "Traceback" not in nothing.stderr
    assert nothing.stderr.strip().count("\n") == 0 and f"no-such-bucket-{bucket}" in nothing.stderr
    no_manifest = run_cli("inspect", url)
    assert no_manifest.returncode != 0 and f"{url}/index.json: no index.json" in no_manifest.stderr
    upload_dir(local_sets["wds"], url)
    the_file = run_cli("inspect", f"{url}/index.json")  # was ".../index.json/index.json: no index.json"
    assert the_file.returncode == 1 and the_file.stderr == \
        f"ddpipe: error: {url}/index.json: names the index.json itself: a dataset is the prefix holding it ({url})\n"
    name = ddpipe.open_dataset(url).manifest.shards[2].file
    import boto3  # type: ignore[import-untyped]

    boto3.client("s3").delete_object(Bucket=bucket, Key=f"wds/{name}")
    with pytest.raises(MissingShardError, match=f"{url}/{name}: object listed in index.json is missing"):
        ddpipe.open_dataset(url)
    bench = run_cli("bench", url, "--epochs", "1", "--no-progress")
    assert bench.returncode != 0 and "Traceback" not in bench.stderr and f"{url}/{name}" in bench.stderr


def test_refused_credentials_are_one_line(http_root: RangeServer, tmp_path: Path) -> None:
    http_root.refuse = True
    refused = run_cli("inspect", f"{http_root.url}/wds")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "access refused" in refused.stderr and f"{http_root.url}/wds/index.json" in refused.stderr


def test_an_endpoint_that_refuses_connections_is_one_line_saying_so() -> None:
    with socket.socket() as s:  # a port nothing listens on: bound, then let go
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/ds"
    with pytest.raises(StorageError) as raised:
        ddpipe.open_dataset(url, FAST_FAIL)
    message = str(raised.value)
    assert f"{url}/index.json" in message and "Connection refused" in message, message
    assert "\n" not in message and "Debug source" not in message, message
    proc = run_cli("inspect", url, timeout=120)  # a hang bound: the default retries take seconds
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Connection refused" in proc.stderr, proc.stderr
