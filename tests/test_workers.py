"""Helper processes leave their parent's signals to it, and still go when it goes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .helpers import alive

HOLDS_A_NAME = """
import sys
from ddpipe.workers import NameGuard
guard = NameGuard()
guard.add(sys.argv[1])
print(guard._guard.pid, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def test_the_name_guard_outlasts_its_parents_signals_and_removes_the_names_when_the_parent_is_killed() -> None:
    """Slurm signals every process of a job step (SIGTERM before a time limit, SIGUSR1 with --signal): a
    guard that died of it left the names behind when its rank was then killed with SIGKILL."""
    name = Path("/dev/shm") / f"ddpipe-test-guard-{os.getpid()}"
    name.write_bytes(b"x")
    parent = subprocess.Popen([sys.executable, "-c", HOLDS_A_NAME, str(name)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
    try:
        assert parent.stdout is not None
        guard = int(parent.stdout.readline())
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            os.kill(guard, sig)
        assert parent.poll() is None and name.exists()
        parent.kill()
        parent.wait(timeout=60)
        deadline = time.monotonic() + 60  # a hang bound: the guard removes it as soon as its input ends
        while name.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not name.exists() and not alive(guard)
    finally:
        parent.kill()
        name.unlink(missing_ok=True)
