"""``decode="pil"``: the fallback where DALI cannot be installed. A pool of worker processes decodes
with PIL in draft mode: libjpeg-turbo scales by 1/2, 1/4 or 1/8 while decoding, as far as the crop
still covers the output size (measured on the synth set: see benchmarks/loader.py). Each image's
crop and flip come from (seed, epoch, global sample index) as in every decoder (augment.py), so
output does not depend on which worker decodes it."""

from __future__ import annotations

import io
import math
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np
from PIL import Image

from .augment import random_crops
from .spec import DecodeOptions


def decode_one(data: bytes, options: DecodeOptions, seed: int, epoch: int, index: int) -> np.ndarray:
    """One image, transformed, as HxWx3 uint8. Raises OSError/ValueError if it does not decode."""
    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
        size = options.size
        if options.train:
            c = random_crops(seed, epoch, np.array([index]), np.array([width]), np.array([height]), options)
            left, top, w, h, flip = int(c.left[0]), int(c.top[0]), int(c.width[0]), int(c.height[0]), bool(c.flip[0])
            # decode at the smallest DCT scale at which the crop still covers the output
            img.draft("RGB", (math.ceil(width * size / w), math.ceil(height * size / h)))
            sx, sy = img.size[0] / width, img.size[1] / height
            box = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
            out = img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR, box=box)
            if flip:
                out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        else:
            short = options.resize_shorter
            scale = short / min(width, height)
            img.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
            rgb = img.convert("RGB")
            new_w, new_h = max(short, round(width * scale)), max(short, round(height * scale))
            rgb = rgb.resize((new_w, new_h), Image.Resampling.BILINEAR)
            left, top = (new_w - size) // 2, (new_h - size) // 2
            out = rgb.crop((left, top, left + size, top + size))
        return np.asarray(out, dtype=np.uint8)


def _decode_many(args: tuple[list[bytes], list[int], DecodeOptions, int, int]) -> list[np.ndarray | str]:
    datas, indices, options, seed, epoch = args
    out: list[np.ndarray | str] = []
    for data, index in zip(datas, indices, strict=True):
        try:
            out.append(decode_one(data, options, seed, epoch, index))
        except (OSError, ValueError, SyntaxError) as e:  # reported per sample, not as a dead pool
            out.append(f"{type(e).__name__}: {e}")
    return out


class PilPool:
    """Worker processes decoding batches; a batch is split into one chunk per worker."""

    def __init__(self, options: DecodeOptions) -> None:
        self.options = options
        self._pool = ProcessPoolExecutor(options.workers, mp_context=get_context("spawn"))

    def submit(self, datas: list[bytes], indices: list[int], seed: int,
               epoch: int) -> list[Future[list[np.ndarray | str]]]:
        n = self.options.workers
        step = max(1, math.ceil(len(datas) / n))
        return [self._pool.submit(_decode_many, (datas[i : i + step], indices[i : i + step], self.options, seed, epoch))
                for i in range(0, len(datas), step)]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
