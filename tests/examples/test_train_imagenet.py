"""examples/train_imagenet.py as users run it: plain python, mpiexec and torchrun, each gradient path,
the same losses under both launchers for the same seed, and a resume mid-epoch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import ddpipe

from ..conftest import REPO, mpiexec, torchrun

pytestmark = pytest.mark.mpi
SCRIPT = REPO / "examples" / "train_imagenet.py"
ARGS = ["--model", "smallcnn", "--epochs", "2", "--batch-size", "4", "--image-size", "32", "--decode", "dali-cpu",
        "--log-every", "1", "--warmup-epochs", "1", "--seed", "3"]


@pytest.fixture(scope="module")
def data(raw_images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("example") / "wds"
    ddpipe.convert(raw_images, root, ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    return root


def losses(stdout: str) -> list[float]:
    return [float(x) for x in re.findall(r"step \d+/\d+: .* loss ([\d.]+)", stdout)]


@pytest.fixture(scope="module")
def under_mpiexec(data: Path) -> str:
    proc = mpiexec(2, SCRIPT, data, "--val", data, *ARGS, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_plain_python_trains(data: Path) -> None:
    proc = subprocess.run([sys.executable, SCRIPT, data, *ARGS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(losses(proc.stdout)) == 2 * 6 and "first batch after" in proc.stdout  # 24 images, batches of 4


def test_mpiexec_trains_evaluates_and_reports_every_rank(under_mpiexec: str) -> None:
    assert len(losses(under_mpiexec)) == 2 * 3  # 12 images a rank
    assert under_mpiexec.count("top-1") == 2
    assert all(len(re.findall(r"\d+%", ln.split("per rank")[1])) == 2
               for ln in under_mpiexec.splitlines() if "per rank" in ln)


def test_same_seed_same_losses_under_mpiexec_and_torchrun(data: Path, under_mpiexec: str) -> None:
    proc = torchrun(2, SCRIPT, data, "--val", data, *ARGS, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert losses(proc.stdout) == pytest.approx(losses(under_mpiexec), abs=1e-5)


def test_mpi_averaging_trains_like_ddp(data: Path, under_mpiexec: str) -> None:
    proc = mpiexec(2, SCRIPT, data, *ARGS, "--averaging", "mpi", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert losses(proc.stdout) == pytest.approx(losses(under_mpiexec), abs=1e-4)  # the same averages


def test_resume_mid_epoch_continues_as_if_never_stopped(data: Path, under_mpiexec: str, tmp_path: Path) -> None:
    ckpt = tmp_path / "runs" / "ckpt.pt"  # in a directory not made yet: the first save raised, after the steps
    first = mpiexec(2, SCRIPT, data, *ARGS, "--checkpoint", ckpt, "--max-steps", "2", timeout=300)
    assert first.returncode == 0 and "stopped at step 2" in first.stdout, first.stdout + first.stderr
    rest = mpiexec(2, SCRIPT, data, *ARGS, "--checkpoint", ckpt, timeout=300)
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert "resumed from" in rest.stdout and "1 batches left" in rest.stdout
    steps = re.findall(r"epoch (\d) step (\d+/\d+)", rest.stdout)
    assert steps == [("0", "1/1"), ("1", "1/3"), ("1", "2/3"), ("1", "3/3")]  # the rest of epoch 0, then epoch 1
    # the rest of epoch 0 is re-planned (the same samples, not necessarily the same batches), so the
    # weights differ slightly from an uninterrupted run's, but training goes on from where it was
    assert losses(rest.stdout)[-3:] == pytest.approx(losses(under_mpiexec)[-3:], abs=0.02)


def test_a_signal_to_one_rank_stops_every_rank_after_one_step_with_a_checkpoint(data: Path, tmp_path: Path) -> None:
    """The script's loop in ddpipe.distributed.stop_on_signals: a SIGTERM that reaches one torchrun
    worker alone stops both after the same step, with that step saved."""
    import os
    import signal

    import torch

    from ..train.test_stop import signal_once_training, to_rank

    ckpt = tmp_path / "ckpt.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
               str(data), *ARGS, "--epochs", "100", "--checkpoint", str(ckpt)]
    proc, lines = signal_once_training(command, {**os.environ, "OMP_NUM_THREADS": "1"}, to_rank(1, signal.SIGTERM))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stopped = [ln.split()[3] for ln in lines if ln.startswith("stopped at step ")]
    assert len(stopped) == 1 and f"stopped at step {stopped[0]} (asked by a signal)" in proc.stdout, proc.stdout
    assert torch.load(ckpt, weights_only=False)["step"] == int(stopped[0])


def test_two_hosts_train_as_two_ranks_on_one(data: Path, under_mpiexec: str) -> None:
    """One rank on each of two real hosts (tests/hosts/ssh-ns): DDP's rendezvous finds rank 0 by its
    host name, gradients cross hosts over TCP, and the losses are those of the one-host job."""
    proc = mpiexec(2, SCRIPT, data, "--val", data, *ARGS, timeout=300, hosts=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert losses(proc.stdout) == pytest.approx(losses(under_mpiexec), abs=1e-5)


def held_out(raw_images: Path, root: Path, rename: dict[str, str]) -> Path:
    """A validation set converted on its own from some of ``raw_images``' class folders, named anew."""
    import shutil

    images = root / "images"
    for old, new in rename.items():
        shutil.copytree(raw_images / old, images / new)
    ddpipe.convert(images, root / "wds", ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    return root / "wds"


def test_a_validation_set_of_some_classes_is_scored_by_class_name(data: Path, raw_images: Path,
                                                                  tmp_path: Path) -> None:
    """Converted on its own, a validation set of the last class alone numbers it 0: it was refused
    ('names other classes'); scored by name, each rank's images count once."""
    names = sorted(p.name for p in raw_images.iterdir() if p.is_dir())
    val = held_out(raw_images, tmp_path, {names[-1]: names[-1]})
    assert ddpipe.open_dataset(val).classes == (names[-1],)
    proc = mpiexec(2, SCRIPT, data, "--val", val, *ARGS, "--epochs", "1", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"epoch 0: top-1 [\d.]+% of 8 images", proc.stdout), proc.stdout


def test_a_validation_class_the_training_set_lacks_is_one_line_from_the_job_not_a_traceback(
        data: Path, raw_images: Path, tmp_path: Path) -> None:
    names = sorted(p.name for p in raw_images.iterdir() if p.is_dir())
    val = held_out(raw_images, tmp_path, {names[0]: names[0], names[1]: "zebra"})
    proc = mpiexec(2, SCRIPT, data, "--val", val, *ARGS, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"train_imagenet.py: error: {val}: "), proc.stderr
    assert "('zebra')" in proc.stderr and "step" not in proc.stdout
