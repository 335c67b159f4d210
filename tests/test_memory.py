"""The allocator settings: applied on Linux, and without forking a child (which would report the
parent's whole resident set as its own peak)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_settings_apply_and_fork_nothing() -> None:
    code = ("import resource; from ddpipe.memory import keep_freed_memory, release_freed_memory; "
            "big = bytearray(300 << 20); "
            "assert keep_freed_memory() and release_freed_memory() and release_freed_memory(); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
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
