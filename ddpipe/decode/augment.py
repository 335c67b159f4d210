"""The training transform's random choices: each sample's crop window and flip.

Pure functions of (seed, epoch, global sample index, image size): every decoder (DALI on the CPU or
the GPU, PIL) crops a sample the same way whichever rank, batch or worker it lands in, a resumed
run repeats the uninterrupted one, and the DALI pipeline can live across epochs (its own random
operators could only be seeded once, when it is built).

Draws come from a counter-based generator (SplitMix64 over the index, vectorised in numpy): one
``np.random.Generator`` per sample cost ~15 us, a batch's worth of these ~50 us in all.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import simplejpeg

from ..seeding import AUGMENT
from .jpeg_header import jpeg_size
from .spec import NOT_AN_IMAGE, DecodeOptions

_ATTEMPTS = 10  # torchvision's RandomResizedCrop
_DRAWS = 2 * _ATTEMPTS + 3  # area and aspect per attempt, then left, top, flip
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out: np.ndarray = x ^ (x >> np.uint64(31))
        return out


def uniforms(seed: int, epoch: int, indices: np.ndarray, draws: int) -> np.ndarray:
    """(len(indices), draws) floats in [0, 1), determined by (seed, epoch, index) alone."""
    key = _splitmix64(np.array([seed & (2**64 - 1)], dtype=np.uint64) ^ np.uint64(AUGMENT))
    key = _splitmix64(key ^ np.uint64(epoch & (2**64 - 1)))
    with np.errstate(over="ignore"):
        counters = (np.asarray(indices, dtype=np.uint64)[:, None] * np.uint64(draws)
                    + np.arange(draws, dtype=np.uint64)[None, :])
        bits = _splitmix64(_splitmix64(counters ^ key))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class Crops:
    """Each sample's crop window (pixels) and whether to flip it."""

    left: np.ndarray
    top: np.ndarray
    width: np.ndarray
    height: np.ndarray
    flip: np.ndarray


def random_crops(seed: int, epoch: int, indices: np.ndarray, widths: np.ndarray, heights: np.ndarray,
                 options: DecodeOptions) -> Crops:
    """torchvision's RandomResizedCrop and RandomHorizontalFlip, for a batch at once: up to ten
    tries at a random area and aspect ratio that fit, else the centre at the nearest allowed ratio."""
    widths, heights = np.asarray(widths, dtype=np.int64), np.asarray(heights, dtype=np.int64)
    u = uniforms(seed, epoch, indices, _DRAWS)
    area = (widths * heights)[:, None].astype(np.float64)
    lo, hi = np.log(options.ratio[0]), np.log(options.ratio[1])
    target = area * (options.scale[0] + u[:, 0:2 * _ATTEMPTS:2] * (options.scale[1] - options.scale[0]))
    aspect = np.exp(lo + u[:, 1:2 * _ATTEMPTS:2] * (hi - lo))
    w = np.round(np.sqrt(target * aspect)).astype(np.int64)
    h = np.round(np.sqrt(target / aspect)).astype(np.int64)
    fits = (w > 0) & (w <= widths[:, None]) & (h > 0) & (h <= heights[:, None])
    first = np.argmax(fits, axis=1)
    found = fits[np.arange(len(first)), first]
    cw, ch = w[np.arange(len(first)), first], h[np.arange(len(first)), first]
    # no try fitted: the whole image, cut to the nearest allowed aspect ratio, centred
    in_ratio = widths / np.maximum(heights, 1)
    fw = np.where(in_ratio < options.ratio[0], widths,
                  np.where(in_ratio > options.ratio[1], np.round(heights * options.ratio[1]).astype(np.int64), widths))
    fh = np.where(in_ratio < options.ratio[0], np.round(widths / options.ratio[0]).astype(np.int64), heights)
    cw, ch = np.where(found, cw, fw), np.where(found, ch, fh)
    left = np.where(found, np.floor(u[:, -3] * (widths - cw + 1)).astype(np.int64), (widths - cw) // 2)
    top = np.where(found, np.floor(u[:, -2] * (heights - ch + 1)).astype(np.int64), (heights - ch) // 2)
    return Crops(left, top, cw, ch, u[:, -1] < options.flip)


def image_size(data: bytes | memoryview) -> tuple[int, int]:
    """(width, height) from the image's header; ValueError if it has none that can be read."""
    # ~2 us, against PIL's ~75: at the GPU's 20,000 images/s, PIL alone would take 1.5 s of every
    # second of the feed's one thread (measured on an H200: 0.25 of DALI's pipeline, against 0.66);
    # read in Python first, holding the interpreter lock, which simplejpeg lets go of (jpeg_header.py)
    size = jpeg_size(data)
    if size is not None:
        return size
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        return int(width), int(height)
    except ValueError:  # not a JPEG: PIL knows the other formats
        pass
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.size
    except UnidentifiedImageError:
        raise ValueError(NOT_AN_IMAGE) from None
    except (OSError, SyntaxError) as e:
        raise ValueError(f"not an image: {e}") from e
