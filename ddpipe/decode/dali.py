"""Decoding with NVIDIA DALI: ``mixed`` (GPU JPEG decoding) where CUDA is present, ``cpu`` otherwise.

The pipeline is fed by ``fn.external_source`` with this rank's encoded batches (after exchange and
local shuffle), decodes only the random crop's region of interest, resizes, flips and normalises,
and hands back torch tensors on the training device. DALI runs a few batches ahead (its prefetch
queue) while the caller trains on the current one.

A corrupt image stops a DALI pipeline without saying which sample it was. The decoder keeps the
batches DALI has taken but not returned; on an error it finds the bad samples of the failing batch
(a full PIL decode of each), reports them through ``on_bad``, and rebuilds the pipeline fed with
the rest of that batch, then the batches that were in flight, then the stream.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.dlpack

from ..errors import DdpipeError
from ..seeding import DECODE, derive_rng
from .batches import EncodedBatch, OnBad
from .spec import DecodeOptions

_TORCH_DTYPE = {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}


def _import_dali() -> Any:
    try:
        import nvidia.dali as dali
    except ImportError as e:
        raise DdpipeError("decode='dali-*' needs NVIDIA DALI: pip install 'ddpipe[dali]' (or use decode='pil')") from e
    return dali


class _Feed:
    """The external source: encoded batches in, each remembered until its output comes back."""

    def __init__(self, batches: Iterator[EncodedBatch], inflight: deque[EncodedBatch]) -> None:
        self._batches = batches
        self._inflight = inflight

    def __iter__(self) -> _Feed:
        return self

    def __next__(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        batch = next(self._batches)
        while not batch.datas:  # every sample of it was skipped: it still counts as a batch
            self._inflight.append(batch)
            batch = next(self._batches)
        self._inflight.append(batch)
        return ([np.frombuffer(d, dtype=np.uint8) for d in batch.datas],
                [np.array([label], dtype=np.int64) for label in batch.labels])


class DaliDecoder:
    def __init__(self, options: DecodeOptions, batch_size: int, device: torch.device, gpu_decode: bool) -> None:
        self.dali = _import_dali()
        self.options = options
        self.batch_size = batch_size
        self.device = device
        self.gpu_decode = gpu_decode
        if gpu_decode and device.type != "cuda":
            raise DdpipeError("decode='dali-gpu' needs a CUDA device")

    def _pipeline(self, feed: _Feed, seed: int) -> Any:
        dali, o = self.dali, self.options
        fn, types = dali.fn, dali.types
        out_dtype = {"float32": types.FLOAT, "float16": types.FLOAT16, "uint8": types.UINT8}[o.dtype]
        device_id = self.device.index or 0 if self.gpu_decode else None

        # the dynamic executor keeps an output alive while anything refers to it, so outputs are handed
        # to torch without a copy (a copy of each float32 batch cost 14% of CPU decoding throughput)
        @dali.pipeline_def(batch_size=self.batch_size, num_threads=o.workers, device_id=device_id, seed=seed,
                           prefetch_queue_depth=2, exec_dynamic=True)
        def pipe():  # type: ignore[no-untyped-def]
            encoded, labels = fn.external_source(source=feed, num_outputs=2, batch=True, cycle="raise",
                                                 dtype=[types.UINT8, types.INT64])
            where = "mixed" if self.gpu_decode else "cpu"
            if o.train:
                images = fn.decoders.image_random_crop(encoded, device=where, output_type=types.RGB,
                                                       random_area=list(o.scale), random_aspect_ratio=list(o.ratio),
                                                       num_attempts=10)
                images = fn.resize(images, resize_x=o.size, resize_y=o.size, antialias=o.antialias)
                mirror = fn.random.coin_flip(probability=o.flip)
                crop = None
            else:
                images = fn.decoders.image(encoded, device=where, output_type=types.RGB)
                images = fn.resize(images, resize_shorter=o.resize_shorter, antialias=o.antialias)
                mirror, crop = 0, (o.size, o.size)
            # uint8 output leaves normalisation to the training device; DALI's mean and std are in pixels
            norm = {} if o.dtype == "uint8" else {"mean": [m * 255 for m in o.mean], "std": [s * 255 for s in o.std]}
            layout = "HWC" if o.channels_last else "CHW"
            images = fn.crop_mirror_normalize(images, dtype=out_dtype, output_layout=layout, crop=crop,
                                              mirror=mirror, **norm)
            return images, labels

        p = pipe()
        p.build()
        return p

    def _to_torch(self, images: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
        where = self.device if self.gpu_decode else torch.device("cpu")
        with where:
            out = torch.utils.dlpack.from_dlpack(images.as_tensor())
        if self.options.channels_last:
            out = out.permute(0, 3, 1, 2)  # NCHW shape with NHWC memory: torch's channels_last
        target = torch.utils.dlpack.from_dlpack(labels.as_tensor()).reshape(-1)
        if out.device != self.device:
            out = out.to(self.device, non_blocking=True)
        return out, target.to(self.device, non_blocking=True)

    def _empty(self) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.options.size
        shape = (0, s, s, 3) if self.options.channels_last else (0, 3, s, s)
        images = torch.empty(shape, dtype=_TORCH_DTYPE[self.options.dtype], device=self.device)
        if self.options.channels_last:
            images = images.permute(0, 3, 1, 2)
        return images, torch.empty(0, dtype=torch.int64, device=self.device)

    def decode(self, batches: Iterator[EncodedBatch], seed: int,
               on_bad: OnBad) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        inflight: deque[EncodedBatch] = deque()
        rebuilds = 0
        pipe = self._pipeline(_Feed(batches, inflight), seed)
        while True:
            try:
                images, labels = pipe.run()
            except StopIteration:
                while inflight:  # trailing batches whose samples were all skipped
                    inflight.popleft()
                    yield self._empty()
                return
            except RuntimeError as e:
                while inflight and not inflight[0].datas:
                    inflight.popleft()
                    yield self._empty()
                if not inflight:
                    raise
                failing = inflight.popleft()
                bad = _find_bad(failing, str(e), on_bad)
                rest = [failing.without(bad), *inflight]
                inflight.clear()
                rebuilds += 1
                seed_again = int(derive_rng(seed, DECODE, rebuilds).integers(2**31 - 1))
                pipe = self._pipeline(_Feed(itertools.chain(rest, batches), inflight), seed_again)
                continue
            while inflight and not inflight[0].datas:
                inflight.popleft()
                yield self._empty()
            inflight.popleft()
            yield self._to_torch(images, labels)


def _find_bad(batch: EncodedBatch, dali_error: str, on_bad: OnBad) -> set[int]:
    """The samples of a batch that DALI failed on, found by decoding each fully with PIL."""
    from ..verify import decode_check

    bad: set[int] = set()
    for g, sample, data in zip(batch.indices, batch.samples, batch.datas, strict=True):
        try:
            decode_check(data)
        except (OSError, ValueError, SyntaxError) as e:
            on_bad(g, sample, f"does not decode: {e}")
            bad.add(g)
    if not bad:
        first = dali_error.strip().splitlines()[-1] if dali_error.strip() else dali_error
        raise DdpipeError(f"DALI failed on a batch whose images all decode with PIL ({first}); "
                          f"keys: {[s['__key__'] for s in batch.samples][:8]}")
    return bad
