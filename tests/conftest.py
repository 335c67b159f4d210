"""Shared fixtures: small generated data, so the suite runs in minutes on two cores."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpipe.synth import SynthOptions, synth

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def raw_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder of 24 real JPEGs in 3 classes (small images, to keep the suite fast)."""
    root = tmp_path_factory.mktemp("raw") / "images"
    synth(root, SynthOptions(n=24, classes=3, seed=7, long_side=160, progress=False))
    return root


@pytest.fixture
def raw_copy(raw_images: Path, tmp_path: Path) -> Path:
    """A private copy of :func:`raw_images` that a test may damage."""
    dest = tmp_path / "images"
    shutil.copytree(raw_images, dest)
    return dest


def launch(cmd: list[str], timeout: float, env: dict[str, str] | None = None,
           cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to its end, as ``subprocess.run`` with captured text output would, in a process
    group of its own: a launch that outlives ``timeout`` is killed with every process it started
    (``subprocess.run`` kills only the launcher, and a hung job's ranks lived on after the suite)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_cli(*args: str | os.PathLike[str], check: bool = False, timeout: float = 120,
            cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ddpipe ARGS`` in a fresh process, as a user would."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = launch([sys.executable, "-m", "ddpipe", *map(str, args)], timeout, env, cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"ddpipe {args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


SSH_NS = REPO / "tests" / "hosts" / "ssh-ns"
HOST_NAMES = REPO / "tests" / "hosts" / "names.sh"


@pytest.fixture(scope="session", autouse=True)
def host_names() -> Iterator[None]:
    """mnode1-3 in /etc/hosts for the session, as a cluster's DNS would give the hosts that
    ``mpiexec(hosts=)`` makes (as root; what was there already is left as it was)."""
    added = False
    if os.geteuid() == 0:
        done = subprocess.run([str(HOST_NAMES), "add"], capture_output=True, text=True, check=False)
        added = done.stdout.strip() == "added"
    yield
    if added:
        subprocess.run([str(HOST_NAMES), "remove"], check=False)


# what a launcher leaves in the temporary directory when its job is aborted or killed, as the fault
# tests do on purpose: hydra's topology file (removed only at a clean exit), torchrun's run directory
LAUNCHER_LEFTOVERS = ("hydra_hwloc_xmlfile_*", "torchelastic_*")


@pytest.fixture(scope="session", autouse=True)
def launcher_leftovers_removed() -> Iterator[None]:
    """The session's aborted launches left ~25 such files a run in /tmp: those made during the
    session are removed at its end (the suite runs its launches one at a time, all ended by then)."""
    import tempfile

    tmp = Path(tempfile.gettempdir())
    before = {p for pattern in LAUNCHER_LEFTOVERS for p in tmp.glob(pattern)}
    yield
    for path in {p for pattern in LAUNCHER_LEFTOVERS for p in tmp.glob(pattern)} - before:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def mpiexec(n: int, *args: str | os.PathLike[str], timeout: float = 180, nodes: int | None = None,
            hosts: int | None = None) -> subprocess.CompletedProcess[str]:
    """Launch ``n`` real MPI ranks of ``python ARGS`` with the mpich wheel's mpiexec. ``nodes``: split
    them into that many nodes, as MPI itself sees nodes (MPICH's cliques: rank r is on node r % nodes).
    ``hosts``: run them on that many real hosts instead, ``n / hosts`` each in rank order (hydra's ssh
    launcher through ``tests/hosts/ssh-ns``: hosts mnode1... with their own host name and /dev/shm,
    talking over TCP)."""
    return launch(mpiexec_command(n, *args, hosts=hosts), timeout, mpiexec_env(nodes))


def mpiexec_command(n: int, *args: str | os.PathLike[str], hosts: int | None = None) -> list[str]:
    exe = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
    if exe is None:
        raise AssertionError("mpiexec not found: install ddpipe[mpi] (make test does)")
    where: list[str] = []
    if hosts is not None:
        if os.geteuid() != 0:
            pytest.fail("multi-host tests need root: tests/hosts/ssh-ns makes each host with unshare")
        where = ["-launcher", "ssh", "-launcher-exec", str(SSH_NS),
                 "-hosts", ",".join(f"127.0.0.{k + 2}" for k in range(hosts)), "-ppn", str(-(-n // hosts))]
    return [exe, *where, "-n", str(n), sys.executable, *map(str, args)]


def mpiexec_env(nodes: int | None = None) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    if nodes is not None:
        env["MPIR_CVAR_NUM_CLIQUES"] = str(nodes)
    return env


def torchrun(n: int, *args: str | os.PathLike[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Launch ``n`` processes of ``python ARGS`` on this node under torchrun (one thread each)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    return launch([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
                   *map(str, args)], timeout, env)


def dir_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative name -> bytes), to compare outputs byte for byte."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
