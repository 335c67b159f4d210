"""Staging with real ranks: one copy per node, made by local rank 0, every sample once per epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import mpiexec
from ..helpers import make_dataset

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("stage_worker.py")


@pytest.mark.parametrize(("ranks", "capacity"), [(3, None), (2, 3 * 13 * 2600)])
def test_one_copy_per_node_and_exactly_once(tmp_path: Path, ranks: int, capacity: int | None) -> None:
    data = make_dataset(tmp_path / "src", "wds", [13] * 8, payload=2048)
    out = tmp_path / "report.json"
    args = [data, tmp_path / "stage", out] + ([str(capacity)] if capacity else [])
    proc = mpiexec(ranks, WORKER, *args, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert [r["local_rank"] for r in report] == list(range(ranks))  # one node here
    assert all(r["copied"] == 0 for r in report[1:])  # only local rank 0 copies
    if capacity is None:
        assert report[0]["copied"] == 8  # each shard once, and reused by the second (sticky) epoch
    else:
        assert report[0]["copied"] > 8  # the share does not fit: evicted shards come back next epoch
    for epoch in range(2):
        seen = [k for r in report for k in r["epochs"][epoch]]
        assert len(set(seen)) == 104  # every sample, every epoch
        assert len(seen) == ranks * -(-104 // ranks)  # and copies only as the documented padding


@pytest.mark.parametrize("shuffle", ["local", "partial"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_of_one_node_with_different_staging_directories_are_refused(tmp_path: Path, ranks: int,
                                                                          shuffle: str) -> None:
    import time

    data = make_dataset(tmp_path / "wds", "wds", [13] * 6, payload=2600)
    code = ("import sys, ddpipe; from ddpipe.comm import init_comm; c = init_comm(timeout=300); "
            f"d = sys.argv[2] + ('/b' if c.world.rank == {ranks - 1} else '/a'); "
            f"list(ddpipe.EncodedStream(sys.argv[1], 4, shuffle='{shuffle}', stage_dir=d, comm=c))")
    t0 = time.monotonic()
    proc = mpiexec(ranks, "-c", code, data, tmp_path / "stage", timeout=200)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert "different staging directories" in proc.stderr and "/a" in proc.stderr and "/b" in proc.stderr
    assert proc.stderr.count("Traceback") <= ranks  # each rank says it once
    assert elapsed < 100  # refused at start, not after the 300 s collective timeout (it takes ~2 s)


def test_a_job_with_a_capacity_beside_another_staging_the_same_dataset_is_refused_on_every_rank(
        tmp_path: Path) -> None:
    """Only local rank 0 can see the other job's lock; every rank refuses and leaves (rank 0 says why), none is
    aborted."""
    import subprocess
    import sys

    data = make_dataset(tmp_path / "wds", "wds", [13] * 6, payload=2600)
    code = ("import sys, ddpipe; l = ddpipe.EncodedStream(sys.argv[1], 4, stage_dir=sys.argv[2]); "
            "print('staging', flush=True); sys.stdin.read()")
    other = subprocess.Popen([sys.executable, "-c", code, str(data), str(tmp_path / "stage")], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert other.stdout is not None and other.stdout.readline() == "staging\n"
        proc = mpiexec(2, "-m", "ddpipe", "stage", data, "--local-dir", tmp_path / "stage", "--capacity",
                       str(3 * 13 * 2600), "--quiet", timeout=200)
    finally:
        other.communicate("", timeout=60)
    # every rank refuses it alike: rank 0 says so for the job
    said = proc.stderr.count("ddpipe: error: another job stages this dataset")
    assert proc.returncode != 0 and said == 1 and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("hosts", [None, 2])
def test_ctrl_c_while_staging_from_a_slow_source_ends_at_once(tmp_path: Path, hosts: int | None) -> None:
    """On one host, and on two real hosts (each node staging its own copy): the launcher's SIGINT ends
    every rank now, not when the node's staging is done."""
    import signal
    import subprocess
    import time

    from ..conftest import mpiexec_command, mpiexec_env
    from ..helpers import alive, descendants

    data = make_dataset(tmp_path / "wds", "wds", [50] * 8, payload=100_000)  # 40 MB at 200 KB/s: 200 s
    command = mpiexec_command(2 * (hosts or 1), "-m", "ddpipe", "stage", data, "--local-dir",
                              tmp_path / "local" / "node{node}", "--source-throttle", "200KB/s", "--quiet", hosts=hosts)
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=mpiexec_env())
    deadline = time.monotonic() + 60
    while not list((tmp_path / "local").rglob("*.tar*")) and time.monotonic() < deadline:
        time.sleep(0.1)  # until a copy is under way
    ranks = descendants(launcher.pid)
    launcher.send_signal(signal.SIGINT)
    output, _ = launcher.communicate(timeout=60)  # a hang bound: the staging it interrupts would take 200 s
    assert launcher.returncode != 0 and "interrupted" in output, output
    settle = time.monotonic() + 20  # the launcher's proxies and the ranks go just after it returns
    while any(map(alive, ranks)) and time.monotonic() < settle:
        time.sleep(0.1)
    assert not [pid for pid in ranks if alive(pid)]
    visible = [p for p in (tmp_path / "local").rglob("*.tar") if not p.name.startswith(".")]
    for copy in visible:  # a copy in place is whole: the rest were hidden partial files
        assert copy.stat().st_size == (data / copy.name).stat().st_size
