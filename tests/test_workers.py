"""Helper processes leave their parent's signals to it, and still go when it goes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
        # and then exits: the name goes a moment before the process does, so wait for both
        while (name.exists() or alive(guard)) and time.monotonic() < deadline:
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

    from .decode.images import labelled_samples

    ddpipe.write_dataset(tmp_path / "d", iter(labelled_samples(12, np.random.default_rng(0))), samples_per_shard=6)
    proc = subprocess.run([sys.executable, "-c", DECODES, str(tmp_path / "d")], cwd=Path(__file__).parents[1],
                          capture_output=True, text=True, timeout=120)  # a hang bound
    assert proc.returncode == 0 and proc.stdout == "12 []\n", proc.stdout + proc.stderr
    assert "resource_tracker" not in proc.stderr, proc.stderr


# scripts as a newcomer writes them: no `if __name__ == "__main__":`
UNGUARDED = {
    "loader": "import sys, ddpipe\n"
              "ddpipe.convert(sys.argv[1], sys.argv[2], ddpipe.ConvertOptions(samples_per_shard=6, progress=False))\n"
              "loader = ddpipe.Loader(sys.argv[2], 4, decode=ddpipe.DecodeOptions(size=32, decoder='pil'))\n"
              "print(len(next(iter(loader))[1]))\n",
    "convert": "import sys, ddpipe\n"
               "ddpipe.convert(sys.argv[1], sys.argv[2], ddpipe.ConvertOptions(samples_per_shard=6, workers=2,"
               " progress=False))\n",
    "synth": "import sys\nfrom ddpipe.synth import SynthOptions, synth\n"
             "synth(sys.argv[2], SynthOptions(n=8, classes=2, workers=2, progress=False))\n",
}


@pytest.mark.parametrize("what", sorted(UNGUARDED))
def test_a_script_without_a_main_guard_gets_one_error_saying_so(what: str, raw_images: Path, tmp_path: Path) -> None:
    """Spawned workers import the main script first: each made the loader (or conversion) again, and
    multiprocessing refused its workers' workers. The script printed ~300 lines (a traceback from each
    worker, BrokenProcessPool, the resource tracker's warnings) and the workers had converted beside it."""
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED[what])
    shm = set(os.listdir("/dev/shm"))
    done = subprocess.run([sys.executable, str(script), str(raw_images), str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("ddpipe.errors.DdpipeError: ") and "ended as they started" in last \
        and 'if __name__ == "__main__":' in last, done.stderr
    assert done.stderr.count("Traceback") == 1 and "warn" not in done.stderr.lower(), done.stderr
    assert set(os.listdir("/dev/shm")) <= shm
    if what == "convert":
        assert not (tmp_path / "out" / "index.json").exists()
