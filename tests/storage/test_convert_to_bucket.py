"""Conversions into a bucket: each shard sent as it is written, by one process or MPI ranks, and an
upload stopped or failing part-way leaves no dataset that is not whole, and resumes."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import ddpipe
from ddpipe.errors import DdpipeError
from ddpipe.storage import StorageError, open_storage

from ..conftest import mpiexec
from .bucket_data import samples


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
    import boto3  # type: ignore[import-untyped]

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
