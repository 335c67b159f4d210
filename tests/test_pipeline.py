"""The Loader in one process: batches follow the plan, resume, early stops and errors."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ddpipe
from ddpipe.errors import CorruptShardError, DdpipeError
from ddpipe.shufflers import SHUFFLE_MODES

from .helpers import make_dataset, started_threads


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("pipe") / "lmdb", "lmdb", [12, 30, 5, 17])


def keys(batches: list[ddpipe.SampleBatch]) -> list[str]:
    return [s["__key__"] for b in batches for s in b]


@pytest.mark.parametrize("mode", ["none", "local", "partial", "global"])
def test_batches_follow_the_plan(data: Path, mode: str) -> None:
    loader = ddpipe.EncodedStream(data, 8, shuffle=mode, seed=4, buffer_size=10)
    loader.set_epoch(2)
    got = list(loader)
    assert len(got) == len(loader) == 8 and all(len(b) == 8 for b in got[:-1]) and len(got[-1]) == 64 - 56
    expected = [f"s/{g:06d}" for g in loader.plan().ranks[0].order]
    assert keys(got) == expected
    assert sorted(keys(got)) == [f"s/{i:06d}" for i in range(64)]


def test_state_of_another_dataset_is_refused(data: Path, tmp_path: Path) -> None:
    other = make_dataset(tmp_path / "o", "wds", [10])
    state = ddpipe.EncodedStream(other, 4).state_dict()
    with pytest.raises(DdpipeError, match="dataset of 10 samples"):
        ddpipe.EncodedStream(data, 4).load_state_dict(state)


def test_breaking_early_stops_the_producer(data: Path) -> None:
    loader = ddpipe.EncodedStream(data, 2, shuffle="partial", prefetch=2)
    for _ in loader:
        break  # must not hang, and the loader stays usable
    assert len(keys(list(loader))) == 64


def producers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ddpipe-producer")]


@pytest.mark.parametrize("leave", ["close", "drop"])
def test_reading_starts_when_the_epoch_is_asked_for_and_stops_when_left_before_its_first_batch(
        data: Path, leave: str) -> None:
    """iter() starts the epoch's reading, so what the caller does before taking the first batch
    overlaps it; batches closed or let go of before any was taken stop it all the same."""
    stream = ddpipe.EncodedStream(data, 4, shuffle="partial")
    for _ in range(2):
        batches = iter(stream)
        assert producers() == ["ddpipe-producer-0"]
        if leave == "close":
            batches.close()
        del batches
        assert producers() == []
    assert len(keys(list(stream))) == 64 and producers() == []


def test_the_loader_reads_while_it_makes_its_decoder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Making the decoder (DALI's import and pipeline: half a second) overlaps reading the first batch,
    and a decoder that cannot be made leaves no reading behind."""
    import ddpipe.decoding
    from ddpipe.synth import encode_jpeg, render_image

    data = tmp_path / "wds"
    ddpipe.write_dataset(data, ({"__key__": f"s/{i}", "jpg": encode_jpeg(render_image(i, seed=1, long_side=32)),
                                 "cls": b"0"} for i in range(16)), samples_per_shard=8, classes=["a"])

    make = ddpipe.decoding.make_decoder
    reading: list[list[str]] = []
    started = started_threads(monkeypatch)  # started, not alive: four batches may all be read by then

    def seen(*args: Any) -> Any:
        reading.append([name for name in started if name.startswith("ddpipe-producer")])
        return make(*args)

    monkeypatch.setattr(ddpipe.decoding, "make_decoder", seen)
    loader = ddpipe.Loader(data, 4, decoder="pil", device="cpu", decode=ddpipe.DecodeOptions(size=8, threads=1))
    assert len(list(loader)) == 4 and reading == [["ddpipe-producer-0"]]
    loader.close()

    def fails(*args: Any) -> Any:
        raise DdpipeError("no decoder here")

    monkeypatch.setattr(ddpipe.decoding, "make_decoder", fails)
    loader = ddpipe.Loader(data, 4, decoder="pil", device="cpu", decode=ddpipe.DecodeOptions(size=8, threads=1))
    with pytest.raises(DdpipeError, match="no decoder here"):
        next(iter(loader))
    assert producers() == []


def test_unknown_decoder_is_refused(data: Path) -> None:
    with pytest.raises(DdpipeError, match="decoder must be one of"):
        ddpipe.Loader(data, 4, decoder="opencv")


def test_a_corrupt_shard_reaches_the_consumer(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "wds", "wds", [6, 6])
    shard = root / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[3072:3584] = bytes(512)  # a member header zeroed in the middle: the same size, a shorter archive
    shard.write_bytes(bytes(data))
    (root / "shard-000001.idx").unlink()  # and the index must be rebuilt from the damaged headers
    loader = ddpipe.EncodedStream(root, 4, shuffle="none")
    with pytest.raises(CorruptShardError, match=r"shard-000001\.tar"):
        list(loader)


def test_plan_is_cached_per_epoch(data: Path) -> None:
    loader = ddpipe.EncodedStream(data, 4, seed=3)
    a = loader.plan()
    assert loader.plan() is a
    loader.set_epoch(1)
    assert not np.array_equal(loader.plan().ranks[0].order, a.ranks[0].order)


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("uneven") / "wds", "wds", [37, 5, 60, 18, 44, 1, 29])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shuffle=st.sampled_from(SHUFFLE_MODES), buffer_size=st.integers(0, 80), round_size=st.integers(1, 50),
       batch_size=st.integers(1, 20), seed=st.integers(0, 1000), epoch=st.integers(0, 3))
def test_the_consumer_holds_at_most_one_shuffle_buffer(uneven: Path, shuffle: str, buffer_size: int, round_size: int,
                                                       batch_size: int, seed: int, epoch: int) -> None:
    ld = ddpipe.EncodedStream(uneven, batch_size, shuffle=shuffle, buffer_size=buffer_size,
                       round_size=round_size, seed=seed, prefetch=4)
    ld.set_epoch(epoch)
    assert sum(len(b) for b in ld) == 194
    bound = buffer_size if shuffle in ("local", "partial") else 0  # none and global yield in read order
    group = 4  # samples handed over at a time: prefetch's
    assert ld.stats.held_peak <= max(bound - 1, 0) + group - 1


def test_memory_grows_with_neither_the_epochs_nor_the_dataset(tmp_path: Path) -> None:
    """Peak memory of an epoch (Python's allocations, samples included) is set by the bounded stages."""
    import tracemalloc

    def peaks(n: int, epochs: int) -> list[int]:
        root = make_dataset(tmp_path / f"d{n}", "wds", [50] * (n // 50), payload=20_000)
        ld = ddpipe.EncodedStream(root, 10, shuffle="local", buffer_size=64, prefetch=16)
        out = []
        for e in range(epochs):
            ld.set_epoch(e)
            tracemalloc.start()
            for _ in ld:  # each batch let go of at once, as a training loop does
                pass
            out.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        return out

    small, large = peaks(300, 6), peaks(1200, 2)
    assert max(small[1:]) < 1.2 * small[1]  # epoch 6 peaks where epoch 2 did
    assert max(large) < 1.5 * max(small)  # 4x the data, not 4x the memory
    # what is held: about a shuffle buffer, a prefetch queue and a batch of samples (with room for their
    # per-object overhead), not the dataset's 6 or 24 MB (a tar shard is mapped, not read into a buffer)
    assert max(large) < 2 * (64 + 16 + 10) * 20_000


def test_a_loader_or_stream_pickled_is_one_error_naming_it(data: Path) -> None:
    """Sent to another process (torch.multiprocessing.spawn's arguments, a DataLoader's dataset under
    spawn), pickle's own error named an attribute deep inside: 'cannot pickle mappingproxy'."""
    import pickle

    stream = ddpipe.EncodedStream(data, 8)
    loader = ddpipe.Loader(data, 8, decoder="pil", device="cpu", size=16, resize_shorter=16)
    try:
        for thing, name in [(stream, "EncodedStream"), (loader, "Loader"), (loader.decoding, "DecodeStage")]:
            with pytest.raises(DdpipeError, match=rf"^a ddpipe\.{name} cannot be pickled or sent to another process "
                                                  r"\(.*\): make one in the process that iterates it$"):
                pickle.dumps(thing)
        assert pickle.loads(pickle.dumps(stream.dataset)).manifest == stream.dataset.manifest  # what crosses
    finally:
        loader.close()
