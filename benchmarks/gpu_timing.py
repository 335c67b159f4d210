"""What benchmarks/gpu.py and its probe (gpu_probe.py) share: the batch, the image size, the cores,
and an epoch's figures taken once the GPU is done with it."""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

from ddpipe.errors import RepeatedEpochWarning

# benchmarks repeat an epoch on purpose (a warm-up, then the same epoch timed)
warnings.filterwarnings("ignore", category=RepeatedEpochWarning)

BATCH, SIZE = 256, 224
CORES = os.cpu_count() or 1


def timed_epochs(batches_of_epoch: Any, epochs: int, first: bool = False) -> dict[str, list[float]]:
    """Each epoch after the first (with ``first``, the first too), ended when the GPU is done with it:
    its images/s (``rates``); the wait for its first batch (``first_batch_ms``: a new epoch's
    reading and DALI's prefetch refilled, where a reader that runs on across epochs pays nothing);
    and its images/s from that batch on (``steady_rates``). A benchmark's epochs are a few dozen
    batches, a training epoch's thousands: the two rates apart say which of the two a gap is."""
    import torch

    figures: dict[str, list[float]] = {"rates": [], "steady_rates": [], "first_batch_ms": []}
    for e in range(epochs):
        t0, t_first, n, n_first = time.perf_counter(), 0.0, 0, 0
        for b in batches_of_epoch():
            if not n:
                t_first, n_first = time.perf_counter(), len(b)
            n += len(b)
        if torch.cuda.is_available():  # else a smoke run of a row's code on the CPU (dali-cpu rows)
            torch.cuda.synchronize()
        t = time.perf_counter()
        if e or first:
            figures["rates"].append(n / (t - t0))
            figures["first_batch_ms"].append(1000 * (t_first - t0))
            figures["steady_rates"].append((n - n_first) / (t - t_first) if n > n_first else float("nan"))
    return figures


def epoch_rates(batches_of_epoch: Any, epochs: int, first: bool = False) -> list[float]:
    """Images/s of each epoch after the first (with ``first``, of the first too): :func:`timed_epochs`'s
    ``rates``."""
    return timed_epochs(batches_of_epoch, epochs, first)["rates"]
