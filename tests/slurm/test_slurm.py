"""Real Slurm: ``srun -N 2`` on ``ddpipe train`` and on a user's script, and ``sbatch`` on the example
job script across both nodes, on a two-node cluster of this machine (``make test-slurm`` installs and
starts it: tests/slurm/cluster.sh; the nodes are hosts mnode1 and mnode2, each with its own host name
and /dev/shm). Launcher and node detection under srun are proven here, not assumed."""

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
from ..helpers import make_dataset
from ..mpi.freezing import WORKER, freeze_mnode2
from ..train.test_stop import TRAIN, signal_once_training, stopped_step


def _cluster_up() -> str | None:
    """Why the Slurm tests cannot run here, or None when they can."""
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        return "Slurm is not installed here: `make test-slurm` installs it and starts a two-node cluster"
    try:
        probe = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 30 s: is the Slurm controller up? `make test-slurm` starts one"
    # a node still completing an earlier job is up: srun waits for it
    if probe.returncode != 0 or len(re.findall(r"idle|mixed|allocated|completing", probe.stdout)) < 1:
        return "no Slurm cluster answers (SLURM_CONF unset or its daemons stopped): run `make test-slurm`"
    return None


NOT_UP = _cluster_up()
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(NOT_UP is not None, reason=str(NOT_UP))]
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}


def srun(n: int, *args: str | os.PathLike[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``n`` tasks over both nodes, in blocks (ranks 0 to n/2 - 1 on mnode1)."""
    return subprocess.run(["srun", "-N", "2", "-n", str(n), "--distribution=block", "--mpi=pmi2", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=ENV)


@pytest.fixture(scope="module")
def data(raw_images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slurm") / "wds"
    ddpipe.convert(raw_images, root, ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    return root


def test_srun_ranks_are_one_world_on_two_nodes_found_through_mpi() -> None:
    code = ("import socket, ddpipe.distributed as d; j = d.init('cpu'); w = j.world; "
            "print('rank', j.rank, 'of', j.size, j.launcher, 'node', w.node, 'of', w.num_nodes, socket.gethostname(), "
            "flush=True)")
    proc = srun(4, sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.split("\n")[:4]) == [f"rank {r} of 4 mpi node {r // 2} of 2 mnode{r // 2 + 1}"
                                                   for r in range(4)]


def test_srun_ddpipe_train(data: Path, tmp_path: Path) -> None:
    proc = srun(4, sys.executable, "-m", "ddpipe", "train", data, "--model", "smallcnn", "--batch-size", "2",
                "--image-size", "32", "--decode", "dali-cpu", "--stage-dir", tmp_path / "local-{node}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "on 4 rank(s)" in proc.stdout and "epoch 0:" in proc.stdout
    assert list((tmp_path / "local-0").rglob("*.tar")) and list((tmp_path / "local-1").rglob("*.tar"))


def test_srun_user_script_trains_as_under_mpiexec(data: Path) -> None:
    """The same 4 ranks on the same 2 hosts, the same ranks on each: the same losses."""
    under_srun = srun(4, sys.executable, SCRIPT, data, *ARGS)
    assert under_srun.returncode == 0, under_srun.stdout + under_srun.stderr
    under_mpiexec = mpiexec(4, SCRIPT, data, *ARGS, timeout=300, hosts=2)
    assert under_mpiexec.returncode == 0, under_mpiexec.stdout + under_mpiexec.stderr
    assert losses(under_srun.stdout) == pytest.approx(losses(under_mpiexec.stdout), abs=1e-5)
    assert losses(under_srun.stdout)


@pytest.mark.parametrize("decoding", [[], ["--decode", "pil"], ["--read-in", "process"]])
def test_scancel_signal_stops_training_after_one_step_on_both_nodes_with_its_checkpoint(data: Path, tmp_path: Path,
                                                                                      decoding: list[str]) -> None:
    """Slurm's warning before a time limit (``--signal=USR1@SECONDS``, as the example asks) or an
    operator's ``scancel --signal``: slurmstepd signals every process of the step on both nodes, at
    whatever step each task is, decoding workers and reading processes included (which leave it to
    their rank); all ranks stop after the same step, and the job resumes from it."""
    import torch

    name, ckpt = f"ddpipe-stop-{os.getpid()}", tmp_path / "ck.pt"
    train = ["srun", "-N", "2", "-n", "4", "--distribution=block", "--mpi=pmi2", f"--job-name={name}", sys.executable,
             "-m", "ddpipe", "train", str(data), *TRAIN, *decoding, "--checkpoint", str(ckpt)]

    def scancel(_: int) -> None:
        job = subprocess.run(["squeue", "-h", "-o", "%i", "-n", name], capture_output=True, text=True, env=ENV,
                             timeout=60, check=True).stdout.split()
        subprocess.run(["scancel", "--signal=USR1", *job], env=ENV, timeout=60, check=True)

    proc, lines = signal_once_training([*train, "--epochs", "100"], ENV, scancel)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    step = stopped_step(lines)
    assert f"stopped after step {step} (SIGUSR1); checkpoint {ckpt}" in proc.stdout
    assert torch.load(ckpt, weights_only=True)["step"] == step
    rest = subprocess.run([*train, "--epochs", "1"], capture_output=True, text=True, timeout=300, env=ENV)
    assert rest.returncode == 0 and f"resumed from {ckpt}: " in rest.stdout and f"step {step}, " in rest.stdout, \
        rest.stdout + rest.stderr


def test_sbatch_the_example_job_script(data: Path, tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    settings = {"DATA": data, "EVAL": "", "LOCAL": tmp_path / "local-{node}", "MODEL": "smallcnn", "EPOCHS": 1,
                "BATCH": 4, "TRAIN_FLAGS": "--image-size 32 --decode dali-cpu", "CHECKPOINT": tmp_path / "ck.pt",
                "SRUN": "srun --mpi=pmi2"}
    export = "ALL," + ",".join(f"{k}={v}" for k, v in settings.items())
    proc = subprocess.run(["sbatch", "--wait", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--cpus-per-task=1",
                           "--gpus-per-node=0", f"--output={log}", f"--export={export}",
                           str(REPO / "examples" / "slurm_train.sh")],
                          capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp_path)
    output = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + output
    assert "on 4 rank(s)" in output and "epoch 0:" in output
    assert (tmp_path / "ck.pt").exists()
    assert list((tmp_path / "local-0").rglob("*.tar")) and list((tmp_path / "local-1").rglob("*.tar"))


def test_sbatch_the_decode_service_example_as_a_heterogeneous_job(data: Path, tmp_path: Path) -> None:
    """examples/slurm_decode_service.sh: its first component (mnode1) serves, its second (mnode2)
    trains on two ranks, addressing the servers by the names the script reads from the job's node
    list. The sizes are given on sbatch's command line, one set per component (``:``), over the
    script's own (CPU and GPU partitions, 4 and 8 nodes)."""
    from ..storage.servers import free_port

    log, port = tmp_path / "job.out", free_port()
    settings = {"DATA": data, "MODEL": "smallcnn", "EPOCHS": 4, "BATCH": 2, "PORT": port, "WORKERS": 1,
                "TRAIN_FLAGS": "--image-size 32 --decode dali-cpu --log-every 0"}
    export = "ALL," + ",".join(f"{k}={v}" for k, v in settings.items())
    serving = ["--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--partition=debug", "--nodelist=mnode1",
               "--wait", f"--output={log}", f"--export={export}"]
    training = ["--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0",
                "--partition=debug", "--nodelist=mnode2"]
    proc = subprocess.run(["sbatch", *serving, ":", *training, str(REPO / "examples" / "slurm_decode_service.sh")],
                          capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp_path)
    output = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + output
    assert "on 2 rank(s)" in output and f"on decode servers tcp://mnode1:{port}" in output, output
    # the trainers decode on their own until the server has loaded its decoders (a few seconds): most
    # batches, not every one, are the server's
    served = [int(n) for n in re.findall(r"decode servers (\d+) of \d+ batches", output)]
    assert len(served) == 4 and sum(served) > 0, output
    assert (tmp_path / "smallcnn.ckpt").exists()


def test_a_frozen_node_is_named_and_the_step_ends_before_the_collective_timeout(tmp_path: Path) -> None:
    """mnode2's tasks and its slurmstepd stopped: a rank on mnode1 names the node after 20 s of
    silence; srun then waits its KillWait (5 s on this cluster, 30 s by default) for the frozen
    node's tasks and gives up."""
    data = make_dataset(tmp_path / "wds", "wds", [40] * 8, payload=2000)
    command = ["srun", "-N", "2", "-n", "4", "--distribution=block", "--mpi=pmi2", sys.executable, str(WORKER),
               str(data), "freeze"]
    job = freeze_mnode2(command, ENV)
    assert job.returncode != 0
    assert "host mnode2 (ranks 2, 3)" in job.stderr and "no sign of life" in job.stderr, job.stderr
    # a hang bound, not a speed: it takes ~25 s (20 s of silence, then KillWait); without the naming the step
    # would wait out the 300 s collective timeout. Far from both, so that a loaded machine does not fail it
    assert job.seconds < 150, f"the step ended {job.seconds:.0f} s after its node froze"
