"""Torch-side decoding: choosing the decoder and device, the PIL decoder's batches, normalisation."""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Protocol

import numpy as np
import torch

from ..errors import DdpipeError, OptionError
from ..optional import installed
from . import DECODERS
from .batches import EncodedBatch, OnBad
from .spec import DecodeOptions, check_device

Batch = tuple[torch.Tensor, torch.Tensor]


class NoDaliWarning(UserWarning):
    """``decoder="auto"`` without DALI: PIL decodes instead."""


class Decoder(Protocol):
    """Turns a stream of encoded batches into (images, labels) on the device. One decoder serves a
    loader's every epoch; crops and flips follow (seed, epoch, global sample index)."""

    def decode(self, batches: Iterator[EncodedBatch], seed: int, epoch: int, on_bad: OnBad) -> Iterator[Batch]: ...

    def close(self) -> None: ...


def normalize(images: torch.Tensor, options: DecodeOptions | None = None,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 NCHW images (0-255) -> normalised floats, on whatever device they are (the GPU, ideally)."""
    # Anything else was taken as 0-255 in silence: a float32 batch the Loader had normalised already
    # (its default dtype) normalised twice, a CHW image made a batch of one, an integer dtype truncated.
    if images.dtype != torch.uint8:
        raise OptionError(f"normalize takes uint8 images (0-255), not {str(images.dtype).removeprefix('torch.')}: "
                          "a Loader's float batches are normalised already (DecodeOptions.dtype)")
    if images.dim() != 4 or images.shape[1] != 3:
        raise OptionError(f"normalize takes a batch, N x 3 x H x W, not {' x '.join(map(str, images.shape))}")
    if not dtype.is_floating_point:
        raise OptionError(f"normalize makes floats, not {str(dtype).removeprefix('torch.')}")
    o = options or DecodeOptions()
    mean = torch.tensor(o.mean, device=images.device, dtype=dtype).view(1, 3, 1, 1) * 255
    std = torch.tensor(o.std, device=images.device, dtype=dtype).view(1, 3, 1, 1) * 255
    return (images.to(dtype) - mean) / std


def named_device(device: str) -> torch.device:
    """The torch device ``device`` ("cpu", "cuda", "cuda:N") names, once it is known to be there."""
    target = torch.device(check_device(device))
    if target.type == "cuda":
        if not torch.cuda.is_available():
            raise DdpipeError(f"device={device!r} but CUDA is not available")
        if target.index is not None and target.index >= torch.cuda.device_count():
            raise DdpipeError(f"device={device!r} but this machine has {torch.cuda.device_count()} GPU(s), "
                              f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return target


def resolve(decode: str, device: str, local_rank: int = 0, served: bool = False) -> tuple[str, torch.device]:
    """The decoder and the device that ``decode`` and ``device`` (either may be ``"auto"``) stand for.
    ``served``: decoding is a decode service's, on the CPU (its servers' decoder, and this one's
    while none answers)."""
    if decode not in DECODERS:
        raise DdpipeError(f"decode must be one of {', '.join(DECODERS)}, not {decode!r}")
    cuda = torch.cuda.is_available()
    if device == "auto":
        target = torch.device("cuda", local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    else:
        target = named_device(device)
    if decode == "auto":
        if installed("nvidia.dali"):
            decode = "dali-gpu" if target.type == "cuda" and not served else "dali-cpu"
        else:  # a line once per process (the warnings module's default), not per loader
            warnings.warn("NVIDIA DALI is not installed: decoding with PIL on the CPU (pip install 'ddpipe[dali]' "
                          "for DALI)", NoDaliWarning, stacklevel=2)
            decode = "pil"
    if decode == "dali-gpu" and target.type != "cuda" and not served:
        # said as the loader is made, not by the decoder at the first batch (after a trainer's model and banner)
        why = "CUDA is not available" if not cuda else f"the batches go to {target}"
        raise DdpipeError(f"decode='dali-gpu' needs a CUDA device: {why} (decode='dali-cpu' decodes on the CPU)")
    return decode, target


class PilDecoder:
    """The fallback: a pool of processes decoding with PIL, two batches in flight."""

    def __init__(self, options: DecodeOptions, batch_size: int, device: torch.device) -> None:
        from .pil import PilPool
        from .ring import BatchRing

        self.options = options
        self.device = device
        self._pool = PilPool(options, batch_size)
        self._ring = BatchRing(options, device)

    def close(self) -> None:
        self._pool.close()
        self._ring.clear()

    def decode(self, batches: Iterator[EncodedBatch], seed: int, epoch: int, on_bad: OnBad) -> Iterator[Batch]:
        inflight: deque[tuple[EncodedBatch, list[Future[list[np.ndarray | str | None]]], np.ndarray | None]] = deque()
        try:
            for batch in batches:
                inflight.append((batch, *self._pool.submit(batch.datas, batch.indices, seed, epoch)))
                if len(inflight) >= 2:
                    yield self._collect(*inflight.popleft(), on_bad)
            while inflight:
                yield self._collect(*inflight.popleft(), on_bad)
        finally:
            for _, futures, _ in inflight:  # left mid-epoch: the pool stays, its stale work does not
                for f in futures:
                    f.cancel()
            for _, futures, _ in inflight:  # nor may it write into a batch handed out again
                for f in futures:
                    if not f.cancelled():
                        f.exception()

    def _collect(self, batch: EncodedBatch, futures: list[Future[list[np.ndarray | str | None]]],
                 rows: np.ndarray | None, on_bad: OnBad) -> Batch:
        results = [r for f in futures for r in f.result()]
        keep, images, labels = [], [], []
        for i, (g, sample, label, result) in enumerate(zip(batch.indices, batch.samples, batch.labels, results,
                                                           strict=True)):
            if isinstance(result, str):
                on_bad(g, sample, f"does not decode: {result}")
                continue
            keep.append(i)
            if result is not None:
                if rows is not None:  # a worker without the shared ring sent it back: it goes in its row
                    rows[i] = result
                images.append(result)
            labels.append(label)
        if rows is not None:  # read out now: the shared rows are written again two batches on
            hwc = torch.from_numpy(rows[: len(results)] if len(keep) == len(results) else rows[keep])
        else:
            s = self.options.size
            hwc = torch.from_numpy(np.stack(images)) if images else torch.empty((0, s, s, 3), dtype=torch.uint8)
        out = self._ring.take(len(keep))
        self._ring.fill(out, hwc.permute(0, 3, 1, 2))
        nchw = self._ring.handed_out(out)
        return nchw, self._ring.labels_out(torch.tensor(labels, dtype=torch.int64))


def make_decoder(kind: str, options: DecodeOptions, batch_size: int, device: torch.device) -> Decoder:
    """A decoder of this process (``kind``: ``"pil"``, ``"dali-cpu"``, ``"dali-gpu"``), whatever
    ``options.service`` says: the decode stage (:mod:`ddpipe.decoding`) chooses the service's client."""
    if kind == "pil":
        return PilDecoder(options, batch_size, device)
    from .dali import DaliDecoder

    return DaliDecoder(options, batch_size, device, gpu_decode=kind == "dali-gpu")

