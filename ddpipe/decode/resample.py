"""Resampling decoded crops into a batch on the CPU, with torch's vectorised uint8 kernels.

DALI decodes on the CPU as fast as libjpeg-turbo allows, but its CPU resize is scalar: on this
machine it took ~0.8 ms per ImageNet-sized crop, as long as decoding the crop itself, and capped
DALI's own CPU pipeline at half the raw decode limit. torch's antialiased bilinear resize of uint8
images (AVX2) does the same work in ~0.22 ms (benchmarks/loader.py compares the
two whole pipelines). So on the CPU, DALI decodes the crop's region of interest and this
module resizes, flips and normalises, one slice of the batch per thread; torch's kernels release
the GIL. On the GPU, DALI does it all.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

from .ring import BatchRing
from .spec import DecodeOptions


def resized(crop: np.ndarray, height: int, width: int, antialias: bool, flip: bool = False) -> torch.Tensor:
    """One HxWx3 uint8 image resized (bilinear, antialiased unless told not to) and flipped if asked:
    3 x height x width uint8."""
    x = torch.from_numpy(np.asarray(crop)).permute(2, 0, 1).unsqueeze(0)
    y = F.interpolate(x, size=(height, width), mode="bilinear", antialias=antialias, align_corners=False)[0]
    return y.flip(-1) if flip else y


def resize_crop(crop: np.ndarray, size: int, antialias: bool, flip: bool) -> np.ndarray:
    """:func:`resized` to size x size, as HxWx3 numpy (what the PIL workers hand back)."""
    return resized(crop, size, size, antialias, flip).permute(1, 2, 0).contiguous().numpy()


class Resampler:
    """Crops (HxWx3 uint8, any size) -> one NCHW batch of ``options.size``, flipped and normalised,
    one slice of the batch per thread, into a :class:`BatchRing`'s batch, handed out on ``device``."""

    def __init__(self, options: DecodeOptions, threads: int, device: torch.device | None = None) -> None:
        self.options = options
        self.threads = max(1, threads)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ddpipe-resample")
        self.ring = BatchRing(options, device)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.ring.clear()

    def __call__(self, crops: Sequence[np.ndarray], flips: np.ndarray) -> torch.Tensor:
        out = self.ring.take(len(crops))
        n = len(crops)
        step = -(-n // self.threads)
        chunks = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
        for f in [self._pool.submit(self._fill, crops, flips, out, lo, hi) for lo, hi in chunks]:
            f.result()
        return self.ring.handed_out(out)

    def _fill(self, crops: Sequence[np.ndarray], flips: np.ndarray, out: torch.Tensor, lo: int, hi: int) -> None:
        o, s = self.options, self.options.size
        for i in range(lo, hi):
            if o.train:
                y = resized(crops[i], s, s, o.antialias, bool(flips[i]))
            else:  # the shorter side to resize_shorter, then the centre
                h, w = crops[i].shape[:2]
                scale = o.resize_shorter / min(h, w)
                nh, nw = max(o.resize_shorter, round(h * scale)), max(o.resize_shorter, round(w * scale))
                top, left = (nh - s) // 2, (nw - s) // 2
                y = resized(crops[i], nh, nw, o.antialias)[:, top : top + s, left : left + s]
            self.ring.fill(out[i], y)
