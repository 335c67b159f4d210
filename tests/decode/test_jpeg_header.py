"""The JPEG header read in Python gives the size libjpeg-turbo (simplejpeg) gives, and reads nothing
that simplejpeg would refuse: where it answers, the answer is simplejpeg's."""

from __future__ import annotations

import io

import numpy as np
import simplejpeg
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile

from ddpipe.decode.jpeg_header import jpeg_size


def simplejpeg_size(data: bytes) -> tuple[int, int] | None:
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    return int(width), int(height)


def exif_block(**tags: object) -> bytes:
    names = {"orientation": 0x0112, "make": 0x010F}
    block = Image.Exif()
    for name, value in tags.items():
        block[names[name]] = value
    return block.tobytes()


def saved(img: Image.Image, **save: object) -> bytes:
    """``img`` as a JPEG. PIL sizes libjpeg's output buffer from the image and its extra segments, and
    a narrow image with optimised tables and an ICC profile overflows it ("Suspension not allowed
    here"); a larger buffer is PIL's documented way round (ImageFile.MAXBLOCK)."""
    buf = io.BytesIO()
    before, ImageFile.MAXBLOCK = ImageFile.MAXBLOCK, 4 << 20
    try:
        img.save(buf, format="JPEG", **save)
    finally:
        ImageFile.MAXBLOCK = before
    return buf.getvalue()


def jpeg(width: int, height: int, seed: int, **save: object) -> bytes:
    # smooth (coarse noise, scaled up): PIL cannot write optimised tables for a large noisy image
    coarse = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    return saved(Image.fromarray(coarse).resize((width, height)), **save)


@settings(max_examples=200, deadline=None)
@given(width=st.integers(1, 700), height=st.integers(1, 700), seed=st.integers(0, 2**16),
       progressive=st.booleans(), optimize=st.booleans(), subsampling=st.sampled_from([0, 1, 2]),
       quality=st.integers(5, 100), exif=st.booleans(), icc=st.booleans(), grey=st.booleans())
# PIL's own output buffer overflowed writing this one (a narrow image, optimised tables, an ICC profile)
@example(width=4, height=131, seed=0, progressive=False, optimize=True, subsampling=0, quality=95, exif=False,
         icc=True, grey=False)
def test_the_size_is_libjpeg_turbos(width: int, height: int, seed: int, progressive: bool, optimize: bool,
                                     subsampling: int, quality: int, exif: bool, icc: bool, grey: bool) -> None:
    """Baseline and progressive, optimised tables or not, any subsampling, with EXIF and ICC segments
    (an ICC profile here is 70 KB of APP2 segments before the frame), grey or colour."""
    save: dict[str, object] = {"progressive": progressive, "optimize": optimize, "quality": quality}
    if not grey:
        save["subsampling"] = subsampling
    if exif:
        save["exif"] = exif_block(orientation=6, make="ddpipe")  # the orientation is not applied to the size
    if icc:
        save["icc_profile"] = bytes(np.random.default_rng(seed).integers(0, 256, 70_000, dtype=np.uint8))
    data = jpeg(width, height, seed, **save)
    if grey:
        data = saved(Image.open(io.BytesIO(data)).convert("L"), **save)
    assert jpeg_size(data) == simplejpeg_size(data) == (width, height)
    assert jpeg_size(memoryview(data)) == (width, height)  # a shard's view reads the same


def test_a_header_cut_anywhere_is_read_only_where_simplejpeg_reads_it() -> None:
    """Every prefix of a baseline and of a progressive JPEG (an EXIF segment before the frame): where
    the Python read answers, simplejpeg gives the same size; where simplejpeg refuses, so does it
    (the caller then asks simplejpeg, which says why). It answers once the first scan starts."""
    for save in ({"exif": exif_block(make="ddpipe")}, {"progressive": True, "optimize": True}):
        data = jpeg(40, 24, 7, **save)
        scan = data.index(b"\xff\xda")
        answered = 0
        for cut in range(len(data) + 1):
            ours = jpeg_size(data[:cut])
            if ours is not None:
                assert ours == simplejpeg_size(data[:cut]) == (40, 24)
                answered += 1
            elif cut >= scan + 2 + int.from_bytes(data[scan + 2 : scan + 4], "big"):
                raise AssertionError(f"the whole header was there at {cut} bytes, and not read")
        assert answered > 0


def test_what_it_does_not_read_is_left_to_simplejpeg() -> None:
    """Not a JPEG, a frame whose height comes later (DNL), a lossless frame, two frames: None."""
    data = bytearray(jpeg(16, 16, 1))
    sof = data.index(b"\xff\xc0")
    assert jpeg_size(b"\x89PNG\r\n\x1a\n") is None and jpeg_size(b"") is None
    no_height = bytearray(data)
    no_height[sof + 5 : sof + 7] = b"\0\0"
    lossless = bytearray(data)
    lossless[sof + 1] = 0xC3
    segment = data[sof : sof + 2 + int.from_bytes(data[sof + 2 : sof + 4], "big")]
    two_frames = data[:sof] + segment + data[sof:]
    for bad in (no_height, lossless, two_frames):
        assert jpeg_size(bytes(bad)) is None
