"""What benchmarks/gpu.py and its probe (gpu_probe.py) share: the batch, the image size, the cores,
and an epoch's rate taken once the GPU is done with it."""

from __future__ import annotations

import os
import time
from typing import Any

BATCH, SIZE = 256, 224
CORES = os.cpu_count() or 1


def epoch_rates(batches_of_epoch: Any, epochs: int, first: bool = False) -> list[float]:
    """Images/s of each epoch after the first (with ``first``, of the first too), each ended when the
    GPU is done with it."""
    import torch

    rates = []
    for e in range(epochs):
        t0, n = time.perf_counter(), 0
        for b in batches_of_epoch():
            n += len(b)
        if torch.cuda.is_available():  # else a smoke run of a row's code on the CPU (dali-cpu rows)
            torch.cuda.synchronize()
        if e or first:
            rates.append(n / (time.perf_counter() - t0))
    return rates
