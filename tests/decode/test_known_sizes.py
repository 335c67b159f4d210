"""Image sizes remembered across epochs (KnownSizes): the same batches, sizes and reports as reading
every header each epoch, with each good header read once."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from ddpipe.decode import DecodeOptions, augment
from ddpipe.decode import batches as batches_module
from ddpipe.decode.batches import EncodedBatch, KnownSizes, checked_headers

OPTS = DecodeOptions(size=16, resize_shorter=18, max_pixels=60 * 60)


def _image(width: int, height: int, fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (width, height, 7)).save(buf, format=fmt)
    return buf.getvalue()


# what a sample's bytes may be: images of several sizes and formats, one over the pixel limit, and bytes
# that are no image at all
VERSIONS = [_image(12, 9), _image(30, 17), _image(9, 40, "PNG"), _image(61, 61), b"not an image", b"\xff\xd8\xff"]


def _checked(batch: EncodedBatch, known: KnownSizes | None) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    reported: list[int] = []
    kept, sizes = checked_headers(batch, OPTS, lambda g, s, why: reported.append(g), known)
    return kept.indices, [(int(w), int(h)) for w, h in sizes], reported


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 40), st.integers(0, len(VERSIONS) - 1)), max_size=12),
                min_size=1, max_size=8))
def test_remembered_sizes_give_what_reading_every_header_gives(epochs: list[list[tuple[int, int]]]) -> None:
    """Each epoch is one batch of (global index, bytes): a sample may come back with other bytes (an
    unchecked shard rewritten between epochs), bad, or over the pixel limit."""
    known = KnownSizes()
    for batch in epochs:
        assert _checked(_made(batch), known) == _checked(_made(batch), None)


def _made(batch: list[tuple[int, int]]) -> EncodedBatch:
    return EncodedBatch([g for g, _ in batch], [{"__key__": str(g)} for g, _ in batch],
                        [VERSIONS[v] for _, v in batch], [0] * len(batch))


def test_a_good_header_is_read_once_and_a_bad_one_every_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[bytes] = []
    real = augment.image_size

    def counted(data: bytes | memoryview) -> tuple[int, int]:
        read.append(bytes(data))
        return real(data)

    monkeypatch.setattr(batches_module, "image_size", counted)
    known = KnownSizes()
    good, bad = VERSIONS[0], VERSIONS[4]
    for _ in range(3):
        batch = EncodedBatch([3, 1000, 7], [{"__key__": k} for k in "abc"], [good, good, bad], [0, 0, 0])
        assert _checked(batch, known) == ([3, 1000], [(12, 9), (12, 9)], [7])
    assert read == [good, good, bad, bad, bad]
    # the same index with other bytes (another length) is read again
    batch = EncodedBatch([3], [{"__key__": "a"}], [VERSIONS[1]], [0])
    assert _checked(batch, known) == ([3], [(30, 17)], [])
    assert read[-1] == VERSIONS[1]
