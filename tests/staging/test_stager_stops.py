"""Staging stopped part-way: a killed stager resumes with the rest, and a stopped command, a script
that ends mid-epoch and a closed loader leave no partial copy."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import ddpipe

from ..helpers import make_dataset
from .sources import ALL, keys, source, staged


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return source(tmp_path)


def test_killed_stager_resumes_with_the_rest(data: Path, tmp_path: Path) -> None:
    import os
    import signal

    stage = tmp_path / "stage"
    local = staged(stage, data)
    cmd = [sys.executable, "-m", "ddpipe", "stage", str(data), "--local-dir", str(stage), "--quiet",
           "--source-throttle", "200KB/s"]  # ~0.06 s a shard: slow enough to kill mid-way
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(list(local.glob(".*.verified"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "stager ended before it could be killed"
            time.sleep(0.01)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    done = len(list(local.glob(".*.verified")))
    assert 2 <= done < 5
    from ..conftest import run_cli

    rerun = run_cli("stage", data, "--local-dir", stage, "--quiet", check=True)
    assert f"staged {5 - done} shards" in rerun.stdout and f"{done} already staged" in rerun.stdout
    assert not list(local.glob(".*.partial"))
    assert set(keys(ddpipe.EncodedStream(data, 8, stage_dir=stage))) == ALL


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stopped_stage_command_leaves_no_partial_copy(data: Path, tmp_path: Path, sig: str) -> None:
    """Ctrl-C or SIGTERM while a shard is copied: the copy was left under its hidden name (the stager's
    thread died with the process), for a rerun to remove. The stager is now stopped within a chunk,
    and removes it; the command says why it ended, in one line."""
    import os
    import signal

    stage = tmp_path / "stage"
    local = staged(stage, data)
    cmd = [sys.executable, "-m", "ddpipe", "stage", str(data), "--local-dir", str(stage), "--quiet",
           "--source-throttle", "40KB/s"]  # ~0.7 s a shard: a copy is under way most of the time
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal
    try:
        deadline = time.monotonic() + 60
        while not (list(local.glob(".*.verified")) and list(local.glob(".*.partial"))):
            assert proc.poll() is None and time.monotonic() < deadline, "stager ended before it could be stopped"
            time.sleep(0.01)
        proc.send_signal(getattr(signal, sig))
        output, _ = proc.communicate(timeout=60)  # a hang bound: it ends within one throttled chunk
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    said = "ddpipe: interrupted" if sig == "SIGINT" else "ddpipe: terminated"
    assert proc.returncode == (130 if sig == "SIGINT" else 143) and output.strip().splitlines() == [said], output
    assert not list(local.glob(".*.partial"))
    assert 1 <= len(list(local.glob(".*.verified"))) < 5


def test_a_script_that_ends_mid_epoch_leaves_no_partial_copy(tmp_path: Path) -> None:
    """A training script that stops (an error, its own limit on steps) while the next shard is copied:
    the stager's thread was killed at exit with the copy under its hidden name. It is now stopped as
    the interpreter exits, and removes it."""
    data = make_dataset(tmp_path / "src", "wds", [12] * 20, payload=2048)
    stage = tmp_path / "stage"
    code = ("import sys, ddpipe; l = ddpipe.EncodedStream(sys.argv[1], 8, shuffle='none', stage_dir=sys.argv[2], "
            "source_limits='80KB/s'); next(iter(l)); print('one batch')")  # ~0.4 s a shard
    proc = subprocess.run([sys.executable, "-c", code, str(data), str(stage)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "one batch" in proc.stdout, proc.stdout + proc.stderr
    local = staged(stage, data)
    assert 1 <= len(list(local.glob(".*.verified"))) < 20  # it ended while staging went on
    assert not list(local.glob(".*.partial"))


@pytest.mark.parametrize("make", ["stream", "loader"])
def test_close_stops_staging_and_leaves_no_partial_copy(tmp_path: Path, make: str) -> None:
    """A script that leaves an epoch early and closes its loader, as the guide says, to release its
    threads: staging went on copying the epoch's shards behind it, to the end of the epoch or of the
    process. Closed, it stops within a chunk; iterating again stages the rest."""
    import threading

    from ddpipe.synth import encode_jpeg, render_image

    data = tmp_path / "src"
    jpeg = encode_jpeg(render_image(0, seed=1, long_side=48))
    ddpipe.write_dataset(data, ({"__key__": f"s/{i:06d}", "jpg": jpeg + bytes(2048), "cls": i % 4} for i in range(240)),
                         samples_per_shard=12)
    stage = tmp_path / "stage"
    # ~0.4 s a shard from the source: a copy is under way when the first batch is taken
    loader: ddpipe.EncodedStream | ddpipe.Loader = \
        ddpipe.EncodedStream(data, 8, shuffle="none", stage_dir=stage, source_limits="80KB/s") if make == "stream" \
        else ddpipe.Loader(data, 8, shuffle="none", stage_dir=stage, source_limits="80KB/s", decoder="pil")
    with loader:
        next(iter(loader))
    assert not [t for t in threading.enumerate() if t.name == "ddpipe-stager"]
    local = staged(stage, data)
    assert 1 <= len(list(local.glob(".*.verified"))) < 20 and not list(local.glob(".*.partial"))
    if make == "stream":
        assert len(keys(loader)) == 240  # type: ignore[arg-type]
        assert len(list(local.glob(".*.verified"))) == 20
