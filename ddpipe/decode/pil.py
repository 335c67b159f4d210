"""``decode="pil"``: the fallback where DALI cannot be installed. A pool of worker processes decodes
with PIL in draft mode: libjpeg-turbo scales by 1/2, 1/4 or 1/8 while decoding, as far as the crop
still covers the output size (measured on the synth set: see benchmarks/loader.py). Each image's
crop and flip come from (seed, epoch, global sample index) as in every decoder (augment.py), so
output does not depend on which worker decodes it. Crops are resized with torch, as on the DALI
path, and written straight into a shared-memory batch; the parent normalises into a reused batch.
Together these took the fallback from 436 to ~700 images/s (float32, 2 cores)."""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import weakref
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np
from PIL import Image

from ..memory import shared_memory_left
from ..workers import (
    NameGuard,
    bind_to_parent,
    end_if_importing_parents_script,
    ended_as_they_started,
    start_resource_tracker,
    worker_context,
)
from .augment import random_crops
from .resample import resize_crop
from .spec import DecodeOptions, check_pixels, open_image

_WIDE_GRAY = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def as_rgb(img: Image.Image) -> Image.Image:
    """The image as 8-bit RGB. PIL converts the levels of a 16-bit grayscale image (a 16-bit PNG:
    medical, satellite) by clipping each past 255 to white; DALI scales them down, as this does
    (each level's top byte)."""
    if img.mode in _WIDE_GRAY:
        levels = np.clip(np.asarray(img), 0, 65535).astype(np.uint16)
        return Image.fromarray((levels >> 8).astype(np.uint8), "L").convert("RGB")
    return img.convert("RGB")


def decode_one(data: bytes, options: DecodeOptions, seed: int, epoch: int, index: int) -> np.ndarray:
    """One image, transformed, as HxWx3 uint8. Raises OSError/ValueError if it does not decode."""
    with open_image(data) as img:
        width, height = img.size
        check_pixels(width, height, options.max_pixels)  # from the header, before any pixel is decoded
        size = options.size
        if options.train:
            c = random_crops(seed, epoch, np.array([index]), np.array([width]), np.array([height]), options)
            left, top, w, h, flip = int(c.left[0]), int(c.top[0]), int(c.width[0]), int(c.height[0]), bool(c.flip[0])
            # decode at the smallest DCT scale at which the crop still covers the output
            img.draft("RGB", (math.ceil(width * size / w), math.ceil(height * size / h)))
            sx, sy = img.size[0] / width, img.size[1] / height
            box = (round(left * sx), round(top * sy), round((left + w) * sx), round((top + h) * sy))
            crop = np.asarray(as_rgb(img).crop(box))
            # torch's vectorised resize, as on the DALI path: PIL's took ~0.76 ms a crop, torch's ~0.22
            return resize_crop(crop, size, options.antialias, flip)
        else:
            short = options.resize_shorter
            scale = short / min(width, height)
            img.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
            rgb = as_rgb(img)
            new_w, new_h = max(short, round(width * scale)), max(short, round(height * scale))
            rgb = rgb.resize((new_w, new_h), Image.Resampling.BILINEAR)
            left, top = (new_w - size) // 2, (new_h - size) // 2
            out = rgb.crop((left, top, left + size, top + size))
        return np.asarray(out, dtype=np.uint8)


Chunk = tuple[list[bytes], list[int], DecodeOptions, int, int, str | None, int]

# In each worker process only: the parent's shared-memory batches, mapped once when the worker starts
# (the parent unlinks their names once every worker has mapped them; see PilPool).
_MAPPED: dict[str, tuple[SharedMemory, np.ndarray]] = {}


def _decode_many(args: Chunk) -> list[np.ndarray | str | None]:
    """Decode a chunk of a batch. With ``shm`` (a shared-memory batch this worker mapped), each image
    is written to its row there and ``None`` comes back; else the image itself (pickled back)."""
    datas, indices, options, seed, epoch, shm, first = args
    out: list[np.ndarray | str | None] = []
    rows = _MAPPED[shm][1] if shm in _MAPPED else None
    for j, (data, index) in enumerate(zip(datas, indices, strict=True)):
        try:
            image = decode_one(data, options, seed, epoch, index)
        except (OSError, ValueError, SyntaxError) as e:  # reported per sample, not as a dead pool
            out.append(str(e) or type(e).__name__)  # in the words DALI's path gives, without the class's name
            continue
        if rows is not None:
            rows[first + j] = image
            out.append(None)
        else:
            out.append(image)
    return out


def _start_worker(names: list[str], size: int) -> None:
    _one_thread()
    for name in names:
        with contextlib.suppress(FileNotFoundError):  # already unlinked: this worker pickles images back
            block = SharedMemory(name)
            _MAPPED[name] = (block, np.ndarray((block.size // (size * size * 3), size, size, 3), dtype=np.uint8,
                                               buffer=block.buf))


def _started(pause: float) -> int:
    """Which worker this is; ``pause`` keeps one worker from taking every such task while another is
    still starting."""
    time.sleep(pause)
    return os.getpid()


def _one_thread() -> None:
    """A worker is one of ``workers`` processes: torch's own threads would only oversubscribe the cores.
    PIL's arrays are read-only and torch only reads them: its warning about that is noise here. A
    worker dies with its parent, however the parent ends (an aborted job kills ranks outright), and
    leaves Ctrl-C to it: bound first, since the parent may go during torch's import (a second)."""
    bind_to_parent()
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class PilPool:
    """Worker processes decoding batches; a batch is split into one chunk per worker. Workers write
    images into a shared-memory batch (a ring of three) rather than pickling them back: the parent
    spent more time unpickling 150 KB images than the workers did decoding them.

    The ring's and the pool's queues' names leave /dev/shm as soon as every worker has opened them
    (the mappings live on), while the pool is made, so nothing is left there however the processes
    end: a rank killed outright by its launcher had left them behind."""

    RING = 3  # two batches in flight, one being collected

    def __init__(self, options: DecodeOptions, batch_size: int) -> None:
        end_if_importing_parents_script()  # before any name in /dev/shm
        self.options = options
        self.batch_size = batch_size
        # until the names are gone: a rank killed before then (its launcher ending the job) leaves none
        self._guard = NameGuard()
        start_resource_tracker()  # before the ring's SharedMemory would start it, deaf to a scheduler's stop
        self._ring = self._make_ring()
        self._guard.add(*(f"/dev/shm/{b.name.lstrip('/')}" for b in self._ring))
        self._blocks = list(self._ring)  # for the release below
        self._pool = ProcessPoolExecutor(options.workers, mp_context=worker_context(), initializer=_start_worker,
                                         initargs=([b.name for b in self._ring], options.size))
        self._guard.add(*(f"/dev/shm/sem.{name.lstrip('/')}" for name in _semaphore_names(self._pool)))
        self._turn = 0
        # released when closed, collected, or at interpreter exit: a loader nobody closed left its
        # shared-memory batches in /dev/shm
        self._release = weakref.finalize(self, _release, self._pool, self._blocks, self._guard)
        # now rather than at the first batch: a job that ended before its first batch (a damaged shard
        # on another rank) had its ranks killed by the launcher with every name still in /dev/shm
        try:
            self._unname()
        except BrokenProcessPool:
            self._remove_names()
            self._release()
            raise ended_as_they_started("the PIL decoding workers") from None

    def _rows_bytes(self) -> int:
        return self.batch_size * self.options.size * self.options.size * 3

    def _make_ring(self) -> list[SharedMemory]:
        """The shared-memory batches, or none where /dev/shm lacks room (a full tmpfs would kill a
        worker with SIGBUS mid-write: images are pickled back instead)."""
        if (shared_memory_left() or 0) < 2 * self.RING * self._rows_bytes():
            return []
        return [SharedMemory(create=True, size=self._rows_bytes()) for _ in range(self.RING)]

    def _unname(self) -> None:
        """Start every worker (each submit starts one while none is idle), wait until each has run a
        task (so it has opened the queues' semaphores and mapped the ring), then remove their names.
        A worker still starting when a name went could not open it and the pool broke (one run in
        a few in a fresh environment): the names stay unless every worker answered."""
        seen: set[int] = set()
        for attempt in range(50):
            pause = 0.01 * min(attempt + 1, 10)
            seen |= {f.result() for f in [self._pool.submit(_started, pause) for _ in range(self.options.workers)]}
            if len(seen) >= self.options.workers:
                break
        else:
            return  # left named: the resource tracker removes them when the pool ends
        self._remove_names()

    def _remove_names(self) -> None:
        """Remove the ring's and the queues' names, telling the resource tracker (which warns of each
        name removed behind its back, and multiprocessing of each semaphore, as the process ends)."""
        for block in self._ring:
            with contextlib.suppress(FileNotFoundError):
                block.unlink()
        _unname_semaphores(self._pool)
        self._guard.close()  # nothing left for it

    def submit(self, datas: list[bytes], indices: list[int], seed: int,
               epoch: int) -> tuple[list[Future[list[np.ndarray | str | None]]], np.ndarray | None]:
        """The chunks' futures, and the rows (a view of shared memory) the images land in, if any;
        a chunk whose worker could not map the ring sends its images back instead."""
        block = None
        if self._ring:
            self._turn += 1
            block = self._ring[self._turn % self.RING]
        name = block.name if block is not None else None
        n = self.options.workers
        datas = [d if isinstance(d, bytes) else bytes(d) for d in datas]  # views (exchanged samples) do not pickle
        step = max(1, math.ceil(len(datas) / n))
        futures = [self._pool.submit(_decode_many, (datas[i : i + step], indices[i : i + step], self.options, seed,
                                                    epoch, name, i))
                   for i in range(0, len(datas), step)]
        s = self.options.size
        rows = np.ndarray((self.batch_size, s, s, 3), dtype=np.uint8, buffer=block.buf) if block is not None else None
        return futures, rows

    def close(self) -> None:
        self._release()
        self._ring = []


def _pool_semaphores(pool: ProcessPoolExecutor) -> list[Any]:
    """The semaphores of the pool's call and result queues (the executor's private attributes: none
    if they are not where Python 3.10-3.13 keep them)."""
    from multiprocessing.synchronize import SemLock

    locks = [getattr(queue, name, None) for queue in (getattr(pool, "_call_queue", None),
                                                       getattr(pool, "_result_queue", None))
             for name in ("_rlock", "_wlock", "_sem")]
    return [lock for lock in locks if isinstance(lock, SemLock)]


def _semaphore_names(pool: ProcessPoolExecutor) -> list[str]:
    names = (getattr(getattr(lock, "_semlock", None), "name", None) for lock in _pool_semaphores(pool))
    return [name for name in names if isinstance(name, str)]


def _unname_semaphores(pool: ProcessPoolExecutor) -> None:
    """Remove the names of the pool's queue semaphores (in /dev/shm) now that every worker has opened
    them: they stay usable, and a pool killed outright leaves none behind. Done through the finalizer
    multiprocessing itself registers for each, so its resource tracker stays in step; the queues are
    the executor's private attributes, so anything unexpected is left as it is."""
    from multiprocessing import util

    mine = {id(lock) for lock in _pool_semaphores(pool)}
    registry = getattr(util, "_finalizer_registry", {})
    for finalizer in list(registry.values()):
        target = getattr(finalizer, "_weakref", None)
        if target is not None and id(target()) in mine:
            finalizer()  # unlinks the name and tells the resource tracker


def _release(pool: ProcessPoolExecutor, blocks: list[SharedMemory], guard: NameGuard) -> None:
    pool.shutdown(wait=False, cancel_futures=True)
    # the executor's manager thread closes its wake-up pipe as it ends, and concurrent.futures' exit hook
    # (Python 3.11) writes to the pipe of every executor still about: one closed between its check and its
    # write printed "Exception ignored in: <module 'threading'> ... Bad file descriptor" as the process
    # ended (the README's quick start, once, under make test). Closed here, the pipe is closed by then
    manager = getattr(pool, "_executor_manager_thread", None)
    if manager is not None and manager is not threading.current_thread():
        manager.join(timeout=10)
    guard.close()
    for block in blocks:
        with contextlib.suppress(BufferError):  # a view of it is still about: the mapping goes with it
            block.close()
        with contextlib.suppress(FileNotFoundError):
            block.unlink()
    blocks.clear()
