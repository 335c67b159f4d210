"""``ddpipe train`` asked to stop by a signal (a scheduler's SIGTERM before it kills a job, Slurm's
``--signal=USR1@...``) stops after one step on every rank, saves that step, and resumes from it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import ddpipe
from ddpipe.train.stop import StopRequest

from ..conftest import mpiexec_command, mpiexec_env, run_cli
from ..decode.images import labelled_samples
from ..helpers import descendants

TRAIN = ["--model", "smallcnn", "--batch-size", "2", "--image-size", "32", "--decode", "dali-cpu", "--dtype", "uint8",
         "--device", "cpu", "--log-every", "1"]
HANG_BOUND = 240  # seconds: a job that stops runs for a few; ranks that stopped at different steps never end


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stop") / "wds"
    ddpipe.write_dataset(root, iter(labelled_samples(48, np.random.default_rng(8))), samples_per_shard=12,
                         classes=[str(c) for c in range(6)])
    return root


def signal_once_training(command: list[str], env: dict[str, str], send: Callable[[int], object]
                         ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``command`` (a ``ddpipe train`` of many epochs), ``send`` a signal (given the launcher's process)
    once the job's second progress line is out, and wait for the job's end."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True) as proc:
        timer = threading.Timer(HANG_BOUND, os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        try:
            assert proc.stdout is not None and proc.stderr is not None
            lines: list[str] = []
            for line in proc.stdout:
                lines.append(line)
                if sum(" step " in ln for ln in lines) == 2:
                    send(proc.pid)
                    break
            lines += proc.stdout.readlines()
            err = proc.stderr.read()
            proc.wait()
        finally:
            timer.cancel()
    return subprocess.CompletedProcess(command, proc.returncode, "".join(lines), err), lines


def to_rank(rank: int, signum: int) -> Callable[[int], None]:
    """Sending ``signum`` to the process of ``rank`` alone, given the launcher's process."""
    return lambda launcher: os.kill(rank_process(launcher, rank), signum)


def rank_process(launcher: int, rank: int) -> int:
    """The process of ``rank``: the launcher itself when it is the only rank, else the first of its
    descendants (a generation at a time: a rank before its own workers, which inherit its environment)
    whose environment says that rank, as MPI's process managers and torchrun set it."""
    says = {f"PMI_RANK={rank}".encode(), f"RANK={rank}".encode()}
    if rank == 0 and not says & set(Path(f"/proc/{launcher}/environ").read_bytes().split(b"\0")):
        return launcher
    for pid in descendants(launcher):
        try:
            env = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if says & env:
            return pid
    raise AssertionError(f"no process of rank {rank} under {launcher}")


def stopped_step(lines: list[str]) -> int:
    said = [ln for ln in lines if ln.startswith("stopped after step ")]
    assert len(said) == 1, lines
    return int(said[0].split()[3])


def test_a_sigterm_stops_after_a_step_with_its_checkpoint_and_training_resumes_from_it(data: Path,
                                                                                          tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    command = [sys.executable, "-m", "ddpipe", "train", str(data), *TRAIN, "--epochs", "100", "--checkpoint",
               str(ckpt)]
    proc, lines = signal_once_training(command, dict(os.environ), to_rank(0, signal.SIGTERM))
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    step = stopped_step(lines)
    assert f"stopped after step {step} (SIGTERM); checkpoint {ckpt}" in proc.stdout
    assert torch.load(ckpt, weights_only=True)["step"] == step
    rest = run_cli("train", data, *TRAIN, "--epochs", "1", "--checkpoint", ckpt, timeout=300)
    assert rest.returncode == 0 and f"resumed from {ckpt}: epoch {(step - 1) // 24}, step {step}" in rest.stdout, \
        rest.stdout + rest.stderr


@pytest.mark.mpi
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step(data: Path, tmp_path: Path) -> None:
    """Rank 1 alone is told (SIGUSR1, as Slurm's --signal sends it): rank 0, which saves the checkpoint,
    stops after the same step; a rank that stopped alone would leave the other in its next allreduce."""
    ckpt = tmp_path / "ckpt.pt"
    command = mpiexec_command(2, "-m", "ddpipe", "train", data, *TRAIN, "--epochs", "100", "--checkpoint", ckpt)
    proc, lines = signal_once_training(command, mpiexec_env(), to_rank(1, signal.SIGUSR1))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    step = stopped_step(lines)
    assert f"stopped after step {step} (a signal to another rank); checkpoint {ckpt}" in proc.stdout
    assert torch.load(ckpt, weights_only=True)["step"] == step
    rest = subprocess.run(mpiexec_command(2, "-m", "ddpipe", "train", data, *TRAIN, "--epochs", "1", "--checkpoint",
                                          ckpt), env=mpiexec_env(), capture_output=True, text=True, timeout=300)
    assert rest.returncode == 0 and f"resumed from {ckpt}: epoch {(step - 1) // 12}, step {step}" in rest.stdout, \
        rest.stdout + rest.stderr


def test_the_first_signal_asks_and_the_second_would_end_the_process() -> None:
    """After one signal is caught, the default action is back: a job stuck where no step ends can still
    be stopped by a second. And the handlers that were there before are put back."""
    before = signal.getsignal(signal.SIGUSR1)
    request = StopRequest()
    uncatch = request.catch((signal.SIGUSR1,))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert request.signum == signal.SIGUSR1 and request.name == "SIGUSR1"
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    finally:
        uncatch()
    assert signal.getsignal(signal.SIGUSR1) == before


@pytest.mark.mpi
def test_a_script_without_torch_distributed_may_stop_on_signals(tmp_path: Path) -> None:
    """A script that init()ed with process_group=False (averaging over MPI needs none): the vote's
    gloo group is made from the default one, which stop_on_signals now sets up; it was torch's
    "Default process group has not been initialized"."""
    script = tmp_path / "steps.py"
    script.write_text("import ddpipe.distributed as d\n"
                      "job = d.init('cpu', process_group=False)\n"
                      "with d.stop_on_signals(job) as stop:\n"
                      "    agreed = [stop.agreed() for _ in range(3)]\n"
                      f"open(f'{tmp_path}/rank{{job.rank}}.txt', 'w').write(str(agreed))\n")  # lines may merge
    proc = subprocess.run(mpiexec_command(2, script), env=mpiexec_env(), capture_output=True, text=True,
                          timeout=HANG_BOUND)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["[False, False, False]"] * 2
