"""Opening, reading and checking datasets, and the one-line errors users see for bad ones."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import ddpipe
from ddpipe.convert import ConvertOptions, convert, write_dataset
from ddpipe.dataset import OPEN_SHARDS, Dataset
from ddpipe.errors import CorruptShardError, ManifestError, MissingShardError
from ddpipe.formats import FORMAT_NAMES
from ddpipe.reading import read_samples
from ddpipe.sample import owned
from ddpipe.verify import verify_dataset

from .conftest import run_cli
from .helpers import make_dataset, shard_file


@pytest.fixture(params=["wds", "hdf5", "lmdb"])
def dataset(request: pytest.FixtureRequest, raw_images: Path, tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    convert(raw_images, out, ConvertOptions(format=request.param, samples_per_shard=6, progress=False))
    return out


def one_line_error(*args: object) -> str:
    proc = run_cli(*map(str, args))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith(("verify", "\r"))]
    assert lines, proc.stderr
    return "\n".join(lines)


def test_open_dataset(dataset: Path) -> None:
    ds = ddpipe.open_dataset(dataset)
    assert len(ds) == 24 and len(ds.manifest.shards) == 4
    samples = list(ds)
    assert len(samples) == 24 and len({s["__key__"] for s in samples}) == 24
    assert list(ds.iter_shard(1)) == samples[6:12]
    assert list(ds.iter_shard(1, start=4)) == samples[10:12]


def test_reading_with_views_gives_the_same_samples_and_they_outlive_the_read(dataset: Path) -> None:
    """``views=True`` (what the exchange reads with) may hand out views of a mapped shard: the same
    bytes as a plain read, in the same order, still valid once every shard has been closed."""
    import numpy as np

    ds = ddpipe.open_dataset(dataset)
    indices = np.random.default_rng(0).permutation(len(ds))[: len(ds) - 3]
    plain = list(read_samples(ds, indices))
    viewed = list(read_samples(ds, indices, views=True))
    assert [owned(s) for s in viewed] == plain
    assert all(isinstance(v, bytes) for s in plain for k, v in s.items() if k != "__key__")
    # ddpipe's shards give their fields in place (DALI reads them there, no copy made): LMDB's as views
    # of LMDB's own mapping, which they hold open
    assert all(isinstance(v, memoryview) for s in viewed for k, v in s.items() if k != "__key__")


def record_reads_ahead(ds: ddpipe.Dataset, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """The events of reads of ``ds``, as they come: ("hashed", file, thread) for each shard hashed
    (ahead or not), ("opened", file, how) for each shard opened, how being "here" (nothing made
    ahead), "ahead" (read through the mapping made ahead) or "mapped again"; the caller adds its own."""
    import threading

    from ddpipe import reading
    from ddpipe.formats.mapped import HashedFile, ShardMapping, hash_mapped

    events: list[tuple[str, str, str]] = []
    opened = ds.open_shard

    def recording_hash(mapping: ShardMapping, keep: bool) -> HashedFile:
        events.append(("hashed", mapping.path.name, threading.current_thread().name))
        return hash_mapped(mapping, keep)

    def recording_open(shard: int, store: object = None, *, verify: bool = False,
                       hashed: HashedFile | None = None) -> object:
        reader = opened(shard, store, verify=verify, hashed=hashed)  # type: ignore[arg-type]
        through = "here" if hashed is None else "ahead" if reader.mapped_file() is hashed.mapped else "mapped again"
        events.append(("opened", ds.manifest.shards[shard].file, through))
        return reader

    monkeypatch.setattr(reading, "hash_mapped", recording_hash)
    monkeypatch.setattr(ds, "open_shard", recording_open)
    return events


def test_unchecked_reads_page_the_next_shard_in_while_reading_one(dataset: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Read unchecked, a later shard read from its first sample is paged in whole on a thread of its
    own (by hashing it, as a checked read would), before its first sample, and its reader reads
    through that mapping (LMDB's: LMDB's own). A later shard read from a later sample is advised to
    the kernel instead, so that a cold shard's I/O overlaps the work on the one before. Neither while
    a slow-source model counts the reads. (A checked read: below.)"""
    import os

    import numpy as np

    from ddpipe.throttle import SourceLimits

    advised: list[str] = []
    advise = os.posix_fadvise

    def recording_advise(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED:
            advised.append(os.readlink(f"/proc/self/fd/{fd}"))
        advise(fd, offset, length, advice)

    ds = ddpipe.open_dataset(dataset)
    events = record_reads_ahead(ds, monkeypatch)
    monkeypatch.setattr(os, "posix_fadvise", recording_advise)
    names = [ds.manifest.shards[k].file for k in (2, 0, 3)]
    files = [str(shard_file(dataset, k).resolve()) for k in (0, 3)]
    order = np.concatenate([np.arange(12, 18), np.arange(0, 6), np.arange(20, 24)])  # shards 2, 0, 3 from its 3rd
    for i, _ in enumerate(read_samples(ds, order, verify=False)):
        events.append(("sample", str(min(i // 6, 2)), ""))
    paged = [(name, thread) for kind, name, thread in events if kind == "hashed"]
    through = [e[1:] for e in events if e[0] == "opened"]
    assert through == [(names[0], "here"), (names[1], "ahead"), (names[2], "here")]
    assert [name for name, _ in paged] == [names[1]] and paged[0][1].startswith("ddpipe-page-ahead")
    assert events.index(("opened", names[1], "ahead")) < events.index(("sample", "1", ""))
    assert advised == files[1:]
    advised.clear()
    events.clear()
    assert len(list(read_samples(ds, order, verify=False, limits=SourceLimits()))) == 16
    assert advised == [] and not [e for e in events if e[0] == "hashed"]


def test_checked_reads_check_the_next_shard_while_reading_one(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checked read hashes each later shard on a thread of its own, asked for when the shard
    before starts (when it runs is the scheduler's), and opens the shard with that hash, checked,
    before any of its own samples is handed out, reading through the mapping that was hashed (the
    reading thread pages nothing in again)."""
    import numpy as np

    ds = ddpipe.open_dataset(dataset)
    events = record_reads_ahead(ds, monkeypatch)
    order = np.concatenate([np.arange(12, 18), np.arange(0, 6), np.arange(18, 24)])  # shards 2, 0, 3
    for i, _ in enumerate(read_samples(ds, order)):
        events.append(("sample", str(i // 6), ""))
    names = [ds.manifest.shards[k].file for k in (2, 0, 3)]
    ahead = "ahead"  # every format's reader reads through the mapping hashed (LMDB's: LMDB's own)
    assert [e[1:] for e in events if e[0] == "opened"] == [(names[0], "here"), (names[1], ahead),
                                                           (names[2], ahead)]
    hashed = {name: thread for kind, name, thread in events if kind == "hashed"}
    assert set(hashed) == set(names[1:]) and all(t.startswith("ddpipe-check-ahead") for t in hashed.values())
    for run in (1, 2):
        assert events.index(("opened", names[run], ahead)) < events.index(("sample", str(run), ""))


def test_a_checked_read_stops_at_a_damaged_shard_and_leaves_none_open(dataset: Path) -> None:
    """The shard checked ahead is damaged: the samples before it come, then an error naming it and
    none of its samples; a read left early, with a shard opening ahead, leaves no file open but the
    mappings the dataset keeps, which go with it."""
    import gc
    import os

    import numpy as np

    from ddpipe.errors import ChecksumMismatchError

    gc.collect()  # an earlier test's streams, kept mappings and all, go now, not while this one counts
    fds = len(os.listdir("/proc/self/fd"))
    ds = ddpipe.open_dataset(dataset)
    reading = read_samples(ds, np.arange(len(ds)))
    next(reading)
    reading.close()
    # but the mapping of the shard hashed ahead, kept for the next epoch (a descriptor each: mapped.py)
    assert len(os.listdir("/proc/self/fd")) == fds + len(ds.format.kept)
    victim = shard_file(dataset, 2)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    got = []
    with pytest.raises(ChecksumMismatchError, match=victim.name):
        for sample in read_samples(ds, np.arange(len(ds))):
            got.append(sample["__key__"])
    assert len(got) == 12
    del ds
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == fds


def shard_opens(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The shards that Dataset.open_shard opens from now on, as they are opened."""
    opened: list[int] = []
    real = Dataset.open_shard

    def counted(self: Dataset, shard: int, *args: object, **kwargs: object) -> object:
        opened.append(shard)
        return real(self, shard, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Dataset, "open_shard", counted)
    return opened


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_a_random_read_of_a_share_of_each_shard_opens_each_once_however_many_it_reads_between(
        fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's share of a global shuffle comes back to each shard a sample or two at a time, past
    many others: the readers of shards checked sample by sample (their mappings hold the pages read
    alone) stay open past ``OPEN_SHARDS``, where the files stay, and each shard is opened once."""
    shards = OPEN_SHARDS + 4
    root = make_dataset(tmp_path / fmt, fmt, [6] * shards)
    dataset = ddpipe.open_dataset(root)
    opened = shard_opens(monkeypatch)
    share = [6 * k + p for p in (0, 3) for k in range(shards)]  # two of each shard's six, a round apart
    got = [s["__key__"] for s in read_samples(dataset, np.array(share), random_access=True)]
    assert got == [f"s/{i:06d}" for i in share]
    assert sorted(opened) == list(range(shards))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_a_random_read_keeps_the_shards_it_keeps_mapped_open_and_reopens_others_past_open_shards(
        fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A global shuffle on one rank reads all of every shard, a sample at a time, each checked whole:
    a reader whose mapping is kept (as a loader keeps them for the next epoch) holds nothing the
    kept mapping does not, and stays open; without kept mappings, each holds its file's pages, and
    no more than ``OPEN_SHARDS`` stay open, the others reopened as their samples come."""
    shards = OPEN_SHARDS + 4
    root = make_dataset(tmp_path / fmt, fmt, [6] * shards)
    opened = shard_opens(monkeypatch)
    every = np.array([6 * k + p for p in range(6) for k in range(shards)])  # a round of all shards, six times
    for keep_mapped, opens in ((True, shards), (False, 6 * shards)):
        opened.clear()
        got = [s["__key__"] for s in read_samples(ddpipe.open_dataset(root), every, random_access=True,
                                                 keep_mapped=keep_mapped)]
        assert got == [f"s/{i:06d}" for i in every]
        assert len(opened) == opens and set(opened) == set(range(shards))


def test_missing_shard(dataset: Path) -> None:
    shard = shard_file(dataset, 2)
    shard.unlink()
    with pytest.raises(MissingShardError, match=shard.name):
        ddpipe.open_dataset(dataset)
    assert shard.name in one_line_error("inspect", dataset)
    assert "missing" in one_line_error("verify", dataset, "--quiet")


def test_truncated_shard(dataset: Path) -> None:
    shard = shard_file(dataset, 1)
    shard.write_bytes(shard.read_bytes()[:-700])
    with pytest.raises(CorruptShardError, match="truncated"):
        ddpipe.open_dataset(dataset)
    msg = one_line_error("verify", dataset, "--quiet")
    assert shard.name in msg and "truncated" in msg


def test_checksum_mismatch(dataset: Path) -> None:
    shard = shard_file(dataset, 3)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    shard.write_bytes(bytes(data))
    report = verify_dataset(dataset, progress=False)
    assert not report.ok and len(report.problems) == 1 and "checksum mismatch" in report.problems[0]
    msg = one_line_error("verify", dataset, "--quiet")
    assert shard.name in msg and "checksum mismatch" in msg


def test_foreign_or_broken_index_json(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text('{"shards": []}')
    with pytest.raises(ManifestError, match="not a ddpipe manifest"):
        ddpipe.open_dataset(tmp_path)
    assert "not a ddpipe manifest" in one_line_error("inspect", tmp_path)
    (tmp_path / "index.json").write_text("{not json")
    assert "not valid JSON" in one_line_error("verify", tmp_path)
    (tmp_path / "index.json").unlink()
    assert "no index.json" in one_line_error("inspect", tmp_path)


def test_verify_decode_names_a_corrupt_image(raw_copy: Path, tmp_path: Path) -> None:
    victim = sorted(raw_copy.rglob("*.jpg"))[5]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 3])  # a JPEG cut short: its header still parses
    convert(raw_copy, tmp_path / "ds", ConvertOptions(format="lmdb", samples_per_shard=6, progress=False,
                                                       decode_check=False))  # converted as it is
    assert run_cli("verify", tmp_path / "ds", "--quiet").returncode == 0  # checksums are fine
    msg = one_line_error("verify", tmp_path / "ds", "--decode", "--quiet")
    assert victim.stem in msg and "does not decode" in msg and "shard-000000.lmdb" in msg


def test_verify_names_each_sample_whose_label_is_no_class_of_the_dataset(tmp_path: Path) -> None:
    """A label the loader would stop at (or skip), found before a training run meets it."""
    from .decode.images import fewer_names_than_labels

    root, unnamed = fewer_names_than_labels(tmp_path / "d", 3)
    report = verify_dataset(root, progress=False)
    assert sorted(p.split("sample ")[1].split("'")[1] for p in report.problems) == sorted(unnamed)
    assert all("is outside the dataset's 3 classes (0 to 2)" in p and "shard-00000" in p for p in report.problems)
    proc = run_cli("verify", root, "--quiet")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_verify_names_label_runs_that_are_not_the_samples_own(raw_images: Path, tmp_path: Path, fmt: str) -> None:
    """``plan`` scores shuffles by the manifest's label runs and ``train`` sizes its model by them:
    runs that were not the samples' labels (a hand-edited or damaged index.json) passed verify."""
    convert(raw_images, tmp_path / "ds", ConvertOptions(format=fmt, samples_per_shard=12, progress=False))
    assert verify_dataset(tmp_path / "ds", progress=False).ok
    doc = json.loads((tmp_path / "ds" / "index.json").read_text())
    first = doc["shards"][0]
    (cls, n), (other, _) = first["labels"][:2]  # the first shard's first two classes, each run 6 samples
    first["labels"][1][0] = cls
    (tmp_path / "ds" / "index.json").write_text(json.dumps(doc))
    report = verify_dataset(tmp_path / "ds", progress=False)
    assert len(report.problems) == 1, report.problems
    key = sorted(raw_images.glob("*/*"))[n].relative_to(raw_images).with_suffix("")
    assert report.problems[0] == f"{tmp_path / 'ds' / first['file']}: index.json's labels disagree with the " \
        f"samples': sample '{key}' is class {other}, they say {cls} (and {first['labels'][1][1] - 1} more)"
    assert run_cli("verify", tmp_path / "ds", "--quiet").returncode == 1


def test_verify_decode_names_each_sample_without_an_image(tmp_path: Path) -> None:
    """The loader stops at (or skips) such a sample; verify --decode had passed, decoding nothing."""
    from .decode.images import labelled_samples

    samples = labelled_samples(6, np.random.default_rng(2))
    samples[4]["png"] = samples[4].pop("jpg")  # another image format: still an image
    samples[2]["txt"] = samples[2].pop("jpg")
    samples[5]["jpg"] = b"not an image at all"  # PIL's words named its buffer's address, other each run
    write_dataset(tmp_path / "d", iter(samples), samples_per_shard=3)
    assert verify_dataset(tmp_path / "d", progress=False).ok  # without --decode: every byte checks
    report = verify_dataset(tmp_path / "d", decode=True, progress=False)
    assert report.decoded == 4
    assert report.problems == [f"{tmp_path / 'd' / 'shard-000000.tar'}: sample 'img/0002': no image field among "
                               "['cls', 'txt']",
                               f"{tmp_path / 'd' / 'shard-000001.tar'}: sample 'img/0005' field 'jpg' does not "
                               "decode: not an image: no image format recognises it"]


def test_verify_reports_a_shard_it_may_not_read_and_checks_the_rest(tmp_path: Path) -> None:
    """It stopped at the first such shard: the others went unchecked."""
    import shutil
    import sys

    from .conftest import launch
    from .helpers import as_a_user_file_modes_refuse, make_dataset

    as_user = as_a_user_file_modes_refuse()
    root = make_dataset(tmp_path / "d", "wds", [5, 5, 5, 5])
    shutil.copy(root / "shard-000000.tar", root / "shard-000003.tar")  # damaged too: found all the same
    for k in (1, 2):
        (root / f"shard-00000{k}.tar").chmod(0)
    proc = launch([*as_user, sys.executable, "-m", "ddpipe", "verify", str(root), "--quiet"], timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert [ln for ln in lines if "Permission denied" in ln] == [f"ddpipe: {root}/shard-00000{k}.tar: Permission "
                                                                 "denied" for k in (1, 2)]
    assert any("shard-000003.tar" in ln and "checksum mismatch" in ln for ln in lines), lines


def test_verify_decode_accepts_png_grayscale_cmyk(tmp_path: Path) -> None:
    raw = tmp_path / "raw" / "a"
    raw.mkdir(parents=True)
    for name, mode, fmt in [("g.jpg", "L", "JPEG"), ("c.jpg", "CMYK", "JPEG"), ("p.png", "RGBA", "PNG")]:
        buf = io.BytesIO()
        Image.new(mode, (32, 24)).save(buf, format=fmt)
        (raw / name).write_bytes(buf.getvalue())
    m = convert(tmp_path / "raw", tmp_path / "ds", ConvertOptions(progress=False))
    assert m.fields == ("cls", "jpg", "png")
    proc = run_cli("verify", tmp_path / "ds", "--decode", "--quiet", check=True)
    assert "3 images decoded" in proc.stdout


def test_inspect(dataset: Path) -> None:
    proc = run_cli("inspect", dataset, "--json", check=True)
    doc = json.loads(proc.stdout)
    assert doc["samples"] == 24 and doc["shards"] == 4 and doc["num_classes"] == 3
    assert doc["fields"]["cls"]["count"] == 24 and doc["fields"]["jpg"]["min"] > 1000
    text = run_cli("inspect", dataset, check=True).stdout
    assert "samples   24" in text and "jpg" in text


def test_damaged_dali_index_is_reported(raw_images: Path, tmp_path: Path) -> None:
    convert(raw_images, tmp_path / "ds", ConvertOptions(samples_per_shard=6, progress=False))
    idx = tmp_path / "ds" / "shard-000001.idx"
    idx.write_text(idx.read_text().replace(" 1536 ", " 2048 ", 1))  # a wrong offset, still parseable
    msg = one_line_error("verify", tmp_path / "ds", "--quiet")
    assert "shard-000001.idx" in msg and "disagrees" in msg
    idx.write_bytes(b"\x98\x00garbage")
    with pytest.raises(CorruptShardError, match="bad DALI index"):
        list(ddpipe.open_dataset(tmp_path / "ds"))


@pytest.fixture(scope="module")
def uneven_sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A dataset of shards of uneven sizes (one of a single sample) in each format, made once."""
    root = tmp_path_factory.mktemp("uneven")
    return {fmt: make_dataset(root / fmt, fmt, [5, 1, 7, 3]) for fmt in ("wds", "hdf5", "lmdb")}


@settings(max_examples=60, deadline=None)
@given(fmt=st.sampled_from(["wds", "hdf5", "lmdb"]), indices=st.lists(st.integers(0, 15), max_size=40),
       random_access=st.booleans(), views=st.booleans())
def test_a_read_gives_the_samples_at_the_indices_asked_in_their_order(uneven_sets: dict[str, Path], fmt: str,
                                                                      indices: list[int], random_access: bool,
                                                                      views: bool) -> None:
    """Any order a plan may ask for (runs within a shard, positions going back, a shard left and come
    back to, repeats), read sequentially (each run one scan) or at random: each sample asked for,
    whole, in the order asked, set against the dataset read through once."""
    ds = ddpipe.open_dataset(uneven_sets[fmt])
    every = list(ds)
    got = [owned(s) for s in read_samples(ds, np.array(indices, dtype=np.int64), random_access=random_access,
                                          views=views)]
    assert got == [every[i] for i in indices]
