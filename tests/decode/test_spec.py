from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpipe.decode import DecodeOptions
from ddpipe.decode.spec import random_resized_crop
from ddpipe.sample import label_of


@given(st.integers(1, 2000), st.integers(1, 2000), st.integers(0, 2**32))
def test_crop_lies_inside_the_image_with_bounded_area_and_ratio(w: int, h: int, seed: int) -> None:
    left, top, cw, ch = random_resized_crop(w, h, (0.08, 1.0), (3 / 4, 4 / 3), np.random.default_rng(seed))
    assert left >= 0 and top >= 0 and cw > 0 and ch > 0 and left + cw <= w and top + ch <= h


def test_crop_statistics_follow_the_scale_range() -> None:
    rng = np.random.default_rng(0)
    areas = [cw * ch / (500 * 375) for _, _, cw, ch in (random_resized_crop(500, 375, (0.08, 1.0), (3 / 4, 4 / 3), rng)
                                                        for _ in range(2000))]
    assert min(areas) >= 0.07 and max(areas) <= 1.0 and 0.4 < float(np.mean(areas)) < 0.6


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="dtype"):
        DecodeOptions(dtype="int16")
    with pytest.raises(ValueError, match="resize_shorter"):
        DecodeOptions(size=224, resize_shorter=200)


@pytest.mark.parametrize(("given", "says"), [
    ({"scale": 0.5}, "scale must be (low, high)"),  # unpacked: "cannot unpack non-iterable float"
    ({"scale": ("a", "b")}, "scale must be (low, high)"),  # compared: TypeError
    ({"ratio": (1.0, float("inf"))}, "ratio must be (low, high) with 0 < low <= high, finite"),
    ({"flip": "0.5"}, "flip is a probability"),  # compared: TypeError
    ({"flip": True}, "flip is a probability"),  # was taken as 1: every image flipped
    ({"std": (1, 1, None)}, "mean and std must be three finite numbers"),  # compared: TypeError
])
def test_a_transform_option_of_the_wrong_kind_is_refused_naming_it(given: dict[str, object], says: str) -> None:
    from ddpipe.errors import OptionError

    with pytest.raises(OptionError) as refused:
        DecodeOptions(**given)  # type: ignore[arg-type]
    assert str(refused.value).startswith(says)
    assert DecodeOptions(scale=[0.2, 1], flip=np.float32(0.25)).flip == np.float32(0.25)  # type: ignore[arg-type]


def test_labels() -> None:
    assert label_of({"cls": b" 7\n"}) == 7 and label_of({"jpg": b""}) == -1
    with pytest.raises(ValueError):
        label_of({"cls": b"cat"})
