"""Real Slurm: ``srun`` on ``ddpipe train`` and on a user's script, and ``sbatch`` on the example job
script, on a one-node cluster of this machine (``make test-slurm`` installs and starts it:
tests/slurm/cluster.sh). Launcher detection under srun is proven here, not assumed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ddpipe

from ..conftest import BIN, REPO, mpiexec
from ..examples.test_train_imagenet import ARGS, SCRIPT, losses


def _cluster_up() -> str | None:
    """Why the Slurm tests cannot run here, or None when they can."""
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        return "Slurm is not installed here: `make test-slurm` installs it and starts a one-node cluster"
    try:
        probe = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 30 s: is the Slurm controller up? `make test-slurm` starts one"
    if probe.returncode != 0 or not re.search(r"idle|mixed|allocated", probe.stdout):
        return "no Slurm cluster answers (SLURM_CONF unset or its daemons stopped): run `make test-slurm`"
    return None


NOT_UP = _cluster_up()
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(NOT_UP is not None, reason=str(NOT_UP))]
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}


def srun(n: int, *args: str | os.PathLike[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["srun", "-n", str(n), "--mpi=pmi2", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


@pytest.fixture(scope="module")
def data(raw_images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slurm") / "wds"
    ddpipe.convert(raw_images, root, ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    return root


def test_srun_ranks_are_one_world_found_through_mpi() -> None:
    code = ("import ddpipe.distributed as d; j = d.init('cpu'); "
            "print('rank', j.rank, 'of', j.size, j.launcher, j.world.local_size, flush=True)")
    proc = srun(2, sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.split("\n")[:2]) == ["rank 0 of 2 mpi 2", "rank 1 of 2 mpi 2"]


def test_srun_ddpipe_train(data: Path, tmp_path: Path) -> None:
    proc = srun(2, sys.executable, "-m", "ddpipe", "train", data, "--model", "smallcnn", "--batch-size", "4",
                "--image-size", "32", "--decode", "dali-cpu", "--stage-dir", tmp_path / "local")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "on 2 rank(s)" in proc.stdout and "epoch 0:" in proc.stdout


def test_srun_user_script_trains_as_under_mpiexec(data: Path) -> None:
    under_srun = srun(2, sys.executable, SCRIPT, data, *ARGS)
    assert under_srun.returncode == 0, under_srun.stdout + under_srun.stderr
    under_mpiexec = mpiexec(2, SCRIPT, data, *ARGS, timeout=300)
    assert under_mpiexec.returncode == 0, under_mpiexec.stdout + under_mpiexec.stderr
    assert losses(under_srun.stdout) == pytest.approx(losses(under_mpiexec.stdout), abs=1e-5)
    assert len(losses(under_srun.stdout)) == 2 * 3


def test_sbatch_the_example_job_script(data: Path, tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    settings = {"DATA": data, "EVAL": "", "LOCAL": tmp_path / "local-{node}", "MODEL": "smallcnn", "EPOCHS": 1,
                "BATCH": 4, "TRAIN_FLAGS": "--image-size 32 --decode dali-cpu", "CHECKPOINT": tmp_path / "ck.pt",
                "SRUN": "srun --mpi=pmi2"}
    export = "ALL," + ",".join(f"{k}={v}" for k, v in settings.items())
    proc = subprocess.run(["sbatch", "--wait", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=1",
                           "--gpus-per-node=0", f"--output={log}", f"--export={export}",
                           str(REPO / "examples" / "slurm_train.sh")],
                          capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp_path)
    output = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + output
    assert "on 2 rank(s)" in output and "epoch 0:" in output
    assert (tmp_path / "ck.pt").exists() and list((tmp_path / "local-0").rglob("*.tar"))
