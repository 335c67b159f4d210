"""Decoding encoded samples into batches of tensors on the training device.

``decode``: ``"dali-gpu"`` (DALI ``mixed``: JPEG decoding on the GPU), ``"dali-cpu"``, ``"pil"`` (a
process pool, where DALI cannot be installed), or ``"auto"``: the GPU where CUDA and DALI are
present, else DALI on the CPU, else PIL. Every path gives the same outputs: images NCHW (optionally
channels-last in memory) as float32, float16 or uint8, and int64 labels.

Torch loads only when something here decodes: an EncodedStream never imports it.
"""

from __future__ import annotations

from typing import Any

from .spec import DECODERS, DecodeOptions


def __getattr__(name: str) -> Any:
    if name in ("normalize", "resolve", "make_decoder", "PilDecoder"):
        from . import output

        return getattr(output, name)
    raise AttributeError(name)


__all__ = ["DECODERS", "DecodeOptions", "make_decoder", "normalize", "resolve"]
