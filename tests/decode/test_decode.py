"""Decoding: labels match images, documented outputs, determinism, PIL/DALI agreement."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import ddpipe
from ddpipe.decode import DecodeOptions, normalize

from .images import (
    COLORS,
    DECODERS,
    loader,
    solid_jpeg,
)


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


@pytest.mark.parametrize(("images", "dtype", "says"), [
    (torch.zeros(2, 3, 8, 8), torch.float32, "normalize takes uint8 images (0-255), not float32: a Loader's float "
     "batches are normalised already (DecodeOptions.dtype)"),
    (torch.zeros(3, 8, 8, dtype=torch.uint8), torch.float32, "normalize takes a batch, N x 3 x H x W, not 3 x 8 x 8"),
    (torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.int32, "normalize makes floats, not int32"),
])
def test_normalize_refuses_what_it_would_get_wrong(images: torch.Tensor, dtype: torch.dtype, says: str) -> None:
    """Each was taken as uint8 NCHW in silence: a float batch the Loader had normalised (its default
    dtype) came out normalised twice, a CHW image as a batch of one, integers truncated."""
    with pytest.raises(ddpipe.OptionError) as refused:
        normalize(images, dtype=dtype)
    assert str(refused.value) == says


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
