"""Batches of a constant size when images are skipped (``on_error="skip"``).

A decoder drops the samples it cannot decode, so a batch comes out short; code that assumes a fixed
shape (compiled models, CUDA graphs) breaks on it. Here each batch takes the next samples of the
rank's stream in place of the dropped ones, so every batch has the size the plan gives it and every
rank yields the same number of batches. Pulled forward, the stream ends a few samples early: the
last batches are completed with repeats of the epoch's last decoded samples, counted in
``stats.repeated``, as the plan's own padding is. Every decodable sample is still yielded, once,
before any repeat.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..errors import DdpipeError
from ..loader_stats import DecodeStats

Batch = tuple[torch.Tensor, torch.Tensor]


def refilled(batches: Iterator[Batch], sizes: list[int], stats: DecodeStats) -> Iterator[Batch]:
    """``batches`` regrouped into batches of exactly ``sizes`` (the plan's, in order); closing this
    closes ``batches``."""
    pending: list[Batch] = []
    have = 0
    last: Batch | None = None
    stats.repeated = 0
    out = 0
    try:
        for images, labels in batches:
            if len(labels):
                pending.append((images, labels))
                have += len(labels)
            while out < len(sizes) and have >= sizes[out]:
                batch, pending = _take(pending, sizes[out])
                have -= sizes[out]
                last = batch
                out += 1
                yield batch
    finally:  # closed early: so is the decoding it takes from (its threads, its pipeline's batches)
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    while out < len(sizes):  # the stream ended short by the samples it skipped
        need = sizes[out]
        source = _cat(pending) if pending else last
        if source is None:
            raise DdpipeError("every sample of this rank's epoch was skipped: nothing to fill its batches with")
        rows = torch.arange(need, device=source[1].device) % len(source[1])
        batch = (source[0][rows], source[1][rows])
        stats.repeated += need - (have if pending else 0)
        pending, have = [], 0
        last = batch
        out += 1
        yield batch


def _cat(parts: list[Batch]) -> Batch:
    if len(parts) == 1:
        return parts[0]
    images = torch.cat([x for x, _ in parts])
    if parts[0][0].is_contiguous(memory_format=torch.channels_last):
        images = images.contiguous(memory_format=torch.channels_last)
    return images, torch.cat([y for _, y in parts])


def _take(pending: list[Batch], n: int) -> tuple[Batch, list[Batch]]:
    """The first ``n`` samples of ``pending``, and what is left."""
    if len(pending[0][1]) == n:
        return pending[0], pending[1:]
    images, labels = _cat(pending)
    rest = [(images[n:], labels[n:])] if len(labels) > n else []
    return (images[:n], labels[:n]), rest
