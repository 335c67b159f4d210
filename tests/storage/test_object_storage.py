"""Datasets in a bucket (moto's S3 server) and behind an HTTP server: the same samples as from local
files, in every format, on several ranks, staged, resumed, and faults that lose nothing."""

from __future__ import annotations

import functools
import shutil
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ddpipe
from ddpipe.errors import ChecksumMismatchError, CorruptShardError, DdpipeError, MissingShardError
from ddpipe.reading import read_samples
from ddpipe.staging import StageOptions
from ddpipe.storage import ObjectCache, StorageError, StorageOptions, open_storage

from ..conftest import mpiexec, run_cli
from .servers import RangeServer

WORKER = Path(__file__).with_name("bucket_worker.py")
FAST_FAIL = StorageOptions(max_retries=1, retry_seconds=2, timeout_seconds=3)


def samples(loader: Iterable[Any]) -> dict[str, tuple[bytes, bytes]]:
    return {s["__key__"]: (bytes(s["jpg"]), bytes(s["cls"])) for batch in loader for s in batch}


def files_here_at_each_download(monkeypatch: pytest.MonkeyPatch, pattern: str) -> list[int]:
    """How many files matching ``pattern`` the download's directory holds once each download is in:
    the list fills as the code under test fetches."""
    from ddpipe.storage.objects import ObjectStorage

    counts: list[int] = []
    fetch = ObjectStorage.download

    def download(self: ObjectStorage, name: str, dest: Path, size: int | None = None) -> int:
        got = fetch(self, name, dest, size)
        counts.append(len(list(dest.parent.glob(pattern))))
        return got

    monkeypatch.setattr(ObjectStorage, "download", download)
    return counts


def upload_dir(local: Path, url: str) -> None:
    objects = open_storage(url)
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        objects.put_file(str(path.relative_to(local)), path)


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
    assert scratch() == before


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


@pytest.mark.parametrize("workers", [1, 2])
def test_a_conversion_into_a_bucket_sends_each_shard_as_it_is_written(raw_images: Path, bucket: str, workers: int,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shard was written to this node's disk before the first was sent: ImageNet's 140 GB of
    shards on a node's temporary directory, and no upload while the images were read. Now each shard
    is sent as it is finished and removed here, so a few are here at most: those the workers are
    writing, and those finished and waiting to be sent."""
    from ddpipe.convert.to_objects import work_dir
    from ddpipe.storage.objects import ObjectStorage

    url = f"s3://{bucket}/ds"
    work = work_dir(open_storage(url))
    here: list[int] = []
    put = ObjectStorage.put_file

    def counted(self: ObjectStorage, name: str, path: Path) -> str | None:
        here.append(len([p for p in work.glob("*.tar")]))
        return put(self, name, path)

    monkeypatch.setattr(ObjectStorage, "put_file", counted)
    options = ddpipe.ConvertOptions(format="wds", samples_per_shard=2, workers=workers, progress=False)
    manifest = ddpipe.convert(raw_images, url, options)
    assert len(manifest.shards) == 12 and len(here) == 24  # each shard and its .idx
    assert max(here) <= 2 * workers + 2, here  # at most the workers' window, the one being sent and the next
    assert not work.exists()
    assert len(samples(ddpipe.EncodedStream(url, 4))) == 24


@pytest.mark.mpi
def test_a_conversion_into_a_bucket_by_mpi_ranks_gives_what_one_process_gives(raw_images: Path, bucket: str) -> None:
    """Each rank sends the shards it writes, as it finishes them; rank 0 the manifest, last."""
    one, two = f"s3://{bucket}/one", f"s3://{bucket}/two"
    ddpipe.convert(raw_images, one, ddpipe.ConvertOptions(format="wds", samples_per_shard=5, progress=False))
    proc = mpiexec(2, "-m", "ddpipe", "convert", raw_images, two, "--samples-per-shard", "5", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = open_storage(one), open_storage(two)
    assert first.list() == second.list()
    assert all(first.get(name) == second.get(name) for name in first.list())


@pytest.mark.mpi
def test_a_manifest_upload_that_fails_on_rank_0_ends_every_rank(raw_images: Path, bucket: str) -> None:
    """Rank 0 sends ``index.json`` once every rank has sent its shards; when that fails (a lost
    connection, a full quota), the other ranks, past that point, must learn of it rather than wait
    for rank 0 in a collective it never enters. Then the same command, run again, finishes the job."""
    url = f"s3://{bucket}/ds"
    proc = mpiexec(2, Path(__file__).with_name("convert_worker.py"), raw_images, url, timeout=240)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "connection lost" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "index.json" not in open_storage(url).list()
    proc = mpiexec(2, "-m", "ddpipe", "convert", raw_images, url, "--samples-per-shard", "5", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(samples(ddpipe.EncodedStream(url, 4))) == 24


def test_no_manifest_is_sent_while_a_shard_it_names_is_not_in_the_bucket(raw_images: Path, bucket: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The upload's last step sends ``index.json``; a rerun after it failed sends only that. A shard
    gone from the bucket meanwhile (a lifecycle rule, a user's clean-up) would leave a manifest naming
    an object that is not there: the rerun names the shard instead, and sends nothing."""
    import boto3

    from ddpipe.storage.objects import ObjectStorage

    url = f"s3://{bucket}/ds"
    real_put = ObjectStorage.put_bytes

    def lost(self: ObjectStorage, name: str, data: bytes) -> None:
        raise StorageError("connection lost", path=self.url(name))

    options = ddpipe.ConvertOptions(format="wds", samples_per_shard=5, progress=False)
    monkeypatch.setattr(ObjectStorage, "put_bytes", lost)
    with pytest.raises(StorageError, match="connection lost"):
        ddpipe.convert(raw_images, url, options)
    monkeypatch.setattr(ObjectStorage, "put_bytes", real_put)
    boto3.client("s3").delete_object(Bucket=bucket, Key="ds/shard-000002.tar")
    with pytest.raises(DdpipeError, match=r"ds/shard-000002\.tar: missing: index\.json not sent.* "
                                          r"remove .*ddpipe-convert-\w+ on every node"):
        ddpipe.convert(raw_images, url, options)
    assert "index.json" not in open_storage(url).list()
    from ddpipe.convert.to_objects import work_dir

    work = work_dir(open_storage(url))
    assert (work / "index.json").exists()  # kept for the rerun the error asks for: removed here, as the user would
    shutil.rmtree(work)  # (left, one a run of this test stayed in the temporary directory)


def test_shards_left_in_a_shared_work_directory_are_sent_once(raw_images: Path, bucket: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks of a node share its work directory: each sent every shard left there, as many times as
    the node has ranks. Now the first to claim a shard sends it."""
    from ddpipe.convert.to_objects import send_leftovers
    from ddpipe.storage.objects import ObjectStorage

    work = tmp_path / "work"
    manifest = ddpipe.convert(raw_images, work, ddpipe.ConvertOptions(format="wds", samples_per_shard=3,
                                                                        progress=False))
    sent: list[str] = []
    real_put = ObjectStorage.put_file

    def counted(self: ObjectStorage, name: str, path: Path) -> str | None:
        sent.append(name)
        return real_put(self, name, path)

    monkeypatch.setattr(ObjectStorage, "put_file", counted)
    objects = open_storage(f"s3://{bucket}/ds")
    with ThreadPoolExecutor(4) as ranks:
        for done in [ranks.submit(send_leftovers, objects, work, manifest, "run-1") for _ in range(4)]:
            done.result()
    shards = [info.file for info in manifest.shards]
    assert sorted(sent) == sorted([*shards, *(name.replace(".tar", ".idx") for name in shards)])


def test_a_stopped_upload_shows_no_dataset_and_resumes(raw_images: Path, bucket: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpipe.storage.objects import ObjectStorage

    url = f"s3://{bucket}/ds"
    sent: list[str] = []
    real_put = ObjectStorage.put_file

    def put_then_fail(self: ObjectStorage, name: str, path: Path) -> str | None:
        if len(sent) == 3:
            raise StorageError("connection lost", path=self.url(name))
        sent.append(name)
        return real_put(self, name, path)

    monkeypatch.setattr(ObjectStorage, "put_file", put_then_fail)
    options = ddpipe.ConvertOptions(format="wds", samples_per_shard=5, progress=False)
    with pytest.raises(StorageError, match="connection lost"):
        ddpipe.convert(raw_images, url, options)
    with pytest.raises(DdpipeError, match=r"no index\.json"):  # nothing half-made looks like a dataset
        ddpipe.open_dataset(url)
    first = list(sent)
    resent: list[str] = []

    def put(self: ObjectStorage, name: str, path: Path) -> str | None:
        resent.append(name)
        return real_put(self, name, path)

    monkeypatch.setattr(ObjectStorage, "put_file", put)
    ddpipe.convert(raw_images, url, options)
    # a shard sent whole (its .idx goes first, then the tar) is not sent again; one half sent is, whole
    whole = {name for tar in first if tar.endswith(".tar") for name in (tar, tar.replace(".tar", ".idx"))}
    assert whole and set(first) - whole, first
    assert not whole & set(resent) and set(first) - whole <= set(resent), resent
    assert len(samples(ddpipe.EncodedStream(url, 4))) == 24


def test_objects_of_another_input_left_in_the_bucket_are_replaced_even_at_the_same_size(
        raw_images: Path, raw_copy: Path, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conversion stopped part-way leaves shards in the bucket; the user changes the input, removes the
    work directory (as the conflict error says) and converts again. Each new shard as long as the one
    left there (tar shards are counted in 512-byte blocks) was taken as sent: the dataset then held the
    old input's bytes under a manifest of the new. A shard counts as sent only as this work directory
    sent it, by the tag the bucket gave that upload."""
    import shutil

    from ddpipe.convert.to_objects import work_dir
    from ddpipe.storage.objects import ObjectStorage

    url = f"s3://{bucket}/ds"
    real_put = ObjectStorage.put_file
    sent: list[str] = []

    def put_then_fail(self: ObjectStorage, name: str, path: Path) -> str | None:
        if len(sent) == 6:
            raise StorageError("connection lost", path=self.url(name))
        sent.append(name)
        return real_put(self, name, path)

    options = ddpipe.ConvertOptions(format="wds", samples_per_shard=5, progress=False)
    with monkeypatch.context() as patch:
        patch.setattr(ObjectStorage, "put_file", put_then_fail)
        with pytest.raises(StorageError, match="connection lost"):
            ddpipe.convert(raw_images, url, options)
    shutil.rmtree(work_dir(open_storage(url)))
    for image in raw_copy.rglob("*.jpg"):  # the same length, other bytes: the JFIF header's density
        data = bytearray(image.read_bytes())
        assert data[6:11] == b"JFIF\0", image
        data[15] ^= 0x03
        image.write_bytes(bytes(data))
    ddpipe.convert(raw_copy, url, options)
    images = {key: data for key, (data, _) in samples(ddpipe.EncodedStream(url, 4)).items()}
    assert images == {str(p.relative_to(raw_copy).with_suffix("")): p.read_bytes() for p in raw_copy.rglob("*.jpg")}


def test_tars_in_a_bucket_are_adopted_in_place(local_sets: dict[str, Path], bucket: str, tmp_path: Path) -> None:
    url = f"s3://{bucket}/tars"
    objects = open_storage(url)
    for tar in sorted(local_sets["wds"].glob("*.tar")):
        objects.put_file(tar.name, tar)
    expected = samples(ddpipe.EncodedStream(local_sets["wds"], 4, shuffle="none"))
    (tmp_path / "a-file").write_text("")
    listed = objects.list()
    unmade = run_cli("index", url, "--out", tmp_path / "a-file" / "m")  # said before any object was fetched
    assert unmade.returncode == 1
    assert unmade.stderr == f"ddpipe: error: {tmp_path}/a-file/m: --out cannot be made: {tmp_path}/a-file " \
                            "is not a directory\n"
    assert objects.list() == listed
    kept = run_cli("index", url, "--out", tmp_path / "manifest")
    assert kept.returncode == 0, kept.stderr
    assert samples(ddpipe.EncodedStream(tmp_path / "manifest", 4, shuffle="none")) == expected
    verified = run_cli("verify", tmp_path / "manifest", "--quiet")  # no DALI index in the bucket yet: none checked
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"data      {url}\n" in run_cli("inspect", tmp_path / "manifest", "--no-scan", check=True).stdout
    beside = run_cli("index", url)
    assert beside.returncode == 0, beside.stderr
    assert samples(ddpipe.EncodedStream(url, 4, shuffle="none")) == expected


def test_tars_in_a_bucket_are_indexed_a_few_at_a_time_on_this_disk(local_sets: dict[str, Path], bucket: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket of ImageNet's tars holds 140 GB: indexing fetched every object into the temporary
    directory before reading the first, and a node's /tmp filled. Now at most two are here at once: the
    one being read, and the next, fetched meanwhile."""
    from ddpipe.cli import main

    url = f"s3://{bucket}/tars"
    objects = open_storage(url)
    tars = sorted(local_sets["wds"].glob("*.tar"))
    for tar in tars:
        objects.put_file(tar.name, tar)
    here = files_here_at_each_download(monkeypatch, "*.tar")
    assert main(["index", url]) == 0
    assert len(tars) >= 4 and len(here) == len(tars) and max(here) <= 2, here
    assert set(objects.list()) == {"index.json", *(t.name for t in tars), *(t.with_suffix(".idx").name for t in tars)}
    assert samples(ddpipe.EncodedStream(url, 4, shuffle="none")) == \
        samples(ddpipe.EncodedStream(local_sets["wds"], 4, shuffle="none"))


def test_a_tar_in_a_bucket_that_cannot_be_adopted_is_named_by_its_url(bucket: str, tmp_path: Path) -> None:
    """Indexing fetches the objects into a temporary directory: an error named the file there, a path
    the user never gave and that was gone by the time they read it."""
    from ..helpers import tar_of

    apart = tar_of(tmp_path / "apart.tar", ["a.jpg", "b.jpg", "a.cls", "b.cls"])
    url = f"s3://{bucket}/apart"
    open_storage(url).put_file("apart.tar", apart)
    proc = run_cli("index", url)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"ddpipe: error: {url}/apart.tar: the files of sample 'a' are not together"), \
        proc.stderr
    assert "ddpipe-index-" not in proc.stderr and set(open_storage(url).list()) == {"apart.tar"}


def test_a_bad_tar_among_good_ones_in_a_bucket_writes_nothing_and_leaves_nothing_here(
        local_sets: dict[str, Path], bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found after a good shard was read and while the next was fetched: no .idx, no index.json in the
    bucket, and no fetched shard left in the temporary directory."""
    from ..helpers import tar_of

    url = f"s3://{bucket}/mixed"
    objects = open_storage(url)
    good = sorted(local_sets["wds"].glob("*.tar"))
    objects.put_file("a.tar", good[0])
    objects.put_file("b.tar", tar_of(tmp_path / "b.tar", ["x.jpg", "y.jpg", "x.cls"]))
    objects.put_file("c.tar", good[1])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    proc = run_cli("index", url)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"ddpipe: error: {url}/b.tar: the files of sample 'x' are not together"), \
        proc.stderr
    assert set(objects.list()) == {"a.tar", "b.tar", "c.tar"} and not list(scratch.iterdir())


@pytest.mark.parametrize("labels", ["numbers", "names"])
def test_hdf5_files_in_a_bucket_are_indexed_one_at_a_time_on_this_disk(labels: str, bucket: str, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """As tars are: one file here at a time, whether labels are numbers or names (whose classes are
    found across every file before any file's samples are numbered)."""
    from ddpipe.cli import main

    from ..convert.foreign_data import h5_class_names, h5_vlen

    if labels == "numbers":
        local = h5_vlen(tmp_path / "h5", files=3)
    else:
        local = tmp_path / "h5"
        local.mkdir()
        for k, names in enumerate([["ant", "bee", "cat", "dog", "eel"], ["fox", "ant", "bee", "cat", "dog"],
                                   ["gnu", "ant", "bee", "cat", "dog"]]):
            h5_class_names(tmp_path / f"one{k}", names, n=10)
            (tmp_path / f"one{k}" / "train.h5").rename(local / f"part{k}.h5")
    here_adopted = run_cli("index", local, "--out", tmp_path / "here")
    assert here_adopted.returncode == 0, here_adopted.stderr
    url = f"s3://{bucket}/h5-{labels}"
    upload_dir(local, url)
    held = files_here_at_each_download(monkeypatch, "*.h5")
    assert main(["index", url]) == 0
    assert held and max(held) == 1, held
    expected = ddpipe.open_dataset(tmp_path / "here")
    adopted = ddpipe.open_dataset(url)
    assert adopted.manifest.classes == expected.manifest.classes and len(adopted.manifest.classes) == 7 - 2 * (
        labels == "numbers")
    assert samples(ddpipe.EncodedStream(url, 5, shuffle="none")) == \
        samples(ddpipe.EncodedStream(tmp_path / "here", 5, shuffle="none"))


def test_an_hdf5_file_in_a_bucket_that_is_not_one_is_named_by_its_url(bucket: str, tmp_path: Path) -> None:
    from ..convert.foreign_data import h5_vlen

    url = f"s3://{bucket}/h5-bad"
    upload_dir(h5_vlen(tmp_path / "h5"), url)
    open_storage(url).put_bytes("part9.h5", b"not HDF5 at all")
    proc = run_cli("index", url)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"ddpipe: error: {url}/part9.h5: "), proc.stderr
    assert "ddpipe-index-" not in proc.stderr and "index.json" not in open_storage(url).list()


@pytest.mark.parametrize("kind", ["hdf5", "lmdb"])
def test_hdf5_files_and_lmdb_environments_in_a_bucket_are_adopted_in_place(kind: str, bucket: str,
                                                                           tmp_path: Path) -> None:
    from ..convert.foreign_data import h5_vlen, lmdb_msgpack

    local = h5_vlen(tmp_path / "h5") if kind == "hdf5" else lmdb_msgpack(tmp_path / "env")
    if kind == "lmdb":
        (local / "lock.mdb").unlink(missing_ok=True)  # not data: a reader makes its own
    adopted_here = run_cli("index", local, "--out", tmp_path / "here")
    assert adopted_here.returncode == 0, adopted_here.stderr
    url = f"s3://{bucket}/{kind}"
    upload_dir(local, url)
    adopted = run_cli("index", url)
    assert adopted.returncode == 0, adopted.stderr
    assert open_storage(url).list().keys() >= {"index.json"}
    expected = samples(ddpipe.EncodedStream(tmp_path / "here", 5, shuffle="none"))
    assert samples(ddpipe.EncodedStream(url, 5, shuffle="none")) == expected
    assert len(expected) in (25, 30)


@pytest.mark.parametrize("kind", ["tar", "hdf5"])
def test_indexing_a_bucket_again_keeps_the_class_names_given_before(kind: str, local_sets: dict[str, Path],
                                                                     bucket: str, tmp_path: Path) -> None:
    """As indexing a directory again does (after adding shards, say): the names recorded where the
    manifest goes, beside the objects or in --out, not numbers in their place."""
    from ..convert.foreign_data import CLASSES, h5_vlen

    url = f"s3://{bucket}/{kind}"
    if kind == "tar":  # tars as another tool left them, without the conversion's index.json
        for tar in sorted(local_sets["wds"].glob("*.tar")):
            open_storage(url).put_file(tar.name, tar)
    else:
        upload_dir(h5_vlen(tmp_path / "h5"), url)
    names = [f"kind{i}" for i in range(3 if kind == "tar" else CLASSES)]
    (tmp_path / "names.txt").write_text("\n".join(names) + "\n")
    for where in ([], ["--out", str(tmp_path / "kept")]):
        assert run_cli("index", url, *where, "--classes", tmp_path / "names.txt").returncode == 0
        again = run_cli("index", url, *where)
        assert again.returncode == 0, again.stderr
        manifest = ddpipe.load_manifest(tmp_path / "kept") if where else ddpipe.open_dataset(url).manifest
        assert list(manifest.classes) == names


@pytest.mark.parametrize("kind", ["tar", "hdf5"])
def test_adopting_a_bucket_without_room_here_says_so_before_fetching(
        kind: str, local_sets: dict[str, Path], bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Fetching more than the temporary directory holds failed part-way, with the disk full, naming a
    file of a directory the user never gave. Free space is the one thing not real here: a full disk."""
    import collections

    from ddpipe.cli import main
    from ddpipe.storage.objects import ObjectStorage

    from ..convert.foreign_data import h5_vlen

    url = f"s3://{bucket}/{kind}"
    upload_dir(h5_vlen(tmp_path / "h5") if kind == "hdf5" else local_sets["wds"], url)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    fetched: list[str] = []
    monkeypatch.setattr(ObjectStorage, "download", lambda self, name, *_: fetched.append(name))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert main(["index", url]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"ddpipe: error: {url}: adopting fetches the objects") and "1000 bytes free" in error, error
    assert "TMPDIR" in error and error.count("\n") == 1 and fetched == []


def _keys_in_child(dataset: ddpipe.Dataset, out: Any) -> None:
    try:
        out.put(sorted(s["__key__"] for s in read_samples(dataset, np.arange(len(dataset)))))
    except DdpipeError as e:
        out.put(str(e))


AT_ONCE = 6


def asked_at_once(rounds: int, fresh_question: Callable[[], Callable[[], Any]]) -> Iterator[list[Any]]:
    """Each round, a fresh question (made by ``fresh_question``) asked by AT_ONCE threads released
    together, threads taking turns as often as they can (the windows of these races were a few
    bytecodes); the answers, a list a round."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(AT_ONCE) as pool:
            for _ in range(rounds):
                question, together = fresh_question(), threading.Barrier(AT_ONCE)

                def ask(_: int, question: Callable[[], Any] = question, together: threading.Barrier = together) -> Any:
                    together.wait()
                    return question()

                yield list(pool.map(ask, range(AT_ONCE)))
    finally:
        sys.setswitchinterval(switch)


def test_threads_asking_at_once_for_a_new_client_are_each_served(http_root: RangeServer) -> None:
    """The client is made on first use, which a shard's fetches (the pool's threads, the reader's) can
    ask for at once: a thread that found it half made took its own process for a forked one, and the
    epoch failed with the fork's message (a run of the suite on one core)."""
    (http_root.root / "wds").mkdir()
    (http_root.root / "wds" / "x").write_bytes(b"0123456789")
    # before the fix, 100 rounds failed in 2 runs of 5
    for sizes in asked_at_once(200, lambda: functools.partial(open_storage(f"{http_root.url}/wds").size, "x")):
        assert sizes == [10] * AT_ONCE


def test_threads_asking_at_once_for_the_scratch_directory_share_one() -> None:
    """A remote dataset's fetched shards go to a directory made on first use: threads that asked at
    once had each made one, and the second had forgotten the fetches under way in the first."""
    def fresh_cache_dir() -> Callable[[], Path]:
        cache = ObjectCache(open_storage("http://127.0.0.1:9/wds"))  # nothing is fetched: no server
        return lambda: cache.dir

    for dirs in asked_at_once(200, fresh_cache_dir):
        assert len(set(dirs)) == 1


def test_a_dataset_used_before_a_fork_is_refused_in_the_child_and_one_spawned_reads(
        local_sets: dict[str, Path], bucket: str) -> None:
    """obstore's clients do not survive a fork (their runtime's threads stay in the parent): a child
    forked after the dataset was used gets one line saying so rather than hang; a spawned one (the
    dataset pickled without its client) reads everything."""
    import multiprocessing

    url = f"s3://{bucket}/wds"
    upload_dir(local_sets["wds"], url)
    dataset = ddpipe.open_dataset(url)  # the parent's client is made here (the listing)
    parent = sorted(s["__key__"] for s in read_samples(dataset, np.arange(len(dataset))))
    for method in ("fork", "spawn"):
        ctx: Any = multiprocessing.get_context(method)
        out = ctx.Queue()
        child = ctx.Process(target=_keys_in_child, args=(dataset, out))
        child.start()
        got = out.get(timeout=120)
        child.join(timeout=60)
        if method == "fork":
            assert isinstance(got, str) and "forked from one that had used" in got and url in got
        else:
            assert got == parent and len(got) == 24
