"""Tars, HDF5 files and LMDB environments already in a bucket, adopted in place: indexed a few at a
time on this disk, the bad ones named by their URL, nothing left behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import ddpipe
from ddpipe.storage import open_storage

from ..conftest import run_cli
from .bucket_data import files_here_at_each_download, samples, upload_dir, upload_tars


def test_tars_in_a_bucket_are_adopted_in_place(local_sets: dict[str, Path], bucket: str, tmp_path: Path) -> None:
    url = f"s3://{bucket}/tars"
    objects = open_storage(url)
    upload_tars(local_sets["wds"], url)
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
    tars = upload_tars(local_sets["wds"], url)
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
    if kind == "tar":
        upload_tars(local_sets["wds"], url)
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
    if kind == "tar":
        upload_tars(local_sets["wds"], url)
    else:
        upload_dir(h5_vlen(tmp_path / "h5"), url)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    fetched: list[str] = []
    monkeypatch.setattr(ObjectStorage, "download", lambda self, name, *_: fetched.append(name))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert main(["index", url]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"ddpipe: error: {url}: adopting fetches the objects") and "1000 bytes free" in error, error
    assert "TMPDIR" in error and error.count("\n") == 1 and fetched == []


@pytest.mark.parametrize("fmt", ["wds", "hdf5"])
def test_index_refuses_a_dataset_ddpipe_converted_into_a_bucket_and_fetches_nothing(
        fmt: str, local_sets: dict[str, Path], bucket: str, tmp_path: Path) -> None:
    """Indexing a converted dataset's objects replaced the checksums its shards are checked against with
    those of the objects as they are now, and the fingerprint a rerun of the conversion resumes from;
    the same for a directory of --out that holds a converted dataset's manifest."""
    url = f"s3://{bucket}/{fmt}"
    upload_dir(local_sets[fmt], url)
    objects = open_storage(url)
    before = {name: objects.get(name) for name in objects.list()}
    manifest = ddpipe.load_manifest(local_sets[fmt])
    said = (f"is a dataset that ddpipe convert wrote ({fmt}, {len(manifest.shards)} shard(s), 24 samples) and needs "
            "no index: `ddpipe verify {0}` checks its shards against its index.json\n")
    for out in ([], ["--out", str(tmp_path / "elsewhere")]):
        proc = run_cli("index", url, *out)
        assert proc.returncode == 1 and proc.stderr == f"ddpipe: error: {url}: " + said.format(url), proc.stderr
    assert {name: objects.get(name) for name in objects.list()} == before and not (tmp_path / "elsewhere").exists()
    kept = tmp_path / "kept"
    shutil.copytree(local_sets[fmt], kept)
    tars = f"s3://{bucket}/tars"
    upload_tars(local_sets["wds"], tars)
    into_kept = run_cli("index", tars, "--out", kept)
    assert into_kept.returncode == 1 and into_kept.stderr == f"ddpipe: error: {kept}: " + said.format(kept)
    assert (kept / "index.json").read_bytes() == (local_sets[fmt] / "index.json").read_bytes()
    assert set(open_storage(tars).list()) == {t.name for t in local_sets["wds"].glob("*.tar")}


def test_indexing_a_bucket_again_names_the_objects_that_changed_since(local_sets: dict[str, Path], bucket: str,
                                                                      tmp_path: Path) -> None:
    """As indexing a directory again does: the objects taken as they are now, and those whose bytes
    differ from the manifest replaced named, beside the objects or in --out, never the copies fetched."""
    url = f"s3://{bucket}/tars"
    objects = open_storage(url)
    tars = upload_tars(local_sets["wds"], url)
    for where in ([], ["--out", str(tmp_path / "kept")]):
        assert run_cli("index", url, *where).returncode == 0
    again = run_cli("index", url)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    whole = tars[1].read_bytes()
    at = whole.index(b"\xff\xd9")  # a byte of the first image's last scan: a tar still whole
    objects.put_bytes(tars[1].name, whole[:at - 1] + bytes([whole[at - 1] ^ 1]) + whole[at:])
    for where, manifest in (([], f"{url}/index.json"), (["--out", str(tmp_path / "kept")],
                                                        f"{tmp_path}/kept/index.json")):
        changed = run_cli("index", url, *where)
        assert changed.returncode == 0 and changed.stderr == (
            f"ddpipe: warning: {manifest}: 1 file(s) differ from the checksums it recorded and are indexed as they "
            f"are now: {tars[1].name}\n"), changed.stderr
    assert run_cli("verify", url, "--quiet").returncode == 0
