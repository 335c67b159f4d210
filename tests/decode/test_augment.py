"""The training transform's random choices: pure, per sample, torchvision's distribution."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from ddpipe.decode import DecodeOptions
from ddpipe.decode.augment import image_size, random_crops, uniforms
from ddpipe.decode.spec import random_resized_crop

OPTS = DecodeOptions()


@given(st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 3000)), min_size=1, max_size=40),
       st.integers(0, 2**40), st.integers(0, 1000))
def test_crops_lie_inside_the_image_within_scale_and_ratio(sizes: list[tuple[int, int]], seed: int, epoch: int) -> None:
    w, h = np.array(sizes).T
    c = random_crops(seed, epoch, np.arange(len(sizes)) * 7919, w, h, OPTS)
    assert (c.width > 0).all() and (c.height > 0).all()
    assert (c.left >= 0).all() and (c.top >= 0).all()
    assert (c.left + c.width <= w).all() and (c.top + c.height <= h).all()
    assert (c.width * c.height <= w * h).all()


def test_a_sample_crops_the_same_whatever_batch_it_is_in() -> None:
    indices = np.array([5, 90, 1234, 7])
    w, h = np.array([500, 333, 640, 120]), np.array([375, 500, 480, 90])
    whole = random_crops(3, 2, indices, w, h, OPTS)
    for i in range(4):
        alone = random_crops(3, 2, indices[i : i + 1], w[i : i + 1], h[i : i + 1], OPTS)
        assert (alone.left[0], alone.top[0], alone.width[0], alone.height[0], alone.flip[0]) == \
            (whole.left[i], whole.top[i], whole.width[i], whole.height[i], whole.flip[i])


def test_seed_and_epoch_change_the_draws_and_nothing_else_does() -> None:
    idx = np.arange(1000)
    a = uniforms(1, 0, idx, 4)
    assert np.array_equal(a, uniforms(1, 0, idx, 4))
    assert not np.allclose(a, uniforms(2, 0, idx, 4)) and not np.allclose(a, uniforms(1, 1, idx, 4))
    assert a.min() >= 0.0 and a.max() < 1.0 and abs(a.mean() - 0.5) < 0.02  # uniform on [0, 1)


def test_the_distribution_is_torchvisions() -> None:
    """Against spec.random_resized_crop, a line-by-line port of torchvision's RandomResizedCrop."""
    n = 20000
    c = random_crops(0, 0, np.arange(n), np.full(n, 500), np.full(n, 375), OPTS)
    area = c.width * c.height / (500 * 375)
    aspect = c.width / c.height
    rng = np.random.default_rng(1)
    ref = np.array([random_resized_crop(500, 375, OPTS.scale, OPTS.ratio, rng) for _ in range(n)])
    ref_area, ref_aspect = ref[:, 2] * ref[:, 3] / (500 * 375), ref[:, 2] / ref[:, 3]
    assert abs(area.mean() - ref_area.mean()) < 0.01 and abs(aspect.mean() - ref_aspect.mean()) < 0.01
    assert abs(np.median(area) - np.median(ref_area)) < 0.02
    assert area.min() >= 0.075 and area.max() <= 1.0
    assert aspect.min() >= 0.74 and aspect.max() <= 1.35
    assert abs(c.flip.mean() - 0.5) < 0.02
    # left edges spread over the whole room the crop leaves
    room = 500 - c.width
    assert (c.left <= room).all() and abs(float((c.left / np.maximum(room, 1)).mean()) - 0.5) < 0.03


def test_an_image_no_crop_fits_gets_its_centre_at_the_nearest_ratio() -> None:
    c = random_crops(0, 0, np.array([0]), np.array([1000]), np.array([10]), OPTS)
    assert (c.width[0], c.height[0]) == (13, 10) and c.left[0] == (1000 - 13) // 2 and c.top[0] == 0


def test_image_size_reads_headers() -> None:
    for fmt in ("JPEG", "PNG"):
        buf = io.BytesIO()
        Image.new("RGB", (37, 21)).save(buf, format=fmt)
        assert image_size(buf.getvalue()) == (37, 21)
    with pytest.raises(ValueError, match="not an image"):
        image_size(b"definitely not a jpeg")


def test_a_batchs_headers_are_read_without_an_import_per_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU path's feed reads every JPEG's header at the GPU's pace: an import statement run per
    image (one that failed, searching every path each time) cost an H200 more than half its rate."""
    import builtins

    from ddpipe.decode.batches import EncodedBatch, with_crops

    buf = io.BytesIO()
    Image.new("RGB", (64, 48)).save(buf, format="JPEG")
    jpeg = buf.getvalue()
    real_import = builtins.__import__

    def imports_while_reading(n: int) -> int:
        calls = 0

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal calls
            calls += 1
            return real_import(*args, **kwargs)

        batch = EncodedBatch(list(range(n)), [{"__key__": str(i)} for i in range(n)], [jpeg] * n, [0] * n)
        monkeypatch.setattr(builtins, "__import__", counted)
        try:
            crops = with_crops(batch, 0, 0, OPTS, None).crops
        finally:
            monkeypatch.setattr(builtins, "__import__", real_import)
        assert crops is not None and len(crops.width) == n
        return calls

    imports_while_reading(4)  # anything imported once, on first use
    assert imports_while_reading(64) == imports_while_reading(8)
