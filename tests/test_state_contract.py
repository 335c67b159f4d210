"""One state contract, one test: save, restore and compare, run against every stage of the loader."""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from pathlib import Path

import pytest
import torch

import ddpipe
from ddpipe import DecodeOptions, DecodeStage, EncodedStream, Loader
from ddpipe.synth import encode_jpeg, render_image

from .state_contract import check_save_load_state

MODES = ["none", "local", "partial", "global"]
# the evaluation transform: each sample's pixels are the same in whatever batch it comes, so a decoded
# image names its sample
DECODE = DecodeOptions(decoder="dali-cpu", device="cpu", train=False, size=16, resize_shorter=16, dtype="uint8",
                       threads=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("state") / "wds"
    ddpipe.write_dataset(root, ({"__key__": f"s/{i:03d}", "jpg": encode_jpeg(render_image(i, seed=4, long_side=48)),
                                 "cls": b"%d" % (i % 3)} for i in range(45)), samples_per_shard=8)
    return root


def keys(batch: ddpipe.SampleBatch) -> list[Hashable]:
    return [s["__key__"] for s in batch]


def images(batch: tuple[torch.Tensor, torch.Tensor]) -> list[Hashable]:
    return [(hashlib.sha1(x.numpy().tobytes()).hexdigest(), int(y)) for x, y in zip(*batch, strict=True)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cut", [1, 3])
def test_encoded_stream(data: Path, mode: str, cut: int) -> None:
    check_save_load_state(lambda: EncodedStream(data, 4, shuffle=mode, seed=2, buffer_size=6), keys, cut)


@pytest.mark.parametrize("mode", ["local", "partial"])
def test_decode_stage(data: Path, mode: str) -> None:
    """The decoder takes batches ahead of its caller: the state counts those the caller received."""
    check_save_load_state(lambda: DecodeStage(EncodedStream(data, 4, shuffle=mode, seed=2), DECODE), images, 5)


@pytest.mark.parametrize("mode", MODES)
def test_loader(data: Path, mode: str) -> None:
    check_save_load_state(lambda: Loader(data, 4, decode=DECODE, shuffle=mode, seed=2), images, 2)


def test_decoded_images_name_their_samples(data: Path) -> None:
    """What the decoded stages' checks rest on: no two samples decode to the same image."""
    seen = [i for b in Loader(data, 4, decode=DECODE, shuffle="none") for i in images(b)]
    assert len(set(seen)) == len(seen) == 45
