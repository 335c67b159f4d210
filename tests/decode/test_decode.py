"""Decoding: labels match images, documented outputs, determinism, PIL/DALI agreement, bad images."""

from __future__ import annotations

import io
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import ddpipe
from ddpipe.decode import DecodeOptions, normalize
from ddpipe.errors import DdpipeError, SampleError
from ddpipe.sample import Sample

from ..helpers import alive, descendants, started_threads

COLORS = [(230, 20, 20), (20, 230, 20), (20, 20, 230), (230, 230, 20), (20, 230, 230), (230, 20, 230)]
DECODERS = ["dali-cpu", "pil"]


def solid_jpeg(color: tuple[int, int, int], size: tuple[int, int], mode: str = "RGB", fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    img = Image.new("RGB", size, color)
    if mode != "RGB":
        img = img.convert(mode)
    img.save(buf, format=fmt, quality=95)
    return buf.getvalue()


def labelled_samples(n: int, rng: np.random.Generator) -> list[Sample]:
    """Sample i is a solid image of its class's colour: its label can be read back from its pixels."""
    out = []
    for i in range(n):
        c = int(rng.integers(len(COLORS)))
        size = (int(rng.integers(60, 200)), int(rng.integers(60, 200)))
        out.append({"__key__": f"img/{i:04d}", "jpg": solid_jpeg(COLORS[c], size), "cls": b"%d" % c})
    return out


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dec") / "wds"
    ddpipe.write_dataset(root, iter(labelled_samples(40, np.random.default_rng(0))), samples_per_shard=16,
                         classes=[str(c) for c in range(len(COLORS))])
    return root


@pytest.fixture(scope="module")
def natural(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ddpipe.synth import encode_jpeg, render_image

    root = tmp_path_factory.mktemp("nat") / "wds"
    samples = ({"__key__": f"n/{i}", "jpg": encode_jpeg(render_image(i, seed=5, long_side=200)), "cls": b"%d" % (i % 3)}
               for i in range(24))
    ddpipe.write_dataset(root, samples, samples_per_shard=12, classes=["a", "b", "c"])
    return root


def loader(root: Path, decode: str, **kw: object) -> ddpipe.Loader:
    opts = DecodeOptions(size=kw.pop("size", 32), resize_shorter=kw.pop("resize_shorter", 40),  # type: ignore[arg-type]
                         dtype=kw.pop("dtype", "uint8"), train=kw.pop("train", True),  # type: ignore[arg-type]
                         channels_last=kw.pop("channels_last", False), threads=2)  # type: ignore[arg-type]
    kw = {"device": "cpu", "shuffle": "local", "seed": 3, **kw}
    return ddpipe.Loader(root, 8, decoder=decode, decode=opts, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("decode", DECODERS)
def test_labels_match_images(labelled: Path, decode: str) -> None:
    seen = 0
    for images, labels in loader(labelled, decode):
        means = images.float().mean(dim=(2, 3))  # N x 3
        nearest = torch.cdist(means, torch.tensor(COLORS, dtype=torch.float32)).argmin(dim=1)
        assert torch.equal(nearest, labels)
        seen += len(labels)
    assert seen == 40


@pytest.mark.parametrize("decode", DECODERS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8"])
def test_documented_outputs(natural: Path, decode: str, dtype: str) -> None:
    images, labels = next(iter(loader(natural, decode, dtype=dtype, size=48, resize_shorter=56)))
    assert images.shape == (8, 3, 48, 48) and images.device.type == "cpu"
    assert images.dtype == {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}[dtype]
    assert labels.dtype == torch.int64 and labels.shape == (8,) and set(labels.tolist()) <= {0, 1, 2}
    if dtype == "uint8":
        assert images.max() > 100 and images.min() < 100
    else:  # ImageNet-normalised: roughly zero mean, unit spread, within the normalised pixel range
        assert float(images.min()) >= -2.2 and float(images.max()) <= 2.7
        assert abs(float(images.float().mean())) < 1.0 and 0.3 < float(images.float().std()) < 2.0


@pytest.mark.parametrize("decode", DECODERS)
def test_channels_last_and_eval_transform(natural: Path, decode: str) -> None:
    images, _ = next(iter(loader(natural, decode, dtype="float32", channels_last=True)))
    assert images.shape == (8, 3, 32, 32) and images.is_contiguous(memory_format=torch.channels_last)
    evals, _ = next(iter(loader(natural, decode, train=False)))
    again, _ = next(iter(loader(natural, decode, train=False)))
    assert evals.shape == (8, 3, 32, 32) and torch.equal(evals, again)  # no randomness in evaluation


@pytest.mark.parametrize("decode", DECODERS)
def test_same_seed_bit_identical_other_epoch_different(natural: Path, decode: str) -> None:
    a = [x for x, _ in loader(natural, decode)]
    b = [x for x, _ in loader(natural, decode)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    other = loader(natural, decode)
    other.set_epoch(1)
    c = [x for x, _ in other]
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("decode", DECODERS)
def test_a_later_epoch_repeats_after_resume_and_after_an_abandoned_epoch(natural: Path, decode: str) -> None:
    straight = loader(natural, decode)
    list(straight)
    straight.set_epoch(1)
    want = [x for x, _ in straight]
    fresh = loader(natural, decode)  # a resumed job starts at epoch 1
    fresh.set_epoch(1)
    assert all(torch.equal(x, y) for x, y in zip(want, [x for x, _ in fresh], strict=True))
    left = loader(natural, decode)
    next(iter(left))  # epoch 0 abandoned after one batch: what was prefetched must not leak into epoch 1
    left.set_epoch(1)
    assert all(torch.equal(x, y) for x, y in zip(want, [x for x, _ in left], strict=True))
    for ld in (straight, fresh, left):
        ld.close()


def test_one_dali_pipeline_serves_every_epoch_that_ends(natural: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a pipeline is the GPU path's start-up cost (its decoders and buffers): epochs that run
    to their end hand theirs to the next; an abandoned epoch's, holding what it prefetched, goes."""
    from ddpipe.decode.dali import DaliDecoder

    built: list[int] = []
    build = DaliDecoder._pipeline

    def counted(self: DaliDecoder) -> object:
        built.append(1)
        return build(self)

    monkeypatch.setattr(DaliDecoder, "_pipeline", counted)
    fresh = []
    for epoch in range(3):  # each epoch from a loader of its own: a pipeline of its own
        ld = loader(natural, "dali-cpu")
        ld.set_epoch(epoch)
        fresh.append([x for x, _ in ld])
        ld.close()
    built.clear()
    ld = loader(natural, "dali-cpu")
    for epoch in (0, 1, 2, 1):
        ld.set_epoch(epoch)
        assert all(torch.equal(x, y) for x, y in zip([x for x, _ in ld], fresh[epoch], strict=True))
    assert len(built) == 1
    next(iter(ld))  # abandoned after one batch
    ld.set_epoch(2)
    assert all(torch.equal(x, y) for x, y in zip([x for x, _ in ld], fresh[2], strict=True))
    assert len(built) == 2
    ld.close()


def test_the_cpu_paths_first_batch_is_resampled_before_dali_takes_the_next(natural: Path) -> None:
    """On the CPU path DALI decodes and the Resampler resizes, on the same cores. An epoch's first
    batch is resampled before DALI is given the second (which would take half the cores from it),
    on a new pipeline and on one reset for the next epoch; after that one batch is always given to
    DALI before the caller's is resampled, so that decoding runs on while it is."""
    from ddpipe.decode.batches import EncodedBatch
    from ddpipe.decode.dali import DaliDecoder
    from ddpipe.decode.resample import Resampler

    events: list[str] = []

    def on_bad(index: int, sample: object, reason: str) -> None:
        raise AssertionError(reason)

    def given(stream: ddpipe.EncodedStream) -> Iterator[EncodedBatch]:
        for k, b in enumerate(stream):
            events.append(f"given {k}")
            yield EncodedBatch.of(b.indices, b.samples, on_bad)

    stream = ddpipe.EncodedStream(natural, 4, shuffle="none")  # 6 batches
    decoder = DaliDecoder(DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=2), 4,
                          torch.device("cpu"), gpu_decode=False)
    resample = Resampler.__call__

    def recorded(self: Resampler, crops: Any, flips: Any) -> torch.Tensor:
        events.append(f"resampled {len([e for e in events if e.startswith('resampled')])}")
        return resample(self, crops, flips)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Resampler, "__call__", recorded)
        for epoch in range(2):
            events.clear()
            decoded = decoder.decode(given(stream), 0, epoch, on_bad)
            next(decoded)
            assert events == ["given 0", "resampled 0", "given 1"]
            next(decoded)
            assert events[3:] == ["given 2", "resampled 1"]
            assert len(list(decoded)) == 4
    decoder.close()


@pytest.mark.parametrize("decode", DECODERS)
@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_batches_the_caller_holds_are_never_written_again(natural: Path, decode: str, dtype: str) -> None:
    ld = loader(natural, decode, dtype=dtype)
    held = [x for x, _ in ld]  # every batch kept: the decoder's reused buffers must not be among them
    copied = [x.clone() for x, _ in ld]
    assert len({x.data_ptr() for x in held}) == len(held)
    assert all(torch.equal(x, y) for x, y in zip(held, copied, strict=True))


def test_pil_without_room_in_shared_memory_pickles_images_back(labelled: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpipe.decode.pil import PilPool

    monkeypatch.setattr(PilPool, "_rows_bytes", lambda self: 1 << 60)  # more than any /dev/shm holds
    seen = 0
    for images, labels in loader(labelled, "pil"):
        means = images.float().mean(dim=(2, 3))
        assert torch.equal(torch.cdist(means, torch.tensor(COLORS, dtype=torch.float32)).argmin(dim=1), labels)
        seen += len(labels)
    assert seen == 40


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_to_the_process_group_leaves_the_pil_workers_decoding(labelled: Path, sig: int) -> None:
    """A terminal's Ctrl-C, or a launcher's, reaches a rank's decoding workers too, and only the rank
    may decide what it means: workers that took it as their own died mid-batch or mid-reply, and under
    mpiexec, under load, some runs had left the rank waiting for ever on a batch no worker would send.
    So does a scheduler's stop (Slurm signals every process of a job step), which the rank answers
    after its step (ddpipe.distributed.stop_on_signals): workers it had killed broke the rank's pool."""
    before = set(descendants(os.getpid()))
    batches = iter(loader(labelled, "pil"))
    seen = len(next(batches)[1])
    workers = [pid for pid in set(descendants(os.getpid())) - before if "spawn_main" in _cmdline(pid)]
    assert workers  # this loader's pool
    for pid in workers:
        os.kill(pid, sig)
    for images, labels in batches:
        means = images.float().mean(dim=(2, 3))
        assert torch.equal(torch.cdist(means, torch.tensor(COLORS, dtype=torch.float32)).argmin(dim=1), labels)
        seen += len(labels)
    assert seen == 40
    assert all(map(alive, workers))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_pil_and_dali_choose_the_same_crop_windows(tmp_path: Path) -> None:
    """Pixels encode their own position, so an output's mean colour says which window it came from."""
    yy, xx = np.mgrid[0:150, 0:200]
    pixels = np.stack([xx * 255 // 199, yy * 255 // 149, np.full_like(xx, 128)], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=98)
    samples = [{"__key__": f"p/{i}", "jpg": buf.getvalue(), "cls": b"0"} for i in range(16)]
    ddpipe.write_dataset(tmp_path / "pos", iter(samples), samples_per_shard=8)
    means = {}
    for decode in DECODERS:
        x = torch.cat([images for images, _ in loader(tmp_path / "pos", decode)])
        means[decode] = x.float().mean(dim=(2, 3))[:, :2]  # where each crop lies: x and y
    assert means["pil"].std(dim=0).min() > 10  # the windows differ from sample to sample...
    assert torch.allclose(means["pil"], means["dali-cpu"], atol=4.0)  # ...and both decoders chose the same


def test_uint8_then_normalize_matches_float_output(natural: Path) -> None:
    u8, _ = next(iter(loader(natural, "dali-cpu", dtype="uint8")))
    f32, _ = next(iter(loader(natural, "dali-cpu", dtype="float32")))
    assert torch.allclose(normalize(u8), f32, atol=0.03)


def test_pil_and_dali_agree_in_shape_and_statistics(natural: Path) -> None:
    stats = {}
    for decode in DECODERS:
        x = torch.cat([images for images, _ in loader(natural, decode, train=False, size=64, resize_shorter=72)])
        stats[decode] = (x.shape, x.float().mean(dim=(0, 2, 3)), x.float().std())
    assert stats["pil"][0] == stats["dali-cpu"][0]
    assert torch.allclose(stats["pil"][1], stats["dali-cpu"][1], atol=3.0)  # per-channel means, 0-255 scale
    assert abs(float(stats["pil"][2] - stats["dali-cpu"][2])) < 3.0


def png16(level: int, size: tuple[int, int]) -> bytes:
    """A 16-bit grayscale PNG of one level (0 to 65535)."""
    buf = io.BytesIO()
    Image.fromarray(np.full(size[::-1], level, dtype=np.uint16)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("decode", DECODERS)
@pytest.mark.parametrize("train", [True, False])
def test_grayscale_cmyk_png_decode_to_three_channels(tmp_path: Path, decode: str, train: bool) -> None:
    """A 16-bit PNG too (medical and satellite images): PIL's conversion to RGB clipped each level
    past 255 to white, where DALI scales the levels down."""
    samples = [{"__key__": "g", "jpg": solid_jpeg((90, 90, 90), (50, 40), "L"), "cls": b"0"},
               {"__key__": "c", "jpg": solid_jpeg((200, 30, 30), (50, 40), "CMYK"), "cls": b"1"},
               {"__key__": "p", "png": solid_jpeg((30, 200, 30), (50, 40), "RGBA", "PNG"), "cls": b"2"},
               {"__key__": "w", "png": png16(90 * 257, (50, 40)), "cls": b"3"}]
    ddpipe.write_dataset(tmp_path / "d", iter(samples), samples_per_shard=4)
    ld = ddpipe.Loader(tmp_path / "d", 4, decoder=decode, device="cpu", shuffle="none",
                       decode=DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1, train=train))
    images, labels = next(iter(ld))
    assert images.shape == (4, 3, 16, 16) and labels.tolist() == [0, 1, 2, 3]
    means = images.float().mean(dim=(2, 3))
    assert torch.allclose(means[0], torch.tensor([90.0, 90, 90]), atol=6)
    assert means[1].argmax() == 0 and means[2].argmax() == 1  # CMYK red stays red; the PNG is green
    assert torch.allclose(means[3], torch.tensor([90.0, 90, 90]), atol=2), means[3]


def corrupt_dataset(root: Path) -> Path:
    samples = labelled_samples(20, np.random.default_rng(1))
    samples[5]["jpg"] = samples[5]["jpg"][: len(samples[5]["jpg"]) // 2]  # truncated
    samples[13]["jpg"] = b"definitely not a jpeg"
    ddpipe.write_dataset(root, iter(samples), samples_per_shard=8)
    return root


@pytest.mark.parametrize("decode", DECODERS)
def test_corrupt_image_fails_naming_key_and_shard(tmp_path: Path, decode: str) -> None:
    root = corrupt_dataset(tmp_path / "bad")
    with pytest.raises(SampleError, match=r"img/0005.*|img/0013.*") as info:
        list(ddpipe.Loader(root, 4, decoder=decode, device="cpu", shuffle="none",
                           decode=DecodeOptions(size=16, resize_shorter=16, threads=1)))
    assert "shard-00000" in str(info.value) and info.value.key in ("img/0005", "img/0013")


@pytest.mark.parametrize("decode", DECODERS)
def test_corrupt_images_skipped_and_counted_batches_stay_equal(tmp_path: Path, decode: str) -> None:
    root = corrupt_dataset(tmp_path / "bad")
    ld = ddpipe.Loader(root, 4, decoder=decode, device="cpu", shuffle="none", on_error="skip",
                       decode=DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1))
    batches = list(ld)
    assert len(batches) == len(ld) == 5  # every rank still yields the same number of batches
    assert [len(labels) for _, labels in batches] == [4] * 5  # refilled: every batch keeps its size
    assert ld.stats.skipped == 2 and sorted(k for k, _, _ in ld.stats.skipped_samples) == ["img/0005", "img/0013"]
    assert ld.stats.decode.repeated == 2  # the stream ran 2 short: the last batch repeats 2 of its samples
    # said alike by every decoder, with no run's particulars (PIL's named its buffer's address)
    reasons = {k: reason for k, _, reason in ld.stats.skipped_samples}
    assert reasons["img/0013"] == "does not decode: not an image: no image format recognises it", reasons


def fewer_names_than_labels(root: Path, names: int) -> tuple[Path, set[str]]:
    """20 images of classes 0-5 under a manifest that names only the first ``names`` classes and records
    no label runs (which it would refuse): the keys of the samples whose class has no name."""
    samples = labelled_samples(20, np.random.default_rng(1))
    ddpipe.write_dataset(root, iter(samples), samples_per_shard=8)
    doc = json.loads((root / "index.json").read_text())
    doc["classes"] = [str(c) for c in range(names)]
    for shard in doc["shards"]:
        del shard["labels"]
    (root / "index.json").write_text(json.dumps(doc))
    return root, {str(s["__key__"]) for s in samples if int(s["cls"]) >= names}


@pytest.mark.parametrize(("decode", "read_in"), [("pil", "thread"), ("dali-cpu", "thread"), ("dali-cpu", "process")])
def test_a_label_outside_the_named_classes_is_a_bad_sample(tmp_path: Path, decode: str, read_in: str) -> None:
    """A training loss fails on such a label (on a GPU, a device-side assert that names no sample)."""
    root, unnamed = fewer_names_than_labels(tmp_path / "d", 3)
    assert 0 < len(unnamed) < 20

    def loader(on_error: str) -> ddpipe.Loader:
        options = DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1, read_in=read_in)
        return ddpipe.Loader(root, 4, decoder=decode, device="cpu", shuffle="none", on_error=on_error, decode=options)

    with loader("fail") as ld, pytest.raises(SampleError, match=r"cls [3-5] is outside the dataset's 3 ") as info:
        list(ld)
    assert info.value.key in unnamed and "shard-00000" in str(info.value)
    with loader("skip") as ld:
        labels = torch.cat([y for _, y in ld])
    assert len(labels) == 20 and int(labels.max()) < 3  # refilled with named samples
    assert ld.stats.skipped == len(unnamed) and {k for k, _, _ in ld.stats.skipped_samples} == unnamed


@pytest.mark.parametrize("read_in", ["thread", "process"])
def test_where_labels_are_required_a_sample_without_one_is_a_bad_sample(tmp_path: Path, read_in: str) -> None:
    """Without require_labels it comes with label -1, for a loss's ignore_index; with it (ddpipe train's
    loss needs a class for every sample) it is named, or skipped and refilled."""
    samples = labelled_samples(20, np.random.default_rng(1))
    for i in (3, 11):
        del samples[i]["cls"]
    samples[14]["cls"] = b"-1"
    ddpipe.write_dataset(tmp_path / "d", iter(samples), samples_per_shard=8, classes=[str(c) for c in range(6)])
    unlabelled = {"img/0003", "img/0011", "img/0014"}

    def loader(on_error: str, required: bool) -> ddpipe.Loader:
        options = DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1, read_in=read_in,
                                require_labels=required)
        return ddpipe.Loader(tmp_path / "d", 4, decoder="dali-cpu", device="cpu", shuffle="none", on_error=on_error,
                             decode=options)

    with loader("fail", False) as ld:
        assert int((torch.cat([y for _, y in ld]) == -1).sum()) == 3
    with loader("fail", True) as ld, pytest.raises(SampleError, match=r"has no label \(no cls field\)") as info:
        list(ld)
    assert info.value.key == "img/0003"
    with loader("skip", True) as ld:
        labels = torch.cat([y for _, y in ld])
    assert len(labels) == 20 and int(labels.min()) >= 0  # refilled with labelled samples
    assert {k for k, _, _ in ld.stats.skipped_samples} == unlabelled
    assert any("has no label (cls -1)" in why for _, _, why in ld.stats.skipped_samples)


def stops_dali(root: Path) -> Path:
    """20 images, of which img/0006's header reads but its data stops right after it."""
    samples = labelled_samples(20, np.random.default_rng(1))
    data = samples[6]["jpg"]
    scan = data.index(b"\xff\xda")
    samples[6]["jpg"] = data[: scan + 2 + int.from_bytes(data[scan + 2 : scan + 4], "big") + 16]
    ddpipe.write_dataset(root, iter(samples), samples_per_shard=8)
    return root


def test_the_pipeline_rebuilt_after_a_bad_image_serves_the_next_epoch(tmp_path: Path) -> None:
    """An image whose header reads but whose data stops right after it passes the crop window's
    check and stops DALI itself; the decoder finds it, rebuilds its pipeline mid-epoch, and the
    rebuilt one, reset, gives the next epoch the batches a fresh loader gives it."""
    root = stops_dali(tmp_path / "bad")

    def skipping() -> ddpipe.Loader:
        return ddpipe.Loader(root, 4, decoder="dali-cpu", device="cpu", shuffle="local", on_error="skip", seed=1,
                             decode=DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1))

    ld = skipping()
    list(ld)
    ld.set_epoch(1)
    again = [(x.clone(), y.clone()) for x, y in ld]
    fresh = skipping()
    fresh.set_epoch(1)
    want = [(x.clone(), y.clone()) for x, y in fresh]
    assert len(again) == len(want) == 5 and ld.stats.skipped == fresh.stats.skipped == 1
    assert [k for k, _, _ in ld.stats.skipped_samples] == ["img/0006"]  # the last epoch's
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(again, want, strict=True))
    ld.close()
    fresh.close()


def test_the_gpu_paths_feed_prepares_batches_off_the_calling_thread_and_ends_with_the_epoch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU path (its transform graph, run here on DALI's CPU operators) DALI runs on a thread
    of the decoder's, not the caller's, and a batch's headers are read and its crops chosen on the
    feed's own thread (a header that does not read is reported from there); an epoch left early,
    ended, or failed leaves none of these threads behind."""
    import threading

    from ddpipe.decode.batches import EncodedBatch
    from ddpipe.decode.dali import DaliDecoder

    reported_on: dict[str, str] = {}

    def on_bad(index: int, sample: Sample, reason: str) -> None:
        reported_on[str(sample["__key__"])] = threading.current_thread().name

    def ours() -> list[str]:
        return sorted(t.name for t in threading.enumerate()
                      if t.name.startswith(("ddpipe-feed", "ddpipe-dali", "ddpipe-producer")))

    before = ours()
    stream = ddpipe.EncodedStream(corrupt_dataset(tmp_path / "bad"), 4, shuffle="none")
    decoder = DaliDecoder(DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1), 4,
                          torch.device("cpu"), gpu_decode=False, transform_in_dali=True)
    for leave_after in (None, 1):
        started = started_threads(monkeypatch)
        batches = iter(stream)
        decoded = decoder.decode((EncodedBatch.of(b.indices, b.samples, on_bad) for b in batches), 0, 0, on_bad)
        got = [next(decoded)]
        # started, not alive: with the whole epoch in DALI's and the threads' queues, the feed's thread may
        # already have prepared its last batch and ended (a loaded CI machine saw it so)
        assert {"ddpipe-feed", "ddpipe-dali"} <= set(started)
        if leave_after is None:
            got += list(decoded)
            assert len(got) == 5
        decoded.close()
        batches.close()
        assert ours() == before
    # neither header reads (img/0013 is no JPEG, img/0005 stops in its header)
    assert reported_on == {"img/0013": "ddpipe-feed", "img/0005": "ddpipe-feed"}

    def failing(index: int, sample: Sample, reason: str) -> None:
        raise SampleError(reason, key=str(sample["__key__"]))

    batches = iter(stream)
    decoded = decoder.decode((EncodedBatch.of(b.indices, b.samples, failing) for b in batches), 0, 0, failing)
    got = []
    with pytest.raises(SampleError) as info:  # raised on the feed's thread, reaching the caller as it was
        got.extend(decoded)
    assert info.value.key == "img/0005" and len(got) == 1  # after the batch before it (img/0000-0003)
    batches.close()
    assert ours() == before
    decoder.close()


def test_the_gpu_paths_feed_refeeds_a_rebuilt_pipeline_in_order(tmp_path: Path) -> None:
    """On the GPU path (its graph on DALI's CPU operators, batches prepared on the feed's thread), a
    batch that stops DALI is fed again less its bad image to a new pipeline, before the batches the
    thread prepared after it: every other sample comes out once, in the stream's order."""
    from ddpipe.decode.batches import EncodedBatch
    from ddpipe.decode.dali import DaliDecoder

    bad: list[str] = []

    def on_bad(index: int, sample: Sample, reason: str) -> None:
        bad.append(str(sample["__key__"]))

    stream = ddpipe.EncodedStream(stops_dali(tmp_path / "bad"), 4, shuffle="none")
    decoder = DaliDecoder(DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1), 4,
                          torch.device("cpu"), gpu_decode=False, transform_in_dali=True)
    batches = iter(stream)
    labels = [y for _, y in decoder.decode((EncodedBatch.of(b.indices, b.samples, on_bad) for b in batches),
                                           0, 0, on_bad)]
    batches.close()
    decoder.close()
    want = [int(s["cls"]) for s in ddpipe.open_dataset(tmp_path / "bad") if s["__key__"] != "img/0006"]
    assert bad == ["img/0006"] and [len(y) for y in labels] == [4, 3, 4, 4, 4]
    assert torch.cat(labels).tolist() == want


def dali_batches(root: Path, transform_in_dali: bool, **kw: object) -> list[torch.Tensor]:
    """Every batch of an epoch through a DALI CPU decoder whose resize, flip and normalisation are
    the Resampler's (the CPU path) or DALI's own (the graph the GPU path runs after ``mixed``)."""
    from ddpipe.decode.batches import EncodedBatch
    from ddpipe.decode.dali import DaliDecoder

    def on_bad(index: int, sample: object, reason: str) -> None:
        raise AssertionError(reason)

    ld = ddpipe.EncodedStream(root, 8, shuffle="local", seed=3)
    opts = DecodeOptions(size=48, resize_shorter=56, threads=2, **kw)  # type: ignore[arg-type]
    decoder = DaliDecoder(opts, 8, torch.device("cpu"), gpu_decode=False, transform_in_dali=transform_in_dali)
    stream = (EncodedBatch.of(batch.indices, batch.samples, on_bad) for batch in ld)
    out = [x.clone() for x, _ in decoder.decode(stream, 3, 0, on_bad)]
    decoder.close()
    return out


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_the_gpu_paths_transform_matches_the_cpu_paths(natural: Path, train: bool, dtype: str) -> None:
    """Same crop windows, flips, centre crops and normalisation, within what two resizers differ by."""
    ours = dali_batches(natural, False, train=train, dtype=dtype)
    gpu_graph = dali_batches(natural, True, train=train, dtype=dtype)
    assert len(ours) == len(gpu_graph) == 3
    scale = 255.0 if dtype == "uint8" else 1 / 0.226  # the output's whole range, roughly
    for a, b in zip(ours, gpu_graph, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        per_image = ((a.float() - b.float()).abs() / scale).mean(dim=(1, 2, 3))
        assert float(per_image.max()) < 0.01, per_image  # a swapped flip or a shifted window costs 3% or more


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (CI has none; run on the device machine)")


def gpu_loader(root: Path, **kw: object) -> ddpipe.Loader:
    return loader(root, "dali-gpu", device="cuda", **kw)


@needs_cuda
@pytest.mark.parametrize(("read_in", "reads_in"), [("auto", "process"), ("thread", "thread")])
def test_gpu_decoding_lands_on_the_gpu(natural: Path, read_in: str, reads_in: str) -> None:
    """By default the GPU path reads in a process of its own; read in threads, it lands there too."""
    ld = gpu_loader(natural, dtype="float16", read_in=read_in)
    images, labels = next(iter(ld))
    assert images.device.type == "cuda" and labels.device.type == "cuda" and images.dtype == torch.float16
    assert ld.decoding.options.read_in == reads_in
    ld.close()


@needs_cuda
@pytest.mark.parametrize("train", [True, False])
def test_gpu_and_cpu_decoding_give_the_same_batches(natural: Path, train: bool) -> None:
    """Same samples, same crop windows and flips; pixels within what two JPEG decoders and two
    resizers differ by."""
    for dtype in ("uint8", "float32"):
        gpu = [(x.cpu(), y.cpu()) for x, y in gpu_loader(natural, dtype=dtype, train=train, size=48,
                                                          resize_shorter=56)]
        cpu = list(loader(natural, "dali-cpu", dtype=dtype, train=train, size=48, resize_shorter=56))
        assert len(gpu) == len(cpu)
        for (xg, yg), (xc, yc) in zip(gpu, cpu, strict=True):
            assert torch.equal(yg, yc) and xg.shape == xc.shape and xg.dtype == xc.dtype
            scale = 255.0 if dtype == "uint8" else 1 / 0.226  # one pixel step, in the output's units
            diff = (xg.float() - xc.float()).abs() / scale
            assert float(diff.mean()) < 0.02, float(diff.mean())  # 2% of the range on average
            per_image = diff.mean(dim=(1, 2, 3))
            assert float(per_image.max()) < 0.05  # and no image wrong: a swapped crop or flip costs far more


@needs_cuda
@pytest.mark.parametrize("read_in", ["thread", "process"])
def test_gpu_decoding_channels_last_and_bad_images(tmp_path: Path, read_in: str) -> None:
    images, _ = next(iter(gpu_loader(corrupt_dataset(tmp_path / "ok"), dtype="float16", channels_last=True,
                                     on_error="skip", read_in=read_in)))
    assert images.is_contiguous(memory_format=torch.channels_last) and images.device.type == "cuda"
    ld = gpu_loader(corrupt_dataset(tmp_path / "bad"), on_error="skip", shuffle="none", read_in=read_in)
    batches = list(ld)
    # refilled as on the CPU: 18 decodable samples, 2 repeated to keep every batch whole
    assert [len(y) for _, y in batches] == [len(ld.plan().batch(0, b)) for b in range(len(ld))]
    assert ld.stats.skipped == 2 and sorted(k for k, _, _ in ld.stats.skipped_samples) == ["img/0005", "img/0013"]
    assert ld.stats.decode.repeated == 2
    with pytest.raises(SampleError, match=r"img/0005|img/0013"):
        list(gpu_loader(corrupt_dataset(tmp_path / "fail"), shuffle="none", read_in=read_in))


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_shorter_batch_is_written_into_a_released_full_ones_memory(channels_last: bool) -> None:
    from ddpipe.decode.ring import BatchRing

    ring = BatchRing(DecodeOptions(size=8, channels_last=channels_last))
    full = ring.take(16).detach()
    where = full.data_ptr()
    held = ring.take(16).detach()  # the first is still held: a second batch of its own
    assert held.data_ptr() != where
    del full
    last = ring.take(5).detach()  # an epoch's shorter last batch: the front of the released one
    assert last.data_ptr() == where and last.shape[0] == 5
    assert last.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert ring.take(16).data_ptr() not in (where, held.data_ptr())  # both still held: fresh memory


def test_a_batch_that_does_not_fit_in_memory_is_one_clear_error() -> None:
    """Torch's own was a RuntimeError naming its allocator's source file, a traceback from ddpipe train;
    with PIL it came from a worker. 194 TB of float32 is more than a 47-bit address space, even where
    the kernel would promise any amount (vm.overcommit_memory=1)."""
    from ddpipe.decode.ring import BatchRing

    ring = BatchRing(DecodeOptions(size=9000, resize_shorter=9000, dtype="float32"))
    with pytest.raises(DdpipeError, match=r"^a batch of 200000 images of 9000 x 9000 pixels \(194,400.0 GB of "
                                          r"float32\) does not fit in this machine's memory: use a smaller batch or "
                                          r"image size$"):
        ring.take(200_000)


@needs_cuda
def test_a_pinned_batch_is_not_written_again_while_its_copy_to_the_device_may_read_it() -> None:
    from ddpipe.decode.ring import BatchRing

    ring = BatchRing(DecodeOptions(size=8, dtype="uint8"), torch.device("cuda"))
    first = ring.take(16)
    assert first.is_pinned()
    first.fill_(7)
    where = first.data_ptr()
    torch.cuda._sleep(1_000_000_000)  # type: ignore[no-untyped-call]  # the stream is busy for a while: the copy after it is pending
    on_device = ring.handed_out(first)
    del first  # let go while its copy is pending
    pending = ring.take(16)
    assert pending.data_ptr() != where  # its copy may still be reading it
    torch.cuda.synchronize()
    assert bool((on_device == 7).all())
    cached = {where, pending.data_ptr()}
    del pending
    assert ring.take(16).data_ptr() in cached  # copied: its memory is reused, none more is locked


@needs_cuda
@pytest.mark.parametrize("decode", DECODERS)
def test_cpu_decoders_hand_a_cuda_device_the_batches_they_give_the_cpu(natural: Path, decode: str) -> None:
    """Decoded on the CPU into pinned memory and copied to the device without waiting: every batch,
    held by the caller over two epochs, is the CPU's bit for bit (a batch overwritten while its copy
    was pending would differ)."""
    for dtype in ("uint8", "float32"):
        on_cpu, on_gpu = loader(natural, decode, dtype=dtype), loader(natural, decode, dtype=dtype, device="cuda")
        for epoch in (0, 1):
            on_cpu.set_epoch(epoch)
            on_gpu.set_epoch(epoch)
            want = [(x.clone(), y.clone()) for x, y in on_cpu]
            got = list(on_gpu)  # all held: the ring cannot wait on the caller, only on the copies
            assert all(x.device.type == "cuda" for x, _ in got)
            for (xg, yg), (xc, yc) in zip(got, want, strict=True):
                assert torch.equal(xg.cpu(), xc) and torch.equal(yg.cpu(), yc)
        on_cpu.close()
        on_gpu.close()


def test_dali_gpu_delivering_to_the_cpu_is_refused_as_the_loader_is_made(natural: Path) -> None:
    """It was said by the decoder at the first batch: under ``ddpipe train`` after the model was built
    and the banner claimed "dali-gpu decoding on cpu"."""
    with pytest.raises(DdpipeError, match=r"decode='dali-gpu' needs a CUDA device: (CUDA is not available|the "
                                          r"batches go to cpu) \(decode='dali-cpu' decodes on the CPU\)"):
        ddpipe.Loader(natural, 4, decoder="dali-gpu", device="cpu")
