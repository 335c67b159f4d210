"""A decompression bomb (a few hundred bytes whose header says 30,000 x 30,000) is a bad sample in
every decoder, in convert and in verify: named under on_error="fail", skipped and counted under
"skip", refused from its header before any pixel is decoded."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import ddpipe
from ddpipe.decode import DecodeOptions
from ddpipe.errors import SampleError

from ..conftest import run_cli
from .images import labelled_samples


def bomb(width: int = 30_000, height: int = 30_000) -> bytes:
    """A small JPEG with its frame header's size rewritten: what a decoder would allocate for."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(buf, format="JPEG")
    data = bytearray(buf.getvalue())
    sof = data.index(b"\xff\xc0")  # baseline frame: marker, length (2), precision (1), height (2), width (2)
    data[sof + 5: sof + 7] = height.to_bytes(2, "big")
    data[sof + 7: sof + 9] = width.to_bytes(2, "big")
    return bytes(data)


def bombed_dataset(root: Path) -> Path:
    samples = labelled_samples(12, np.random.default_rng(3))
    samples[4]["jpg"] = bomb()
    ddpipe.write_dataset(root, iter(samples), samples_per_shard=6)
    return root


def options(decoder: str, **kw: object) -> DecodeOptions:
    return DecodeOptions(decoder=decoder, device="cpu", size=16, resize_shorter=16, dtype="uint8", threads=1,
                         **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("decoder", ["dali-cpu", "pil"])
def test_a_bomb_is_a_bad_sample_in_every_decoder(tmp_path: Path, decoder: str, train: bool) -> None:
    root = bombed_dataset(tmp_path / "ds")
    # from ddpipe's own header check, or PIL's when it opens the image (past twice its own limit)
    with pytest.raises(SampleError, match=r"30000 x 30000 pixels, over the limit|900000000 pixels\) exceeds") as info:
        list(ddpipe.Loader(root, 4, decode=options(decoder, train=train), shuffle="none"))
    assert info.value.key == "img/0004"
    skipping = ddpipe.Loader(root, 4, decode=options(decoder, train=train), shuffle="none", on_error="skip")
    batches = list(skipping)
    assert [len(y) for _, y in batches] == [4, 4, 4] and skipping.stats.skipped == 1
    assert [k for k, _, _ in skipping.stats.skipped_samples] == ["img/0004"]


def test_the_limit_is_an_option(tmp_path: Path) -> None:
    root = bombed_dataset(tmp_path / "ds")
    low = ddpipe.Loader(root, 4, decode=options("dali-cpu", max_pixels=10_000), shuffle="none", on_error="skip")
    assert [len(y) for _, y in low] == [4, 4, 4]
    assert 1 < low.stats.skipped < 12  # images of 60-200 pixels a side: some over 10,000 pixels
    with pytest.raises(ValueError, match="max_pixels"):
        DecodeOptions(max_pixels=0)


def test_convert_and_verify_name_the_bomb_in_one_line(raw_images: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(raw_images, src)
    target = next(iter(sorted(src.rglob("*.jpg"))))
    target.write_bytes(bomb())
    proc = run_cli("convert", src, tmp_path / "out", "--quiet")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(target) in proc.stderr and ("over the limit" in proc.stderr or "exceeds limit" in proc.stderr)
    skipped = run_cli("convert", src, tmp_path / "out-skip", "--quiet", "--on-error", "skip")
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout + skipped.stderr
    root = bombed_dataset(tmp_path / "ds")
    report = run_cli("verify", root, "--decode", "--quiet")
    assert report.returncode == 1 and "Traceback" not in report.stderr
    assert "'img/0004'" in report.stderr and ("over the limit" in report.stderr or "exceeds limit" in report.stderr)
