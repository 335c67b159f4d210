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

from .spec import DecodeOptions

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}


def _storage_users(t: torch.Tensor) -> int:
    """How many tensors, views and arrays still hold ``t``'s memory (``t`` itself counts one); a
    large number where torch cannot say, so that nothing is reused unsafely."""
    count = getattr(torch._C, "_storage_Use_Count", None)  # private, but the only exact answer
    if count is None:
        return 1 << 30
    return int(count(t.untyped_storage()._cdata)) - 1  # less the temporary storage wrapper


def resized(crop: np.ndarray, height: int, width: int, antialias: bool, flip: bool = False) -> torch.Tensor:
    """One HxWx3 uint8 image resized (bilinear, antialiased unless told not to) and flipped if asked:
    3 x height x width uint8."""
    x = torch.from_numpy(np.asarray(crop)).permute(2, 0, 1).unsqueeze(0)
    y = F.interpolate(x, size=(height, width), mode="bilinear", antialias=antialias, align_corners=False)[0]
    return y.flip(-1) if flip else y


def resize_crop(crop: np.ndarray, size: int, antialias: bool, flip: bool) -> np.ndarray:
    """:func:`resized` to size x size, as HxWx3 numpy (what the PIL workers hand back)."""
    return resized(crop, size, size, antialias, flip).permute(1, 2, 0).contiguous().numpy()


class BatchRing:
    """Output batches (N x 3 x size x size, the options' dtype and layout) from a small ring, each
    reused only once nothing else refers to it: a fresh 150 MB float32 batch costs ~38,000 page
    faults to fill, ~40 ms on one core per 256 images. A shorter batch (an epoch's last) is the front
    of a released larger one rather than a batch of its own: one fresh batch and one ring entry fewer."""

    def __init__(self, options: DecodeOptions) -> None:
        self.options = options
        self._ring: list[torch.Tensor] = []
        self.mean = (torch.tensor(options.mean, dtype=torch.float32) * 255).view(3, 1, 1)
        self.inv_std = (1.0 / (255.0 * torch.tensor(options.std, dtype=torch.float32))).view(3, 1, 1)

    def clear(self) -> None:
        self._ring.clear()

    def take(self, n: int) -> torch.Tensor:
        """A batch to fill; hand the caller ``batch.detach()`` (a second tensor on the same memory), so
        that the ring sees when the caller lets go."""
        s, dtype = self.options.size, TORCH_DTYPES[self.options.dtype]
        for t in self._ring:
            if t.shape[0] >= n and _storage_users(t) == 1:
                return t[:n]
        # not a permuted view: a view also holds its base, and the ring saw a channels-last batch in use forever
        layout = torch.channels_last if self.options.channels_last else torch.contiguous_format
        t = torch.empty((n, 3, s, s), dtype=dtype, memory_format=layout)
        if len(self._ring) >= 4:  # the consumer holds on to more than a few: stop caching
            self._ring.pop(0)
        self._ring.append(t)
        return t

    def fill(self, out: torch.Tensor, images: torch.Tensor) -> None:
        """``out`` (from :meth:`take`) = uint8 NCHW ``images``, normalised unless the output is uint8."""
        if self.options.dtype == "uint8":
            out.copy_(images)
        elif self.options.dtype == "float32":
            torch.sub(images, self.mean, out=out)
            out.mul_(self.inv_std)
        else:  # float16: normalised in float32, rounded once
            out.copy_((images - self.mean).mul_(self.inv_std))


class Resampler:
    """Crops (HxWx3 uint8, any size) -> one NCHW batch of ``options.size``, flipped and normalised,
    one slice of the batch per thread, into a :class:`BatchRing`'s batch."""

    def __init__(self, options: DecodeOptions, threads: int) -> None:
        self.options = options
        self.threads = max(1, threads)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ddpipe-resample")
        self._ring = BatchRing(options)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._ring.clear()

    def __call__(self, crops: Sequence[np.ndarray], flips: np.ndarray) -> torch.Tensor:
        out = self._ring.take(len(crops))
        n = len(crops)
        step = -(-n // self.threads)
        chunks = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
        for f in [self._pool.submit(self._fill, crops, flips, out, lo, hi) for lo, hi in chunks]:
            f.result()
        return out.detach()  # a second tensor on the same memory: the ring sees when the caller lets go

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
            self._ring.fill(out[i], y)
