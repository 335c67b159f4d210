"""DALI's pipelines: one serving every epoch, rebuilt after a bad image and refed in order, the GPU
path's feed off the calling thread, its transform and batches matching the CPU path's, and where
batches land."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ddpipe
from ddpipe.decode import DecodeOptions
from ddpipe.errors import DdpipeError, SampleError
from ddpipe.sample import Sample

from ..helpers import started_threads
from .images import (
    DECODERS,
    corrupt_dataset,
    loader,
    needs_cuda,
    stops_dali,
)


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
    ld.set_epoch(1)  # again, on purpose
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
            # the decoder's thread runs ahead of the caller: the order of its steps, not when the caller sees them
            assert len(list(decoder.decode(given(stream), 0, epoch, on_bad))) == 6
            assert events[:3] == ["given 0", "resampled 0", "given 1"]
            assert all(events.index(f"given {k + 1}") < events.index(f"resampled {k}") for k in range(1, 5))
    decoder.close()


@pytest.mark.parametrize("transform_in_dali", [True, False], ids=["gpu-path", "resampler"])
def test_dali_and_the_feed_run_off_the_calling_thread_and_end_with_the_epoch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transform_in_dali: bool) -> None:
    """On the GPU path (its transform graph, run here on DALI's CPU operators) and on the CPU path
    (the Resampler after DALI), DALI runs on a thread of the decoder's, not the caller's. A batch's
    headers are read and its crops chosen on the feed's own thread on the GPU path, on DALI's on the
    CPU path (whose cores are busy decoding), never the caller's (a header that does not read is
    reported from there); an epoch left early, ended, or failed leaves none of these threads behind."""
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
    feeding = "ddpipe-feed" if transform_in_dali else "ddpipe-dali"
    stream = ddpipe.EncodedStream(corrupt_dataset(tmp_path / "bad"), 4, shuffle="none")
    decoder = DaliDecoder(DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1), 4,
                          torch.device("cpu"), gpu_decode=False, transform_in_dali=transform_in_dali)
    for leave_after in (None, 1):
        started = started_threads(monkeypatch)
        batches = iter(stream)
        decoded = decoder.decode((EncodedBatch.of(b.indices, b.samples, on_bad) for b in batches), 0, 0, on_bad)
        got = [next(decoded)]
        # started, not alive: with the whole epoch in DALI's and the threads' queues, the feed's thread may
        # already have prepared its last batch and ended (a loaded CI machine saw it so)
        assert {feeding, "ddpipe-dali"} <= set(started)
        if leave_after is None:
            got += list(decoded)
            assert len(got) == 5
        decoded.close()
        batches.close()
        assert ours() == before
    # neither header reads (img/0013 is no JPEG, img/0005 stops in its header)
    assert reported_on == {"img/0013": feeding, "img/0005": feeding}

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


@pytest.mark.parametrize("transform_in_dali", [True, False], ids=["gpu-path", "resampler"])
def test_a_batch_that_stops_dali_is_fed_again_to_a_rebuilt_pipeline_in_order(tmp_path: Path,
                                                                             transform_in_dali: bool) -> None:
    """On the GPU path (its graph on DALI's CPU operators, batches prepared on the feed's thread) and
    the CPU path (the Resampler after DALI), DALI run ahead on a thread of the decoder's, a batch that
    stops DALI is fed again less its bad image to a new pipeline, before the batches prepared after
    it: every other sample comes out once, in the stream's order."""
    from ddpipe.decode.batches import EncodedBatch
    from ddpipe.decode.dali import DaliDecoder

    bad: list[str] = []

    def on_bad(index: int, sample: Sample, reason: str) -> None:
        bad.append(str(sample["__key__"]))

    stream = ddpipe.EncodedStream(stops_dali(tmp_path / "bad"), 4, shuffle="none")
    decoder = DaliDecoder(DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1), 4,
                          torch.device("cpu"), gpu_decode=False, transform_in_dali=transform_in_dali)
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
