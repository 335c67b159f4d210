"""The consumer's side of the loader: the samples its producer hands on, put in the order the rank
yields them.

The producer hands samples on in the order of the rank's plan's ``stream`` (as read, or as each
exchange round emits them); the rank yields them in the plan's ``order`` (the shuffle buffer is
simulated on indices), and the plan knows where in the stream each yielded sample arrives
(``RankPlan.positions``), so each batch is taken from the arrivals by position (a dictionary of
samples by index, one entry per sample, cost 3-7 times as much processor time, which every rank spent
at once at an epoch's end when its last exchange round arrived: benchmarks/exchange.py, 8 ranks).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import numpy as np

from .errors import DdpipeError
from .loader_stats import ReadStats
from .sample import Sample


def batches_in_order(groups: Iterator[list[tuple[int, Sample]]], order: np.ndarray, at: np.ndarray,
                     batch_size: int, num_batches: int,
                     stats: ReadStats) -> Generator[tuple[np.ndarray, list[Sample]], None, None]:
    """``num_batches`` batches of ``order``, ``batch_size`` at a time, with their global indices,
    taken from ``groups`` of (global index, sample) arriving in the stream's order; ``at``: where in
    the stream each of ``order`` arrives (``RankPlan.positions``). Each sample is let go once taken.
    ``stats.held_peak``: the most samples held for later batches so far."""
    starts = np.arange(0, len(order), batch_size)
    # the arrivals each batch needs, and the earliest arrival any batch from it on takes: everything
    # before that is let go
    needed = np.maximum.reduceat(at, starts) + 1 if len(at) else np.zeros(0, dtype=np.int64)
    keep_from = np.minimum.accumulate(np.minimum.reduceat(at, starts)[::-1])[::-1] if len(at) else needed
    arrived: list[Any] = []  # (global index, sample) from arrival number ``base`` on; None once taken
    base = peak = 0
    for b in range(num_batches):
        indices = order[b * batch_size : (b + 1) * batch_size]
        while base + len(arrived) < needed[b]:
            group = next(groups, None)
            if group is None:
                raise DdpipeError("the epoch ended early: another rank stopped iterating; every rank "
                                  "must iterate the same number of batches")
            arrived.extend(group)
        where = (at[b * batch_size : b * batch_size + len(indices)] - base).tolist()
        taken = [arrived[p] for p in where]
        for p in where:
            arrived[p] = None
        if [g for g, _ in taken] != indices.tolist():
            raise DdpipeError("samples arrived out of the plan's order: do all ranks run the same ddpipe "
                              "version, dataset and options?")
        peak = max(peak, base + len(arrived) - b * batch_size - len(indices))
        stats.held_peak = peak
        if b + 1 < len(keep_from):
            gone = min(int(keep_from[b + 1]) - base, len(arrived))
            del arrived[:gone]
            base += gone
        yield indices, [sample for _, sample in taken]
