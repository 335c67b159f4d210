"""Allocator settings for a process that churns through many ~100 KB sample buffers.

glibc returns the top of the heap to the OS as soon as 128 KB lies free there. A loader frees a
round's worth of encoded JPEGs (~100 KB each) at once and allocates the next round's just after,
so every round faults the same pages in again: copying 100 KB samples into fresh ``bytes`` measured
1.6 GB/s that way and 30 GB/s with trimming held back (benchmarks/exchange.py, this machine).
Keeping up to ``TRIM_THRESHOLD`` of freed memory for reuse bounds the cost: peak memory is still
set by the pipeline's bounded queues, not by the dataset or the epoch count.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 512 << 20
MMAP_THRESHOLD = 32 << 20  # samples and rounds come from the heap, not one mmap each


def keep_freed_memory() -> bool:
    """Tune glibc malloc for sample churn; a no-op (returning False) on other C libraries."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
