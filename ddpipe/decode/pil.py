"""``decode="pil"``: the fallback where DALI cannot be installed. A pool of worker processes decodes
with PIL in draft mode: libjpeg-turbo scales by 1/2, 1/4 or 1/8 while decoding, as far as the crop
still covers the output size (measured on the synth set: see benchmarks/loader.py). Each image's
crop and flip come from (seed, epoch, global sample index) as in every decoder (augment.py), so
output does not depend on which worker decodes it. Crops are resized with torch, as on the DALI
path, and written straight into a shared-memory batch; the parent normalises into a reused batch.
Together these took the fallback from 436 to ~700 images/s (float32, 2 cores)."""

from __future__ import annotations

import contextlib
import io
import math
import os
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from multiprocessing.shared_memory import SharedMemory

import numpy as np
from PIL import Image

from .augment import random_crops
from .resample import resize_crop
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
            box = (round(left * sx), round(top * sy), round((left + w) * sx), round((top + h) * sy))
            crop = np.asarray(img.convert("RGB").crop(box))
            # torch's vectorised resize, as on the DALI path: PIL's took ~0.76 ms a crop, torch's ~0.22
            return resize_crop(crop, size, options.antialias, flip)
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


Chunk = tuple[list[bytes], list[int], DecodeOptions, int, int, str | None, int]


def _decode_many(args: Chunk) -> list[np.ndarray | str | None]:
    """Decode a chunk of a batch. With ``shm`` (a shared-memory batch), each image is written to its
    row there and ``None`` comes back; else the image itself (pickled back to the parent)."""
    datas, indices, options, seed, epoch, shm, first = args
    out: list[np.ndarray | str | None] = []
    block, rows = _attach(shm, options) if shm is not None else (None, None)
    try:
        for j, (data, index) in enumerate(zip(datas, indices, strict=True)):
            try:
                image = decode_one(data, options, seed, epoch, index)
            except (OSError, ValueError, SyntaxError) as e:  # reported per sample, not as a dead pool
                out.append(f"{type(e).__name__}: {e}")
                continue
            if rows is not None:
                rows[first + j] = image
                out.append(None)
            else:
                out.append(image)
    finally:
        del rows
        if block is not None:
            block.close()
    return out


def _attach(name: str, options: DecodeOptions) -> tuple[SharedMemory, np.ndarray]:
    block = SharedMemory(name)
    try:  # the parent owns it: this process's exit must not unlink it (Python < 3.13 tracks attachments)
        from multiprocessing import resource_tracker

        resource_tracker.unregister(block._name, "shared_memory")  # type: ignore[attr-defined]
    except (ImportError, AttributeError, KeyError):
        pass
    s = options.size
    return block, np.ndarray((block.size // (s * s * 3), s, s, 3), dtype=np.uint8, buffer=block.buf)


def _one_thread() -> None:
    """A worker is one of ``workers`` processes: torch's own threads would only oversubscribe the cores.
    PIL's arrays are read-only and torch only reads them: its warning about that is noise here."""
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class PilPool:
    """Worker processes decoding batches; a batch is split into one chunk per worker. Workers write
    images into a shared-memory batch (a ring of three) rather than pickling them back: the parent
    spent more time unpickling 150 KB images than the workers did decoding them."""

    RING = 3  # two batches in flight, one being collected

    def __init__(self, options: DecodeOptions, batch_size: int) -> None:
        self.options = options
        self.batch_size = batch_size
        self._pool = ProcessPoolExecutor(options.workers, mp_context=get_context("spawn"), initializer=_one_thread)
        self._ring: list[SharedMemory] | None = None
        self._turn = 0

    def _rows_bytes(self) -> int:
        return self.batch_size * self.options.size * self.options.size * 3

    def _block(self) -> SharedMemory | None:
        """The next shared-memory batch, or None where /dev/shm lacks room (a full tmpfs would kill
        a worker with SIGBUS mid-write: images are pickled back instead)."""
        if self._ring is None:
            try:
                shm = os.statvfs("/dev/shm")
                free = shm.f_bavail * shm.f_frsize
            except OSError:
                free = 0
            room = free >= 2 * self.RING * self._rows_bytes()
            self._ring = [SharedMemory(create=True, size=self._rows_bytes()) for _ in range(self.RING)] if room else []
        if not self._ring:
            return None
        self._turn += 1
        return self._ring[self._turn % self.RING]

    def submit(self, datas: list[bytes], indices: list[int], seed: int,
               epoch: int) -> tuple[list[Future[list[np.ndarray | str | None]]], np.ndarray | None]:
        """The chunks' futures, and the rows (a view of shared memory) the images land in, if any."""
        block = self._block()
        name = block.name if block is not None else None
        n = self.options.workers
        step = max(1, math.ceil(len(datas) / n))
        futures = [self._pool.submit(_decode_many, (datas[i : i + step], indices[i : i + step], self.options, seed,
                                                    epoch, name, i))
                   for i in range(0, len(datas), step)]
        s = self.options.size
        rows = np.ndarray((self.batch_size, s, s, 3), dtype=np.uint8, buffer=block.buf) if block is not None else None
        return futures, rows

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for block in self._ring or []:
            with contextlib.suppress(BufferError):  # a view of it is still about: the mapping goes with it
                block.close()
            block.unlink()
        self._ring = None
