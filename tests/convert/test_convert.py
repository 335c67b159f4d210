"""Conversion: every source kind, every format, determinism, resumption and bad input."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ddpipe
from ddpipe.convert import ConvertOptions, convert
from ddpipe.errors import ConversionConflictError, SourceError
from ddpipe.formats import FORMAT_NAMES, get_format
from ddpipe.manifest import load_manifest
from ddpipe.sample import KEY

from ..conftest import dir_bytes, launch, run_cli
from ..helpers import as_a_user_file_modes_refuse

FORMATS = ["wds", "hdf5", "lmdb"]


def opts(fmt: str = "wds", **kw: object) -> ConvertOptions:
    return ConvertOptions(format=fmt, samples_per_shard=kw.pop("samples_per_shard", 5), progress=False, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", FORMATS)
def test_imagefolder_to_every_format(raw_images: Path, tmp_path: Path, fmt: str) -> None:
    m = convert(raw_images, tmp_path / "out", opts(fmt))
    assert m.num_samples == 24 and len(m.shards) == 5
    assert m.classes == ("class_0000", "class_0001", "class_0002")
    assert m.fields == ("cls", "jpg")
    ds = ddpipe.open_dataset(tmp_path / "out")
    got = list(ds)
    files = sorted(raw_images.rglob("*.jpg"))
    # source order is kept: class-sorted source, class-sorted shards
    assert [s[KEY] for s in got] == [f"{f.parent.name}/{f.stem}" for f in files]
    assert [s["jpg"] for s in got] == [f.read_bytes() for f in files]
    assert [int(s["cls"]) for s in got] == [m.classes.index(f.parent.name) for f in files]


def test_every_format_round_trips_byte_for_byte(raw_images: Path, tmp_path: Path) -> None:
    convert(raw_images, tmp_path / "a", opts("wds"))
    convert(tmp_path / "a", tmp_path / "b", ConvertOptions(format="hdf5", progress=False))
    convert(tmp_path / "b", tmp_path / "c", ConvertOptions(format="lmdb", progress=False))
    convert(tmp_path / "c", tmp_path / "d", ConvertOptions(format="wds", progress=False))
    assert list(ddpipe.open_dataset(tmp_path / "b")) == list(ddpipe.open_dataset(tmp_path / "a"))
    assert list(ddpipe.open_dataset(tmp_path / "c")) == list(ddpipe.open_dataset(tmp_path / "a"))
    a, d = dir_bytes(tmp_path / "a"), dir_bytes(tmp_path / "d")
    assert {k: v for k, v in a.items() if k != "index.json"} == {k: v for k, v in d.items() if k != "index.json"}
    assert load_manifest(tmp_path / "a").shards == load_manifest(tmp_path / "d").shards


@pytest.mark.parametrize("fmt", FORMATS)
def test_deterministic_bytes(raw_images: Path, tmp_path: Path, fmt: str) -> None:
    convert(raw_images, tmp_path / "x", opts(fmt, seed=3))
    convert(raw_images, tmp_path / "y", opts(fmt, seed=3))
    assert dir_bytes(tmp_path / "x") == dir_bytes(tmp_path / "y")


def test_workers_write_the_same_bytes(raw_images: Path, tmp_path: Path) -> None:
    convert(raw_images, tmp_path / "one", opts("hdf5"))
    convert(raw_images, tmp_path / "two", opts("hdf5", workers=2))
    assert dir_bytes(tmp_path / "one") == dir_bytes(tmp_path / "two")


def test_seed_shuffles_across_shards(raw_images: Path, tmp_path: Path) -> None:
    convert(raw_images, tmp_path / "p", opts())
    convert(raw_images, tmp_path / "m", opts(seed=1))
    plain = [s[KEY] for s in ddpipe.open_dataset(tmp_path / "p")]
    mixed = [s[KEY] for s in ddpipe.open_dataset(tmp_path / "m")]
    assert sorted(plain) == sorted(mixed) and plain != mixed
    first_shard_classes = {k.split("/")[0] for k in mixed[:5]}
    assert len(first_shard_classes) > 1


def test_shard_size_in_bytes(raw_images: Path, tmp_path: Path) -> None:
    total = sum(f.stat().st_size for f in raw_images.rglob("*.jpg"))
    m = convert(raw_images, tmp_path / "o", ConvertOptions(shard_bytes=total // 4, progress=False))
    assert 4 <= len(m.shards) <= 6 and m.num_samples == 24


def test_list_file_sources(raw_images: Path, tmp_path: Path) -> None:
    files = sorted(raw_images.rglob("*.jpg"))
    csv = tmp_path / "list.csv"
    csv.write_text("path,label\n" + "".join(f"{f},{f.parent.name}\n" for f in files))
    tsv = tmp_path / "list.tsv"
    tsv.write_text("".join(f"{os.path.relpath(f, tmp_path)}\t{i % 4}\n" for i, f in enumerate(files)))
    m = convert(csv, tmp_path / "c", opts())
    assert m.classes == ("class_0000", "class_0001", "class_0002") and m.num_samples == 24
    m = convert(tsv, tmp_path / "t", opts())
    assert m.classes == ("0", "1", "2", "3")
    assert [int(s["cls"]) for s in ddpipe.open_dataset(tmp_path / "t")] == [i % 4 for i in range(24)]


def test_resume_keeps_finished_shards(raw_copy: Path, tmp_path: Path) -> None:
    bad = sorted(raw_copy.rglob("*.jpg"))[17]  # in the 4th of 5 shards
    good = bad.read_bytes()
    bad.write_bytes(b"this is not a jpeg")
    out = tmp_path / "out"
    with pytest.raises(SourceError, match=bad.name):
        convert(raw_copy, out, opts())
    assert not (out / "index.json").exists()  # not a dataset until complete
    assert not list(out.glob(".*.partial"))  # no half-written shard left behind
    finished = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.tar")}
    assert len(finished) == 3
    bad.write_bytes(good)
    convert(raw_copy, out, opts())
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.tar") if p.name in finished} == finished
    convert(raw_copy, tmp_path / "clean", opts())
    assert dir_bytes(out) == dir_bytes(tmp_path / "clean")


def test_resume_rewrites_a_damaged_finished_shard(raw_copy: Path, tmp_path: Path) -> None:
    bad = sorted(raw_copy.rglob("*.jpg"))[17]
    good = bad.read_bytes()
    bad.write_bytes(b"not a jpeg")
    out = tmp_path / "out"
    with pytest.raises(SourceError):
        convert(raw_copy, out, opts())
    shard = out / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:1000])  # damaged while the job was down
    bad.write_bytes(good)
    convert(raw_copy, out, opts())
    convert(raw_copy, tmp_path / "clean", opts())
    assert dir_bytes(out) == dir_bytes(tmp_path / "clean")


def test_unfinished_conversion_of_other_arguments_is_not_mixed(raw_copy: Path, tmp_path: Path) -> None:
    bad = sorted(raw_copy.rglob("*.jpg"))[17]
    bad.write_bytes(b"not a jpeg")
    out = tmp_path / "out"
    with pytest.raises(SourceError):
        convert(raw_copy, out, opts())
    before = dir_bytes(out)
    with pytest.raises(ConversionConflictError, match="unfinished conversion"):
        convert(raw_copy, out, opts(samples_per_shard=4))
    assert dir_bytes(out) == before


def test_skip_records_bad_inputs(raw_copy: Path, tmp_path: Path) -> None:
    files = sorted(raw_copy.rglob("*.jpg"))
    files[3].write_bytes(b"\x00" * 100)
    (files[9].parent / "notes.txt").write_text("not an image")
    (files[12].parent / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")  # stopped the listing, skip or not
    m = convert(raw_copy, tmp_path / "o", opts(on_error="skip"))
    assert m.num_samples == 23
    assert sorted(Path(s.path).name for s in m.skipped) == sorted([files[3].name, "notes.txt", "gone.jpg"])
    assert sorted(s.error.split(":")[0] for s in m.skipped) == ["cannot read", "not an image", "not an image"]
    assert files[3].stem not in {s[KEY].split("/")[1] for s in ddpipe.open_dataset(tmp_path / "o")}


def test_a_directory_that_cannot_be_listed_stops_the_conversion_naming_it(raw_copy: Path, tmp_path: Path) -> None:
    """os.walk passes over it without a word: its images were missing from the dataset, not even
    counted as skipped. Run as a user the directory refuses (root, without its override of file modes)."""
    as_user = as_a_user_file_modes_refuse()
    hidden = sorted(raw_copy.rglob("*.jpg"))[4].parent / "more"
    hidden.mkdir()
    shutil.copy(sorted(raw_copy.rglob("*.jpg"))[0], hidden / "extra.jpg")
    hidden.chmod(0)
    try:
        proc = launch([*as_user, sys.executable, "-m", "ddpipe", "convert", str(raw_copy), str(tmp_path / "o"),
                       "--on-error", "skip", "--quiet"], timeout=120)  # a hang bound
    finally:
        hidden.chmod(0o755)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{hidden}: cannot list: Permission denied" in proc.stderr
    assert not (tmp_path / "o" / "index.json").exists()


def test_an_output_that_cannot_be_made_or_written_is_refused_naming_it(raw_images: Path, tmp_path: Path) -> None:
    """Said in the user's words before the source is read: it was the hidden record's path
    (``OUT/.ddpipe-convert: Not a directory``) or OSError's text. Run as a user the read-only
    directory refuses (root, without its override of file modes)."""
    as_user = as_a_user_file_modes_refuse()
    (tmp_path / "a-file").write_bytes(b"x")
    read_only = tmp_path / "ro"
    read_only.mkdir()
    command = [*as_user, sys.executable, "-m", "ddpipe", "convert", "--quiet", str(raw_images), "OUT"]
    read_only.chmod(0o555)
    try:
        under_a_file = launch([*command[:-1], str(tmp_path / "a-file" / "o")], timeout=120)  # hang bounds
        a_file = launch([*command[:-1], str(tmp_path / "a-file")], timeout=120)
        unwritable = launch([*command[:-1], str(read_only / "o")], timeout=120)
    finally:
        read_only.chmod(0o755)
    assert [p.returncode for p in (under_a_file, a_file, unwritable)] == [1] * 3
    assert under_a_file.stderr == f"ddpipe: error: {tmp_path}/a-file/o: the output cannot be made: " \
                                  f"{tmp_path}/a-file is not a directory\n"
    assert a_file.stderr == f"ddpipe: error: {tmp_path}/a-file: the output cannot be made: it is not a directory\n"
    assert unwritable.stderr == f"ddpipe: error: {read_only}/o: the output cannot be written: " \
                                f"{read_only} is read-only\n"
    assert (tmp_path / "a-file").read_bytes() == b"x" and not any(read_only.iterdir())


def test_other_arguments_do_not_overwrite(raw_images: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    convert(raw_images, out, opts())
    before = dir_bytes(out)
    assert convert(raw_images, out, opts()).num_samples == 24  # same arguments: already done
    with pytest.raises(ConversionConflictError, match="other input or arguments"):
        convert(raw_images, out, opts(seed=5))
    assert dir_bytes(out) == before


def test_refuses_non_empty_foreign_directory(raw_images: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "precious.txt").write_text("mine")
    with pytest.raises(ConversionConflictError, match="not empty"):
        convert(raw_images, out, opts())
    assert os.listdir(out) == ["precious.txt"]


def test_refuses_an_output_inside_the_imagefolder(raw_copy: Path) -> None:
    """It converted, and its shards became a class of the tree's next conversion, which then failed on
    name clashes between a shard and its index."""
    before = dir_bytes(raw_copy)
    for out in (raw_copy / "shards", raw_copy / "class_a" / ".." / "x" / "y", raw_copy):
        with pytest.raises(ConversionConflictError, match=r"is inside the ImageFolder it would be made from"):
            convert(raw_copy, out, opts())
    assert dir_bytes(raw_copy) == before


def test_refuses_to_convert_a_dataset_into_its_own_directory(raw_images: Path, tmp_path: Path) -> None:
    """It was refused as "already holds a dataset made from other input or arguments", of the input."""
    ds = tmp_path / "ds"
    convert(raw_images, ds, opts())
    before = dir_bytes(ds)
    for out in (ds, ds / ".", tmp_path / "x" / ".." / "ds"):
        with pytest.raises(ConversionConflictError, match=r"is the dataset it would be converted from"):
            convert(ds, out, opts("hdf5"))
    assert dir_bytes(ds) == before


def test_duplicate_keys_are_an_error(tmp_path: Path, raw_images: Path) -> None:
    f = next(raw_images.rglob("*.jpg"))
    lst = tmp_path / "l.csv"
    lst.write_text(f"{f},0\n{f},1\n")
    with pytest.raises(SourceError, match="same key"):
        convert(lst, tmp_path / "o", opts())


def test_cli_unreadable_input_is_one_line(raw_copy: Path, tmp_path: Path) -> None:
    bad = sorted(raw_copy.rglob("*.jpg"))[2]
    bad.write_bytes(b"GIF89a broken")
    proc = run_cli("convert", raw_copy, tmp_path / "o", "--samples-per-shard", "5", "--quiet")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and bad.name in lines[0] and "not an image" in lines[0]
    assert "--on-error skip" in lines[0]  # the way past it, for a stray notes file in a class directory


def test_skipped_item_is_recorded_without_the_way_past_a_failure(raw_copy: Path, tmp_path: Path) -> None:
    bad = sorted(raw_copy.rglob("*.jpg"))[2]
    bad.write_bytes(b"GIF89a broken")
    m = convert(raw_copy, tmp_path / "o", opts(on_error="skip"))
    assert [s.error for s in m.skipped] == ["not an image: no image format recognises it"]


def test_cli_full_disk_keeps_finished_shards_and_rerun_completes(raw_images: Path, tmp_path: Path) -> None:
    """A real ENOSPC: a tiny tmpfs in a private mount namespace (unshare), grown after the failure."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed for the full-disk test")
    total = sum(f.stat().st_size for f in raw_images.rglob("*.jpg"))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = mnt / "out"
    conv = f"{sys.executable} -m ddpipe convert {raw_images} {out} --samples-per-shard 5 --quiet"
    script = f"""
set -u
mount -t tmpfs -o size={total * 2 // 3 // 1024}k tmpfs {mnt} || exit 99
{conv}; echo "first=$?"
ls -a {out}; echo "records=$(ls {out}/.ddpipe-convert | grep -c shard)"
mount -o remount,size={total * 3 // 1024}k {mnt}
{conv}; echo "second=$?"
{sys.executable} -m ddpipe verify {out} --quiet; echo "verify=$?"
"""
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if "exit 99" in proc.stdout or proc.returncode == 99:
        pytest.fail(f"cannot mount a tmpfs here: {proc.stderr}")
    out_text = proc.stdout
    assert "first=1" in out_text, proc.stdout + proc.stderr
    assert "no space left" in proc.stderr and "shard-0000" in proc.stderr
    assert "index.json" not in out_text.split("records=")[0]  # the failed run published no manifest
    assert ".partial" not in out_text.split("records=")[0]
    assert int(out_text.split("records=")[1].split()[0]) >= 1  # shards finished before the disk filled
    assert "second=0" in out_text and "verify=0" in out_text, proc.stdout + proc.stderr


def test_worker_failure_names_the_file(raw_copy: Path, tmp_path: Path) -> None:
    bad = sorted(raw_copy.rglob("*.jpg"))[12]
    bad.write_bytes(b"junk")
    with pytest.raises(SourceError, match=bad.name) as info:
        convert(raw_copy, tmp_path / "o", opts(workers=2))
    assert info.value.path == str(bad)
    assert not (tmp_path / "o" / "index.json").exists()


def test_killed_conversion_resumes(raw_copy: Path, tmp_path: Path) -> None:
    """SIGKILL while a shard is half written (the reader blocks on a FIFO), then rerun."""
    import signal
    import subprocess
    import sys
    import time

    victim = sorted(raw_copy.rglob("*.jpg"))[13]  # 4th item of shard 2
    data = victim.read_bytes()
    victim.unlink()
    os.mkfifo(victim)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "ddpipe", "convert", raw_copy, out, "--samples-per-shard", "5",
                             "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (out / ".shard-000002.tar.partial").exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError("conversion did not reach shard 2")
            time.sleep(0.05)
        time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert not (out / "index.json").exists() and (out / ".shard-000002.tar.partial").exists()
    assert not (out / "shard-000002.tar").exists()  # the half-written shard never had its final name
    done = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.tar")}
    assert sorted(done) == ["shard-000000.tar", "shard-000001.tar"]
    victim.unlink()
    victim.write_bytes(data)
    assert run_cli("convert", raw_copy, out, "--samples-per-shard", "5", "--quiet").returncode == 0
    assert {n: (out / n).stat().st_mtime_ns for n in done} == done  # finished shards kept as they were
    convert(raw_copy, tmp_path / "clean", opts())
    assert dir_bytes(out) == dir_bytes(tmp_path / "clean")


@pytest.mark.parametrize("fmt", FORMATS)
def test_write_dataset_from_code(tmp_path: Path, fmt: str) -> None:
    items = [{KEY: f"k/{i}", "txt": f"sample {i}".encode(), "cls": b"%d" % (i % 2)} for i in range(11)]
    m = ddpipe.write_dataset(tmp_path / "d", iter(items), format=fmt, samples_per_shard=4, classes=["a", "b"])
    assert [s.samples for s in m.shards] == [4, 4, 3] and m.fields == ("cls", "txt")
    assert list(ddpipe.open_dataset(tmp_path / "d")) == items
    with pytest.raises(ConversionConflictError):
        ddpipe.write_dataset(tmp_path / "d", iter(items), format=fmt)


def test_write_dataset_refuses_a_class_without_a_name_and_writes_nothing(tmp_path: Path) -> None:
    items = [{KEY: f"k/{i}", "txt": b"x", "cls": b"%d" % i} for i in range(6)]  # the sixth is class 5
    with pytest.raises(ddpipe.SampleError, match=r"sample 'k/5': cls 5 is outside the dataset's 5 classes"):
        ddpipe.write_dataset(tmp_path / "d", iter(items), samples_per_shard=4, classes=list("abcde"))
    assert not (tmp_path / "d" / "index.json").exists() and not list((tmp_path / "d").glob("shard-000001*"))
    items[5]["cls"] = b"3000000000"  # with no names given, no class index: the manifest would be refused
    with pytest.raises(ddpipe.SampleError, match=r"sample 'k/5': cls 3000000000 is too large to be a class index"):
        ddpipe.write_dataset(tmp_path / "e", iter(items), samples_per_shard=4)
    assert not (tmp_path / "e" / "index.json").exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_write_dataset_stopped_by_its_own_samples_leaves_no_part_of_a_shard(tmp_path: Path, fmt: str) -> None:
    """The samples come from the caller's code, which can fail (or be interrupted) between two of them:
    the shard under way was left as a hidden partial file, its handle open."""
    def samples() -> Iterator[dict[str, Any]]:
        for i in range(5):
            yield {KEY: f"k/{i}", "txt": b"x", "cls": b"0"}
        raise RuntimeError("the source broke")

    with pytest.raises(RuntimeError, match="the source broke"):
        ddpipe.write_dataset(tmp_path / "d", samples(), format=fmt, samples_per_shard=3)
    left = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert left == sorted(p.name for p in (tmp_path / "d").glob("shard-000000*")) and left, left
    with pytest.raises(ddpipe.OptionError, match=r"samples_per_shard must be a whole number of at least 1, not 2\.5"):
        ddpipe.write_dataset(tmp_path / "e", [], samples_per_shard=2.5)  # type: ignore[arg-type]
    with pytest.raises(ddpipe.SampleError, match="sample 1 is a list, not a dict of fields"):
        ddpipe.write_dataset(tmp_path / "e", [{KEY: "a", "txt": b"x"}, ["b", b"x"]])  # type: ignore[list-item]
    assert not (tmp_path / "e").exists()  # made by the call, nothing finished in it: not left behind


def test_write_dataset_refuses_what_would_make_a_wrong_or_empty_dataset(tmp_path: Path) -> None:
    """An exhausted iterator wrote a dataset of no samples (refused only when loaded); a string of
    class names became one class a letter; an output that is a file was FileExistsError's traceback;
    an unknown format left an empty directory behind."""
    sample = {KEY: "k/0", "txt": b"x", "cls": 0}
    with pytest.raises(ddpipe.SourceError, match=r"/none: no samples to write: the iterable yielded none"):
        ddpipe.write_dataset(tmp_path / "none", iter([]))
    with pytest.raises(ddpipe.OptionError, match="classes must be a list of class names, not the string 'cat'"):
        ddpipe.write_dataset(tmp_path / "letters", [sample], classes="cat")
    (tmp_path / "a-file").write_bytes(b"x")
    with pytest.raises(ddpipe.DdpipeError, match=r"/a-file/d: the output cannot be made: .*/a-file is not a directory"):
        ddpipe.write_dataset(tmp_path / "a-file" / "d", [sample])
    with pytest.raises(ddpipe.DdpipeError, match="unknown format 'zip'"):
        ddpipe.write_dataset(tmp_path / "zip", [sample], format="zip")
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(ddpipe.SourceError):
        ddpipe.write_dataset(kept, [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "kept"]  # the user's own empty directory stays
    assert (tmp_path / "a-file").read_bytes() == b"x"


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_write_dataset_refuses_a_key_twice_in_a_shard_and_keeps_the_shards_before(tmp_path: Path, fmt: str) -> None:
    """Two samples of one key made a tar that ddpipe's own verify failed ("has field 'cls' twice") and
    that webdataset's and DALI's readers took for one sample; convert refuses such keys already."""
    samples = [{KEY: k, "txt": b"x", "cls": 0} for k in ("a", "b", "c", "d", "e", "d")]
    with pytest.raises(ddpipe.SampleError) as refused:
        ddpipe.write_dataset(tmp_path / "d", samples, format=fmt, samples_per_shard=3)
    assert str(refused.value) == "sample 'd': its key is an earlier sample's in the same shard: keys must be unique"
    # the finished shard (with a tar's .idx), and no part of the next
    assert {p.stem for p in (tmp_path / "d").iterdir() if p.name.startswith("shard-")} == {"shard-000000"}
    assert (tmp_path / "d" / f"shard-000000{get_format(fmt).suffix}").exists()
    ddpipe.write_dataset(tmp_path / "apart", [{KEY: "a", "txt": b"x", "cls": 0}] * 2, format=fmt, samples_per_shard=1)
    assert ddpipe.verify_dataset(tmp_path / "apart", progress=False).ok  # one key in two shards: each reads alone


def test_the_local_writers_refuse_a_url_rather_than_make_a_directory_of_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Path("s3://bucket/x") is "s3:/bucket/x": write_dataset wrote the dataset there, in the working
    directory, and index_tars said "s3:/bucket/x: not a directory"."""
    monkeypatch.chdir(tmp_path)
    sample = {KEY: "k/0", "txt": b"x", "cls": 0}
    with pytest.raises(ddpipe.OptionError, match=r"^s3://bkt/x: write_dataset writes a local directory: write the "
                                                 r"dataset here, then `ddpipe convert DIR s3://bucket/prefix`"):
        ddpipe.write_dataset("s3://bkt/x", [sample])
    with pytest.raises(ddpipe.OptionError, match=r"^https://host/x: index_tars adopts a local directory: `ddpipe "
                                                 r"index s3://bucket/prefix` adopts tars in a bucket"):
        ddpipe.index_tars("https://host/x")
    with pytest.raises(ddpipe.OptionError, match=r"^convert's src is an empty path: name a directory$"):
        ddpipe.convert("", tmp_path / "o")  # Path("") is ".": the working directory, converted as an ImageFolder
    with pytest.raises(ddpipe.OptionError, match=r"^convert's out is an empty path: name a directory$"):
        ddpipe.convert(tmp_path, "")
    ddpipe.write_dataset(tmp_path / "tars", [sample])
    with pytest.raises(ddpipe.OptionError, match=r"^s3://bkt/m: out is a local directory for index.json"):
        ddpipe.index_tars(tmp_path / "tars", out="s3://bkt/m")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tars"]


def test_write_dataset_takes_a_class_number_as_an_int(tmp_path: Path) -> None:
    """What webdataset's writer takes; here it was refused as "cls 3 is not an integer"."""
    items = [{KEY: f"k/{i}", "txt": b"x", "cls": i % 3} for i in range(6)]
    manifest = ddpipe.write_dataset(tmp_path / "d", items, samples_per_shard=4)
    assert [s.labels for s in manifest.shards] == [((0, 1), (1, 1), (2, 1), (0, 1)), ((1, 1), (2, 1))]
    assert [s["cls"] for s in ddpipe.open_dataset(tmp_path / "d")] == [b"%d" % (i % 3) for i in range(6)]


def test_a_list_files_label_that_is_no_class_index_is_one_line_and_writes_nothing(raw_images: Path,
                                                                                 tmp_path: Path) -> None:
    """Its classes were numbered up to it: 3,000,000,001 names, until memory ran out."""
    files = sorted(raw_images.rglob("*.jpg"))[:3]
    listed = tmp_path / "list.csv"
    listed.write_text(f"{files[0]},0\n{files[1]},1\n{files[2]},3000000000\n")
    proc = run_cli("convert", listed, tmp_path / "out", "--quiet", timeout=120)  # a hang bound
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "list.csv: a label is 3000000000: as a class index, that makes 3,000,000,001 classes" in proc.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
