"""A user's own script under mpiexec: one rank's exception ends the whole job at once, whether the
script set the job up with ddpipe.distributed.init() or only made a Loader, and Ctrl-C to the
launcher leaves no process and no shared memory behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ddpipe

from ..conftest import BIN, mpiexec, torchrun
from ..helpers import alive

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("user_script_worker.py")
LOADER_ONLY = Path(__file__).with_name("loader_only_worker.py")


@pytest.fixture(scope="module")
def data(raw_images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faults") / "wds"
    ddpipe.convert(raw_images, root, ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    return root


@pytest.mark.parametrize(("ranks", "failing"), [(2, 1), (3, 0), (3, 2)])
def test_an_exception_on_one_rank_ends_the_job(data: Path, tmp_path: Path, ranks: int, failing: int) -> None:
    proc = mpiexec(ranks, WORKER, data, tmp_path, "raise", str(failing), timeout=120)
    ended = time.time()
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert output.count(f"RuntimeError: a bad thing on rank {failing}") == 1, output  # that rank's error, once
    # the others waited in a collective the failing rank never joined: without ending the job they would
    # have waited out the 300 s collective timeout
    assert ended - float((tmp_path / "raised_at").read_text()) < 15


@pytest.mark.parametrize(("ranks", "failing"), [(2, 0), (3, 2)])
def test_an_exception_in_a_script_with_only_a_loader_ends_the_job(data: Path, tmp_path: Path, ranks: int,
                                                                  failing: int) -> None:
    proc = mpiexec(ranks, LOADER_ONLY, data, tmp_path, "raise", str(failing), timeout=120)
    ended = time.time()
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert output.count(f"RuntimeError: a bad thing on rank {failing}") == 1, output
    assert f"ddpipe: rank {failing} raised RuntimeError: ending the job" in output, output
    # the others were reading on into an exchange round the failing rank never joined (a 300 s wait)
    assert ended - float((tmp_path / "raised_at").read_text()) < 15


@pytest.mark.parametrize("mode", ["raise", "raise-unhooked"])
def test_an_exception_in_a_loader_only_script_under_torchrun_ends_the_job(data: Path, tmp_path: Path,
                                                                          mode: str) -> None:
    proc = torchrun(2, LOADER_ONLY, data, tmp_path, mode, "1")
    ended = time.time()
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "RuntimeError: a bad thing on rank 1" in output, output
    # torchrun ends the others once the failing rank has exited; that rank does not wait at exit for
    # the others to leave ddpipe's group with it (they are inside an exchange round)
    assert ended - float((tmp_path / "raised_at").read_text()) < 30, output


def test_ending_the_job_on_an_exception_can_be_turned_off(data: Path, tmp_path: Path) -> None:
    proc = mpiexec(2, LOADER_ONLY, data, tmp_path, "hook", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("untouched=True") == 2, proc.stdout


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _new_segments(before: set[str]) -> set[str]:
    return _shm() - before  # ours (psm_), the decoder pool's semaphores (sem.mp-), MPICH's (mpich_shm_)


def _ended_whole(launcher: subprocess.Popen[str], ranks: list[int]) -> str:
    """The job's output, each of ``ranks`` first asked for its threads' stacks (the worker dumps them
    on SIGUSR2), then every process of the launcher's session killed."""
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR2)
    try:
        return launcher.communicate(timeout=5)[0]
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        return launcher.communicate()[0]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["wait", "wait-reading"])
def test_ctrl_c_to_the_launcher_leaves_nothing_behind(data: Path, tmp_path: Path, mode: str) -> None:
    """With PIL's worker processes, and with reading processes (``read_in="process"``): each is
    left running by the Ctrl-C, which is its rank's to answer, and ends with its rank."""
    exe = shutil.which("mpiexec", path=str(BIN))
    assert exe is not None
    before = _shm()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    # a session of its own: a job that outlives the test is killed whole, never left to the next test
    launcher = subprocess.Popen([exe, "-n", "2", sys.executable, str(WORKER), str(data), str(tmp_path), mode],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
    pid_files = [tmp_path / f"pids.{r}" for r in range(2)]
    deadline = time.monotonic() + 120
    while not all(f.exists() for f in pid_files) and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # polling for the ranks to get going, not a timing assertion
    if not all(f.exists() for f in pid_files):
        pytest.fail(_ended_whole(launcher, []))
    ranks = [json.loads(f.read_text()) for f in pid_files]
    pids = [pid for rank in ranks for pid in rank]
    assert len(pids) > 2  # the ranks and their decoders' worker processes, or their reading processes
    launcher.send_signal(signal.SIGINT)
    try:
        output, _ = launcher.communicate(timeout=60)  # a hang bound: it ends in seconds
    except subprocess.TimeoutExpired:
        where = _ended_whole(launcher, [rank[0] for rank in ranks])
        pytest.fail(f"the job outlived the Ctrl-C; where each rank's threads were:\n{where}")
    assert launcher.returncode != 0
    # workers die with their rank and the resource tracker unlinks what is left once the ranks are gone:
    # both happen just after the launcher returns, so wait (bounded) for them to be done
    settle = time.monotonic() + 20
    while time.monotonic() < settle and (any(map(alive, pids)) or _new_segments(before)):
        time.sleep(0.1)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:  # clean up before failing, never leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, output
    assert not _new_segments(before), output
    assert "reading process ended" not in output and "read_server" not in output, output


def test_a_pil_decoding_job_that_ends_on_a_damaged_shard_leaves_nothing_in_dev_shm(data: Path, tmp_path: Path) -> None:
    """The rank that reads the damaged shard ends the job; the launcher kills the others outright, with
    their decoder pools: none of them may leave a shared-memory batch (psm_) or a pool semaphore
    (sem.mp-) behind."""
    damaged = tmp_path / "wds"
    shutil.copytree(data, damaged)
    shard = sorted(damaged.glob("*.tar"))[1]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, other bytes: the manifest's digest no longer matches
    shard.write_bytes(bytes(raw))
    before = _shm()
    proc = mpiexec(2, "-m", "ddpipe", "train", damaged, "--model", "smallcnn", "--batch-size", "2", "--image-size",
                   "32", "--decode", "pil", timeout=120)
    assert proc.returncode != 0
    assert shard.name in proc.stderr, proc.stderr
    settle = time.monotonic() + 20  # the resource trackers of ranks killed outright go just after
    while time.monotonic() < settle and _new_segments(before):
        time.sleep(0.1)
    assert not _new_segments(before), proc.stderr
