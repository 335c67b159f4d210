"""``ddpipe train --checkpoint`` on two real hosts (tests/hosts/ssh-ns) whose node-local storage
differs: rank 0 writes the checkpoint, so rank 0 alone need see its path, and every rank resumes from
what rank 0 read. Each host has its own /dev/shm."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ddpipe

from ..conftest import mpiexec, run_cli
from ..decode.images import labelled_samples
from .test_train_command import TRAIN

pytestmark = pytest.mark.mpi

HOST_LOCAL = Path("/dev/shm/ddpipe-test-checkpoints")
ON_HOSTS = Path(__file__).parents[1] / "hosts" / "on_hosts.py"
CHECKPOINT = HOST_LOCAL / "ckpt.pt"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hosts") / "wds"
    samples = labelled_samples(24, np.random.default_rng(5))
    ddpipe.write_dataset(root, iter(samples), samples_per_shard=8, classes=[str(c) for c in range(6)])
    return root


def train_on_two_hosts(dataset: Path, setup: dict[str, list[list[str]]]) -> tuple[int, str, str]:
    proc = mpiexec(4, ON_HOSTS, json.dumps(setup), "train", dataset, *TRAIN, "--epochs", "2", "--checkpoint",
                   CHECKPOINT, timeout=240, hosts=2)
    return proc.returncode, proc.stdout, proc.stderr


def test_every_rank_resumes_from_the_checkpoint_on_rank_0s_node(data: Path, tmp_path: Path) -> None:
    """The checkpoint on mnode1's local storage alone: mnode2's ranks had started afresh beside a rank
    0 that resumed, and the job failed in the exchange with a traceback."""
    saved = tmp_path / "ckpt.pt"
    first = run_cli("train", data, *TRAIN, "--max-steps", "1", "--checkpoint", saved, timeout=300)
    assert first.returncode == 0 and saved.exists(), first.stdout + first.stderr
    code, out, err = train_on_two_hosts(data, {"mnode1": [["mkdir", str(HOST_LOCAL)],
                                                          ["copy", str(saved), str(CHECKPOINT)]],
                                               "mnode2": [["mkdir", str(HOST_LOCAL)]]})
    assert code == 0 and "Traceback" not in err, out + err
    assert f"resumed from {CHECKPOINT}: epoch 0, step 1," in out and "epoch 1:" in out, out


def test_a_checkpoint_directory_only_rank_0_sees_will_do_and_one_it_lacks_is_said_once_for_the_job(
        data: Path) -> None:
    """mnode2's ranks had refused a directory only they lacked, before MPI's start, and mnode1's ranks
    waited for them there until killed."""
    code, out, err = train_on_two_hosts(data, {"mnode1": [["mkdir", str(HOST_LOCAL)]]})
    assert code == 0 and "epoch 1:" in out, out + err
    code, out, err = train_on_two_hosts(data, {"mnode2": [["mkdir", str(HOST_LOCAL)]]})
    assert code == 1 and "Traceback" not in err, out + err
    said = f"ddpipe: error: {HOST_LOCAL}: the directory for --checkpoint does not exist"
    assert err.count(said) == 1 and err.count("ddpipe: error:") == 1, err  # every rank refused it: rank 0 says so
