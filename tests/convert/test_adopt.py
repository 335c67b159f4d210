"""``ddpipe index``: tar shards from the webdataset library or plain tar, adopted in place."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

import ddpipe
from ddpipe.convert import index_tars
from ddpipe.errors import ConversionConflictError, UnlabelledSamplesWarning

from ..conftest import run_cli
from ..formats.conformance import example_samples


def test_adopts_shardwriter_output_without_copying(tmp_path: Path) -> None:
    items = example_samples(30)
    with wds.ShardWriter(str(tmp_path / "train-%06d.tar"), maxcount=8, verbose=0) as sink:
        for s in items:
            sink.write(dict(s))
    before = {p.name: (p.stat().st_ino, p.read_bytes()) for p in tmp_path.glob("*.tar")}
    proc = run_cli("index", tmp_path, check=True)
    assert "4 tar shards, 30 samples" in proc.stdout
    after = {p.name: (p.stat().st_ino, p.read_bytes()) for p in tmp_path.glob("*.tar")}
    assert after == before  # adopted in place: same files, same bytes
    ds = ddpipe.open_dataset(tmp_path)
    assert list(ds) == items
    assert ds.manifest.classes == ("0", "1", "2") and ds.manifest.fields == ("cls", "jpg")
    labels = ds.manifest.sample_labels()  # recorded at adoption, for ddpipe plan
    assert labels is not None and labels.tolist() == [int(s["cls"]) for s in items]
    assert run_cli("verify", tmp_path, "--quiet").returncode == 0


def test_adopts_plain_tar_and_dali_reads_it(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    items = example_samples(6)
    for s in items:
        stem = s["__key__"].replace("/", "_")
        (src / f"{stem}.jpg").write_bytes(s["jpg"])
        (src / f"{stem}.cls").write_bytes(s["cls"])
    shards = tmp_path / "shards"
    shards.mkdir()
    subprocess.run(["tar", "-C", str(src), "--sort=name", "-cf", str(shards / "a.tar"), "."], check=True)
    m = index_tars(shards)
    assert m.num_samples == 6
    dali = pytest.importorskip("nvidia.dali", reason="DALI is installed by make test (ddpipe[dali])")
    from nvidia.dali import fn

    @dali.pipeline_def(batch_size=6, num_threads=1, device_id=None)
    def pipe():  # type: ignore[no-untyped-def]
        return fn.readers.webdataset(paths=[str(shards / "a.tar")], index_paths=[str(shards / "a.idx")],
                                     ext=["jpg"], random_shuffle=False)

    p = pipe()
    p.build()
    (jpg,) = p.run()
    got = sorted(np.array(jpg[i]).tobytes() for i in range(6))
    assert got == sorted(s["jpg"] for s in items)


def test_imagenets_own_file_names_in_a_plain_tar_are_images(tmp_path: Path) -> None:
    """ImageNet's files end in .JPEG: tarred as they are, their field is 'JPEG', which the loader took
    for no image at all (each sample bad), and verify --decode passed without decoding one."""
    from ..decode.images import labelled_samples

    src = tmp_path / "src"
    src.mkdir()
    items = labelled_samples(6, np.random.default_rng(3))
    for i, s in enumerate(items):
        (src / f"n01440764_{i:05d}.JPEG").write_bytes(s["jpg"])
        (src / f"n01440764_{i:05d}.cls").write_bytes(s["cls"])
    shards = tmp_path / "shards"
    shards.mkdir()
    subprocess.run(["tar", "-C", str(src), "--sort=name", "-cf", str(shards / "a.tar"), "."], check=True)
    assert index_tars(shards).fields == ("JPEG", "cls")
    with ddpipe.Loader(shards, 3, decoder="pil", device="cpu", shuffle="none", size=16, resize_shorter=16,
                       threads=1) as loader:
        labels = [int(y) for _, ys in loader for y in ys]
    assert labels == [int(s["cls"]) for s in items]
    assert ddpipe.verify_dataset(shards, decode=True).decoded == 6


def test_refuses_foreign_index_json(tmp_path: Path) -> None:
    with wds.ShardWriter(str(tmp_path / "x-%06d.tar"), maxcount=8, verbose=0) as sink:
        for s in example_samples(3):
            sink.write(dict(s))
    (tmp_path / "index.json").write_text('{"someone": "else"}')
    with pytest.raises(ConversionConflictError, match="not a ddpipe manifest"):
        index_tars(tmp_path)
    assert (tmp_path / "index.json").read_text() == '{"someone": "else"}'


def test_class_names_too_few_for_the_labels_are_refused(tmp_path: Path) -> None:
    with wds.ShardWriter(str(tmp_path / "x-%06d.tar"), maxcount=8, verbose=0) as sink:
        for s in example_samples(9):  # classes 0, 1 and 2
            sink.write(dict(s))
    with pytest.raises(ddpipe.DdpipeError, match="a label is 2, but there are 2 class names"):
        index_tars(tmp_path, classes=["cat", "dog"])
    assert not (tmp_path / "index.json").exists()
    assert index_tars(tmp_path, classes=["cat", "dog", "eel"]).classes == ("cat", "dog", "eel")


def test_a_label_that_is_no_class_index_is_refused(tmp_path: Path) -> None:
    with wds.ShardWriter(str(tmp_path / "x-%06d.tar"), maxcount=8, verbose=0) as sink:
        for s in [*example_samples(3), {"__key__": "big", "jpg": b"x", "cls": b"3000000000"}]:
            sink.write(dict(s))
    with pytest.raises(ddpipe.DdpipeError, match="a label is 3000000000: as a class index, that makes 3,000,000,001"):
        index_tars(tmp_path)  # its classes were numbered up to it, until memory ran out
    assert not (tmp_path / "index.json").exists()


def test_samples_without_a_class_number_are_named_at_adoption(tmp_path: Path) -> None:
    """A .cls of -1 (no label), a class name, or none among labelled samples: training skips or refuses
    each such sample, so adoption says so, naming the first, rather than only leaving the classes unnamed."""
    with wds.ShardWriter(str(tmp_path / "x-%06d.tar"), maxcount=4, verbose=0) as sink:
        for i, s in enumerate(example_samples(8)):
            s = dict(s)
            if i == 5:
                s["cls"] = b"-1"
            elif i == 6:
                s["cls"] = b"n01440764"
            elif i == 7:
                del s["cls"]
            sink.write(s)
    with pytest.warns(UnlabelledSamplesWarning) as caught:
        m = index_tars(tmp_path)
    assert m.num_samples == 8 and m.classes == ()
    (message,) = [str(w.message) for w in caught]
    # shards named as the directory names them, local or a bucket's copy in a temporary one
    assert message.startswith("3 of 8 samples have no class number")
    assert "x-000001.tar" in message and "b'-1'" in message  # the first of them
    proc = run_cli("index", tmp_path, check=True)
    warned = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(warned) == 1 and warned[0].startswith("ddpipe: warning: ") and "3 of 8 samples" in warned[0]


def test_labelled_tars_adopt_without_a_warning(tmp_path: Path) -> None:
    with wds.ShardWriter(str(tmp_path / "x-%06d.tar"), maxcount=4, verbose=0) as sink:
        for s in example_samples(8):
            sink.write(dict(s))
    proc = run_cli("index", tmp_path, check=True)
    assert proc.stderr.strip() == ""


def test_truncated_tar_is_refused(tmp_path: Path) -> None:
    with wds.ShardWriter(str(tmp_path / "x-%06d.tar"), maxcount=8, verbose=0) as sink:
        for s in example_samples(3):
            sink.write(dict(s))
    shard = tmp_path / "x-000000.tar"
    shard.write_bytes(shard.read_bytes()[:1500])
    proc = run_cli("index", tmp_path)
    assert proc.returncode == 1 and "x-000000.tar" in proc.stderr and "truncated" in proc.stderr
    assert not (tmp_path / "index.json").exists()


def test_a_failed_index_leaves_the_directory_as_it_was(tmp_path: Path) -> None:
    """The shards before the bad one had their DALI index written (or replaced) beside them."""
    with wds.ShardWriter(str(tmp_path / "x-%06d.tar"), maxcount=2, verbose=0) as sink:
        for s in example_samples(7):
            sink.write(dict(s))
    (tmp_path / "x-000000.idx").write_text("an index of its own\n")
    last = tmp_path / "x-000003.tar"
    last.write_bytes(last.read_bytes()[:700])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    proc = run_cli("index", tmp_path)
    assert proc.returncode == 1 and "x-000003.tar: truncated" in proc.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    last.unlink()
    assert run_cli("index", tmp_path).returncode == 0  # the index there was not read: the headers were
    assert len(list(ddpipe.open_dataset(tmp_path))) == 6


def test_tars_indexed_with_out_leave_their_directory_untouched(tmp_path: Path) -> None:
    """--out, "write index.json here instead of beside the data", was heard for HDF5 and LMDB only:
    tars got their index.json and DALI indexes beside them all the same. The manifest goes to --out,
    no DALI index is written (a tar without one has its headers scanned), and the dataset reads,
    verifies and stages; indexing again keeps the class names the manifest there records."""
    data = tmp_path / "shared" / "tars"
    data.mkdir(parents=True)
    items = example_samples(10)
    with wds.ShardWriter(str(data / "x-%06d.tar"), maxcount=4, verbose=0) as sink:
        for s in items:
            sink.write(dict(s))
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    out = tmp_path / "manifests" / "tars"
    names = tmp_path / "names.txt"
    names.write_text("ant\nbee\ncat\n")
    given: list[list[str | Path]] = [["--classes", names], []]
    for classes in given:
        proc = run_cli("index", data, "--out", out, *classes)
        assert proc.returncode == 0, proc.stderr
        assert f"in place (its index.json in {out})" in proc.stdout
        assert {p.name: p.read_bytes() for p in data.iterdir()} == before
        assert sorted(p.name for p in out.iterdir()) == ["index.json"]
        ds = ddpipe.open_dataset(out)
        assert list(ds) == items and ds.manifest.classes == ("ant", "bee", "cat")
    assert run_cli("verify", out, "--quiet").returncode == 0
    assert f"data      {data}\n" in run_cli("inspect", out, "--no-scan", check=True).stdout  # where the shards are
    stage = tmp_path / "stage"
    assert run_cli("stage", out, "--local-dir", stage, "--quiet").returncode == 0
    stream = ddpipe.EncodedStream(out, 4, shuffle="none", stage_dir=stage)
    assert [s["__key__"] for batch in stream for s in batch] == [s["__key__"] for s in items]
    assert stream.stager is not None and stream.stager.stats["reused"] == 3
    assert run_cli("verify", out, "--stage-dir", stage, "--quiet").returncode == 0


def test_tars_in_a_directory_this_user_may_not_write_are_indexed_with_out(tmp_path: Path) -> None:
    """Without --out the answer names it before any shard is read; it was the DALI index's hidden
    temporary name, refused."""
    import sys

    from ..conftest import launch
    from ..helpers import as_a_user_file_modes_refuse

    as_user = as_a_user_file_modes_refuse()
    data = tmp_path / "tars"
    data.mkdir()
    with wds.ShardWriter(str(data / "x-%06d.tar"), maxcount=4, verbose=0) as sink:
        for s in example_samples(6):
            sink.write(dict(s))
    out = tmp_path / "out"
    out.mkdir()
    data.chmod(0o555)
    try:
        index = [*as_user, sys.executable, "-m", "ddpipe", "index", str(data)]
        refused = launch(index, timeout=120)  # a hang bound
        made = launch([*index, "--out", str(out)], timeout=120)
    finally:
        data.chmod(0o755)
    assert refused.returncode == 1
    assert refused.stderr == f"ddpipe: error: {data}: the data directory is read-only: write the manifest " \
                             "elsewhere with --out DIR\n"
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in data.iterdir()) == ["x-000000.tar", "x-000001.tar"]
    assert len(ddpipe.open_dataset(out)) == 6


@pytest.mark.parametrize("mode", [0o000, 0o311])
def test_a_directory_that_cannot_be_listed_is_named_as_such(tmp_path: Path, mode: int) -> None:
    """Unreadable and untraversable (0), it was reported as '.../data.mdb: Permission denied', a file it
    does not hold. Run as a user the directory refuses (root, without its override of file modes)."""
    import sys

    from ..conftest import launch
    from ..helpers import as_a_user_file_modes_refuse

    as_user = as_a_user_file_modes_refuse()
    data = tmp_path / "shards"
    ddpipe.write_dataset(data, iter(example_samples(4)), samples_per_shard=2)
    (data / "index.json").unlink()
    data.chmod(mode)
    try:
        proc = launch([*as_user, sys.executable, "-m", "ddpipe", "index", str(data)], timeout=120)  # a hang bound
    finally:
        data.chmod(0o755)
    assert proc.returncode == 1 and proc.stderr == f"ddpipe: error: {data}: cannot list: Permission denied\n"
    assert not (data / "index.json").exists()
