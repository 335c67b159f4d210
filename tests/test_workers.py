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


DECODES = """
import os, signal, sys
sys.path.insert(0, os.getcwd())
import ddpipe
from tests.helpers import alive, descendants

if __name__ == "__main__":
    loader = ddpipe.Loader(sys.argv[1], 4, decoder="pil", device="cpu", size=32, resize_shorter=40, shuffle="none")
    batches = iter(loader)
    seen = len(next(batches)[1])
    helpers = descendants(os.getpid())
    for pid in helpers:
        os.kill(pid, signal.SIGUSR1)
    seen += sum(len(labels) for _, labels in batches)
    print(seen, [pid for pid in helpers if not alive(pid)], flush=True)
    loader.close()
"""


def test_a_pil_loaders_helper_processes_leave_a_schedulers_stop_to_their_rank(tmp_path: Path) -> None:
    """Workers, resource tracker and name guard, in a fresh process: the tracker, started by the ring's
    first SharedMemory, died of SIGUSR1 (CPython holds back only SIGINT and SIGTERM as it starts it)."""
    import numpy as np

    import ddpipe

    from .decode.test_decode import labelled_samples

    ddpipe.write_dataset(tmp_path / "d", iter(labelled_samples(12, np.random.default_rng(0))), samples_per_shard=6)
    proc = subprocess.run([sys.executable, "-c", DECODES, str(tmp_path / "d")], cwd=Path(__file__).parents[1],
                          capture_output=True, text=True, timeout=120)  # a hang bound
    assert proc.returncode == 0 and proc.stdout == "12 []\n", proc.stdout + proc.stderr
    assert "resource_tracker" not in proc.stderr, proc.stderr
