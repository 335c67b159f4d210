"""``ddpipe index`` as a command: pickles only when allowed, a read-only directory or an unmakeable
--out refused before a file is read, indexing again, and mistakes that lead somewhere."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import h5py
import pytest

import ddpipe
from ddpipe.checksum import file_checksum

from ..conftest import run_cli
from ..formats.conformance import example_samples
from ..helpers import make_dataset
from . import foreign_data as fd
from .adopted import LAYOUTS, hashes


def test_pickles_are_refused_unless_allowed(tmp_path: Path) -> None:
    root = fd.lmdb_pickle(tmp_path / "pkl")
    proc = run_cli("index", root)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "pickles" in proc.stderr and "runs code" in proc.stderr and "--allow-pickle" in proc.stderr
    assert not (root / "index.json").exists()


@pytest.mark.parametrize("name", ["h5-vlen", "caffe-encoded"])
def test_a_read_only_directory_is_refused_before_its_files_are_read(name: str, tmp_path: Path) -> None:
    """Refused once every file had been read and hashed (minutes for an ImageNet): here, with files
    this user may not read, the answer was about them. With --out the manifest goes there. Run as a
    user file modes refuse (root, without its override of them)."""
    import sys

    from ..conftest import launch
    from ..helpers import as_a_user_file_modes_refuse

    as_user = as_a_user_file_modes_refuse()
    make, flags, n = LAYOUTS[name]
    root = make(tmp_path / "ro")
    before = hashes(root)
    out = tmp_path / "out"
    out.mkdir()
    index = [*as_user, sys.executable, "-m", "ddpipe", "index", str(root), *flags]
    files = [p for p in root.iterdir() if p.is_file()]
    try:
        root.chmod(0o555)
        for p in files:
            p.chmod(0o000)
        unread = launch(index, timeout=120)  # hang bounds
        unreadable = launch([*index, "--out", str(out)], timeout=120)
        for p in files:
            p.chmod(0o444)
        kept = launch([*index, "--out", str(out)], timeout=120)
    finally:
        root.chmod(0o755)
    assert unread.returncode == 1
    assert unread.stderr == f"ddpipe: error: {root}: the data directory is read-only: write the manifest " \
                            "elsewhere with --out DIR\n"
    first = sorted(files)[0]  # named in the system's words (an HDF5 file's were a line of HDF5's own)
    what = "HDF5 file" if first.suffix == ".h5" else "LMDB environment"
    assert unreadable.returncode == 1
    assert unreadable.stderr == f"ddpipe: error: {first}: not a readable {what}: Permission denied\n"
    assert kept.returncode == 0, kept.stderr
    assert hashes(root) == before and not (root / "index.json").exists()
    assert len(ddpipe.open_dataset(out)) == n


@pytest.mark.parametrize("name", ["tars", "h5-vlen", "caffe-encoded"])
def test_an_out_directory_that_cannot_be_made_is_refused_before_any_file_is_read(name: str, tmp_path: Path) -> None:
    """An --out under a file, or in a directory this user may not write, was found only when the
    manifest was written, after every file had been read and hashed: here, with files this user may not
    read, the answer was about them. Run as a user file modes refuse (root, without its override)."""
    import sys

    from ..conftest import launch
    from ..helpers import as_a_user_file_modes_refuse

    as_user = as_a_user_file_modes_refuse()
    if name == "tars":
        root = tmp_path / name
        ddpipe.write_dataset(root, iter(example_samples(6)), samples_per_shard=3)
        (root / "index.json").unlink()
    else:
        root = LAYOUTS[name][0](tmp_path / name)
    before = hashes(root)
    (tmp_path / "a-file").write_text("")
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    files = [p for p in root.iterdir() if p.is_file()]
    try:
        read_only.chmod(0o555)
        for p in files:
            p.chmod(0o000)
        index = [*as_user, sys.executable, "-m", "ddpipe", "index", str(root), "--out"]
        under_a_file = launch([*index, str(tmp_path / "a-file" / "m")], timeout=120)  # hang bounds
        a_file = launch([*index, str(tmp_path / "a-file")], timeout=120)
        unwritable = launch([*index, str(read_only / "m")], timeout=120)
        unwritable_itself = launch([*index, str(read_only)], timeout=120)
    finally:
        read_only.chmod(0o755)
        for p in files:
            p.chmod(0o644)
    assert [p.returncode for p in (under_a_file, a_file, unwritable, unwritable_itself)] == [1] * 4
    assert under_a_file.stderr == f"ddpipe: error: {tmp_path}/a-file/m: --out cannot be made: " \
                                  f"{tmp_path}/a-file is not a directory\n"
    assert a_file.stderr == f"ddpipe: error: {tmp_path}/a-file: --out cannot be made: it is not a directory\n"
    assert unwritable.stderr == f"ddpipe: error: {read_only}/m: --out cannot be written: {read_only} is read-only\n"
    assert unwritable_itself.stderr == f"ddpipe: error: {read_only}: --out cannot be written: it is read-only\n"
    assert hashes(root) == before and not (root / "index.json").exists() and not any(read_only.iterdir())


def test_the_manifest_can_live_in_another_directory(tmp_path: Path) -> None:
    root = fd.lmdb_caffe(tmp_path / "caffe" / "train_lmdb")
    before = hashes(root)
    out = tmp_path / "manifests" / "train"
    proc = run_cli("index", root, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert not (root / "index.json").exists() and hashes(root) == before
    assert len(ddpipe.open_dataset(out)) == 25


def test_ambiguous_hdf5_lists_what_it_found(tmp_path: Path) -> None:

    root = fd.h5_vlen(tmp_path / "two", files=1)
    with h5py.File(root / "part0.h5", "a") as h:
        h.create_dataset("thumbs", data=h["images"][()], dtype=h["images"].dtype)
    proc = run_cli("index", root)
    assert proc.returncode == 1 and "images" in proc.stderr and "thumbs" in proc.stderr
    assert "--images" in proc.stderr and "Traceback" not in proc.stderr
    assert run_cli("index", root, "--images", "thumbs").returncode == 0


@pytest.mark.parametrize(("make", "says"), [(fd.lmdb_caffe, "ddpipe index"), (fd.h5_vlen, "ddpipe index")])
def test_convert_on_adoptable_data_says_which_command_to_run(tmp_path: Path, make: Callable[[Path], Path],
                                                            says: str) -> None:
    root = make(tmp_path / "data")
    proc = run_cli("convert", root, tmp_path / "out", "--format", "wds")
    assert proc.returncode == 1 and says in proc.stderr and str(root) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "no class directories" not in proc.stderr


def test_index_on_something_it_cannot_read_says_what_it_found(tmp_path: Path) -> None:
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "notes.txt").write_text("x")
    proc = run_cli("index", tmp_path / "odd")
    assert proc.returncode == 1 and "notes.txt" in proc.stderr and "nothing to adopt" in proc.stderr


def test_indexing_files_that_are_not_what_they_say_is_one_line(tmp_path: Path) -> None:
    import tarfile

    for name, folder in (("data.mdb", "mdb"), ("x.h5", "h5")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_bytes(os.urandom(100_000))
    (tmp_path / "tar").mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as t:
        info = tarfile.TarInfo(b"\xff\xfe.jpg".decode("utf-8", "surrogateescape"))
        info.size = 3
        t.addfile(info, io.BytesIO(b"abc"))
    (tmp_path / "tar" / "a.tar").write_bytes(buf.getvalue())
    for folder, says in (("mdb", "not a readable LMDB environment"), ("h5", "not a readable HDF5 file"),
                         ("tar", "its name is not UTF-8")):
        proc = run_cli("index", tmp_path / folder)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and says in lines[0], proc.stderr
        assert not (tmp_path / folder / "index.json").exists()


@pytest.mark.parametrize(("flags", "says"), [
    # the record parser's own error, a traceback
    (["--values", "caffe"], "data.mdb: --values caffe does not read the first record (b'img00000_0'): wire type"),
    (["--values", "msgpack"], "data.mdb: --values msgpack does not read the first record (b'img00000_0'): not a"),
    # "data.mdb: unreadable LMDB environment: [Errno 2] No such file or directory: '.../nope.txt'"
    (["--labels-file", "nope.txt"], "nope.txt: cannot read the labels file: No such file or directory"),
])
def test_lmdb_options_that_do_not_fit_the_data_are_one_line(tmp_path: Path, flags: list[str], says: str) -> None:
    root = fd.lmdb_images_label_in_key(tmp_path / "lmdb")
    proc = run_cli("index", root, *flags)
    assert proc.returncode == 1 and proc.stderr.startswith("ddpipe: error: ") and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (root / "index.json").exists()


@pytest.mark.parametrize("name", ["h5-vlen", "caffe-encoded"])
def test_indexing_again_keeps_the_class_names_and_never_replaces_a_foreign_index_json(name: str,
                                                                                     tmp_path: Path) -> None:
    make, flags, _ = LAYOUTS[name]
    root = make(tmp_path / name)
    names = tmp_path / "names.txt"
    names.write_text("".join(f"class-{c}\n" for c in range(fd.CLASSES)))
    run_cli("index", root, *flags, "--classes", names, check=True)
    run_cli("index", root, *flags, check=True)  # again, to record what a newer ddpipe records
    assert ddpipe.load_manifest(root).classes == tuple(f"class-{c}" for c in range(fd.CLASSES))
    other = tmp_path / f"{name}-theirs"
    root.rename(other)
    (other / "index.json").write_text('{"written by": "another tool"}')
    proc = run_cli("index", other, *flags)
    assert proc.returncode != 0 and "not a ddpipe manifest" in proc.stderr and "Traceback" not in proc.stderr
    assert (other / "index.json").read_text() == '{"written by": "another tool"}'


@pytest.mark.parametrize("fmt", ["wds", "hdf5", "lmdb"])
def test_index_refuses_a_dataset_ddpipe_converted_and_changes_nothing(fmt: str, tmp_path: Path) -> None:
    """Indexing a converted dataset would replace the checksums its shards are checked against with
    those of its files as they are now (a shard damaged since, vouched for) and the fingerprint a rerun
    of the conversion resumes from; its own HDF5 and LMDB shards were refused in words about other
    tools' files ("no datasets of images found", "nothing to adopt")."""
    root = tmp_path / "shards"
    ddpipe.convert(make_dataset(tmp_path / "src", "wds", [4, 4]), root, ddpipe.ConvertOptions(format=fmt))
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}
    outs: list[list[str | Path]] = [[], ["--out", tmp_path / "elsewhere"]]
    for out in outs:
        proc = run_cli("index", root, *out)
        assert proc.returncode == 1 and proc.stderr == (
            f"ddpipe: error: {root}: is a dataset that ddpipe convert wrote ({fmt}, 2 shard(s), 8 samples) and "
            f"needs no index: `ddpipe verify {root}` checks its shards against its index.json\n"), proc.stderr
    with pytest.raises(ddpipe.DdpipeError, match="ddpipe convert wrote"):
        ddpipe.index_tars(root)
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()} == before
    assert not (tmp_path / "elsewhere").exists()


def test_indexing_again_names_the_files_that_changed_since(tmp_path: Path) -> None:
    """Indexing again takes the files as they are (data rewritten on purpose), and says which differ
    from the manifest it replaces, so that damage is not taken for a change unsaid."""
    import tarfile

    root = tmp_path / "tars"
    root.mkdir()
    for k in range(2):
        with tarfile.open(root / f"part-{k}.tar", "w") as tf:
            for name, data in ((f"s{k}.cls", b"0"), (f"s{k}.bin", b"payload-%d" % k)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    run_cli("index", root, check=True)
    again = run_cli("index", root)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    tar = root / "part-1.tar"
    tar.write_bytes(tar.read_bytes().replace(b"payload-1", b"payload-X"))
    changed = run_cli("index", root)
    assert changed.returncode == 0 and changed.stderr == (
        f"ddpipe: warning: {root}/index.json: 1 file(s) differ from the checksums it recorded and are indexed as "
        "they are now: part-1.tar\n"), changed.stderr
    assert ddpipe.open_dataset(root).manifest.shards[1].checksum == file_checksum(tar)
