"""Freezing one host of a running job, as a hung node would: every process of the job on it stopped
(SIGSTOP), its launcher daemon included; or killing them, as a node that dies. Used under mpiexec
and under srun."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

WORKER = Path(__file__).with_name("frozen_worker.py")


@dataclass
class Frozen:
    returncode: int
    stderr: str
    seconds: float  # from the freeze to the job's end


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def freeze_mnode2(command: list[str], env: dict[str, str], ranks: int = 4,
                  how: signal.Signals = signal.SIGSTOP) -> Frozen:
    """Start ``command`` (a launch of WORKER in "freeze" mode on hosts mnode1 and mnode2), freeze
    mnode2 once every rank has a batch (``how``: SIGKILL makes the host die instead), and wait for the
    job to end (120 s at most); the frozen processes are killed afterwards, never left behind."""
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           start_new_session=True)
    frozen: list[int] = []
    try:
        assert job.stdout is not None
        said = ""
        while len(ready := re.findall(r"ready (\d+) (\d+) (mnode\d)", said)) < ranks:  # ranks' lines may merge
            line = job.stdout.readline()
            assert line, said  # the job runs until stopped: it ends only by failing
            said += line
        pids = [int(pid) for _, pid, host in ready if host == "mnode2"]
        assert pids, said
        frozen = [*pids, parent(pids[0])]  # the host's ranks and the launcher's daemon there (proxy, slurmstepd)
        for pid in frozen:
            os.kill(pid, how)
        stopped = time.monotonic()
        _, err = job.communicate(timeout=120)  # a hang bound; callers check the promise
        return Frozen(job.returncode, err, time.monotonic() - stopped)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
