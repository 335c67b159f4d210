"""The allocator settings: applied on Linux, and without forking a child (which would report the
parent's whole resident set as its own peak)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_settings_apply_and_fork_nothing() -> None:
    code = ("import resource; from ddpipe.memory import keep_freed_memory, release_freed_memory; "
            "big = bytearray(300 << 20); "
            "assert keep_freed_memory(); release_freed_memory(); release_freed_memory(); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # (malloc_trim says whether it gave memory back, which depends on the heap: not asserted here; the
    # next test measures it)
    assert int(out.stdout) == 0  # no child process was ever waited for


def test_trimming_gives_freed_memory_back() -> None:
    code = ("from ddpipe.memory import keep_freed_memory, release_freed_memory\n"
            "def rss():\n    return int(open('/proc/self/statm').read().split()[1]) * 4096 >> 20\n"
            "keep_freed_memory()\n"
            "chunks = [bytes(100_000) for _ in range(3000)]\n"  # ~300 MB of sample-sized blocks
            "del chunks\n"
            "before = rss(); release_freed_memory(); print(before, rss())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = map(int, out.stdout.split())
    assert before > 150 and after < before - 150  # what the heap kept for reuse went back to the OS


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_freed_memory_goes_back_only_once_the_process_outgrows_its_loaders_first_epochs() -> None:
    code = ("from ddpipe.memory import EpochMemory, anonymous_resident_bytes, keep_freed_memory\n"
            "def mb():\n    return anonymous_resident_bytes() >> 20\n"
            "keep_freed_memory()\n"
            "memory = EpochMemory(growth=0.25)\n"
            "def epoch(mb_used, first=False):\n"
            "    chunks = [b'x' * 100_000 for _ in range(mb_used * 10)]\n"  # sample-sized, written
            "    del chunks\n"
            "    before = mb(); given = memory.epoch_done(first); print(int(given), before, mb())\n"
            "epoch(200, first=True); epoch(200); epoch(400); epoch(400, first=True); epoch(400)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    given, before, after = zip(*(map(int, line.split()) for line in out.stdout.splitlines()), strict=True)
    # a steady epoch keeps the heap for the next one's reuse; one past the bound gives back what was freed
    assert given == (0, 0, 1, 0, 0)
    assert after[1] >= before[1] - 10 and after[2] < before[2] - 250
    assert after[4] >= before[4] - 10  # a second loader's first epoch raised the bound: its working set stays


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_anonymous_resident_memory_counts_the_heap_and_not_mapped_files(tmp_path: Path) -> None:
    import mmap

    from ddpipe.memory import anonymous_resident_bytes

    big = tmp_path / "file"
    big.write_bytes(b"\1" * (64 << 20))
    before = anonymous_resident_bytes()
    assert before is not None
    with open(big, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        assert sum(mapped[i] for i in range(0, len(mapped), mmap.PAGESIZE)) > 0  # every page touched
        with_file = anonymous_resident_bytes()
    heap = bytearray(b"\1" * (64 << 20))
    with_heap = anonymous_resident_bytes()
    assert with_file is not None and with_heap is not None
    assert abs(with_file - before) < 16 << 20  # the mapped file's 64 MB are not the process's own
    assert with_heap - with_file > 56 << 20
    del heap
