"""Allocator settings for a process that churns through many ~100 KB sample buffers.

glibc returns the top of the heap to the OS as soon as 128 KB lies free there. A loader frees a
round's worth of encoded JPEGs (~100 KB each) at once and allocates the next round's just after,
so every round faults the same pages in again: copying 100 KB samples into fresh ``bytes`` measured
1.6 GB/s that way and 30 GB/s with trimming held back (benchmarks/exchange.py, this machine).
Keeping up to ``TRIM_THRESHOLD`` of freed memory for reuse bounds the cost: peak memory is still
set by the pipeline's bounded queues, not by the dataset or the epoch count.

What is kept is given back at an epoch's end once the process holds clearly more than after its
loaders' first epochs (:class:`EpochMemory`): otherwise the heap holds the high-water mark of every epoch so
far, and a 20-epoch soak run (benchmarks/soak.py) grew ~30% in rare steps as an epoch's exchange
rounds and decode buffers peaked a little higher than before. Giving it back after every epoch
instead made every epoch fault its whole working set in again: with 8 ranks on 2 cores that was a
third of the CPU time of an epoch (benchmarks/loader.py), and 2 ranks ran ~10% slower for it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
TRIM_THRESHOLD = 512 << 20
MMAP_THRESHOLD = 32 << 20  # samples and rounds come from the heap, not one mmap each
# glibc gives each new thread an arena of its own, up to 8 per core. Samples are made on the reader
# and exchange threads and freed on the decoding one, so every arena grew to its own high-water
# mark: resident memory rose in steps for ~5 epochs (+25%). With two, reading an epoch with Q = 0
# faulted ~135 MB back in per rank every epoch (benchmarks/exchange.py): the second arena's memory
# did not stay with the process as the heap's does under TRIM_THRESHOLD (glibc keeps a thread
# arena's memory in 64 MB heaps of its own; a larger M_TOP_PAD did not help). One arena faulted
# nothing after the first epoch, at no cost in throughput measurable here with DALI's threads
# (benchmarks/loader.py's ddpipe rows at 2 and 8 ranks, interleaved probes).
ARENA_MAX = 1


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, found without ``ctypes.util.find_library``: that runs ``ldconfig`` in a forked
    child, once per call, and a child forked from a loader holding a gigabyte reports that gigabyte
    as its own peak (ru_maxrss), which doubled the figures of benchmarks/loader.py."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None)  # the process's own symbols: libc's among them
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Tune glibc malloc for sample churn; a no-op (returning False) on other C libraries."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(option, value) for option, value in
               ((M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_ARENA_MAX, ARENA_MAX)))


def release_freed_memory() -> bool:
    """Give the memory malloc keeps for reuse back to the OS (every arena, free pages in the middle
    of the heap too); a no-op (returning False) on other C libraries."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


def shared_memory_left(shm: str = "/dev/shm") -> int | None:
    """The bytes left in ``shm`` (where MPICH's shared windows and Python's SharedMemory live, and
    which containers often keep small); None where it cannot be told."""
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def anonymous_resident_bytes() -> int | None:
    """The process's resident anonymous memory (the heap among it; not mapped files or shared
    memory); None where the system does not say. From ``/proc/self/statm`` (resident less shared is
    RssAnon): ``/proc/self/status`` says the same but cost ~120 us a read in a loader's process
    against ~6, at the epoch's end, on every rank at once (8 ranks of benchmarks/exchange.py)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
    except OSError:
        return None
    if len(fields) < 3:
        return None
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


class EpochMemory:
    """Decides, at each epoch's end, whether to give freed memory back: only once the process holds
    more than ``growth`` over what it held after its loaders' first epochs, so that memory stays
    bounded while a steady run keeps the pages it reuses. One per process (its communicator's):
    malloc's memory is the process's, shared by every loader in it."""

    def __init__(self, growth: float = 0.25,
                 resident: Callable[[], int | None] = anonymous_resident_bytes) -> None:
        self.growth = growth
        self._resident = resident
        self._bound: int | None = None

    def epoch_done(self, loaders_first: bool) -> bool:
        """Call after each epoch, saying whether it was its loader's first; True if freed memory went
        back to the OS. A loader's first epoch raises the bound: the process now holds its working set too."""
        now = self._resident()
        if now is None:  # no way to tell growth: give back every epoch
            return release_freed_memory()
        if loaders_first:
            self._bound = max(self._bound or 0, int(now * (1 + self.growth)))
            return False
        return self._bound is not None and now > self._bound and release_freed_memory()
