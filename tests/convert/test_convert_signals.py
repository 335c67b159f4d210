"""A conversion ended by Ctrl-C, SIGTERM or SIGKILL leaves no worker process, no resource tracker and
nothing in /dev/shm; what it had written stays hidden, for a rerun to discard. Ctrl-C and SIGTERM (a
scheduler's stop, ``timeout``'s, ``kill``'s) are each one line and an exit status that names them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..helpers import alive, descendants


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(("sig", "to_group"), [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False),
                                               (signal.SIGTERM, True), (signal.SIGKILL, False)])
def test_an_ended_conversion_leaves_nothing_running(tmp_path: Path, raw_images: Path, sig: signal.Signals,
                                                    to_group: bool) -> None:
    """``to_group``: as a terminal's Ctrl-C, to every process of the command's group, workers included."""
    src = tmp_path / "src"
    src.mkdir()
    lines = []
    for i, image in zip(range(2), sorted(raw_images.rglob("*.jpg")), strict=False):
        # each worker's shard: an image written, then one that is a pipe nobody writes: it blocks there
        os.mkfifo(src / f"img{i}.jpg")
        lines += [f"{image},{i}", f"{src / f'img{i}.jpg'},{i}"]
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    shm_before = set(os.listdir("/dev/shm"))
    # as from a terminal: a suite run as a background job (make test &) passes SIGINT ignored to its
    # children, and Python then never turns Ctrl-C into KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "ddpipe", "convert", tmp_path / "list.csv", tmp_path / "out",
                             "--workers", "2", "--samples-per-shard", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=to_group,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    writing = list[Path]()
    while (len(descendants(proc.pid)) < 3 or len(writing) < 2) and time.monotonic() < deadline:
        time.sleep(0.1)  # two workers and the tracker; each worker's shard begun
        writing = list((tmp_path / "out").glob(".*.tar.partial"))
    children = descendants(proc.pid)
    assert len(children) >= 3 and len(writing) == 2, proc.communicate(timeout=10)[0]
    if to_group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        output, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()  # its workers die with it: a failing run leaves nothing behind either
        proc.communicate()
        raise
    assert proc.returncode != 0
    settle = time.monotonic() + 20  # the kernel ends the workers as their parent goes: let it finish
    while any(map(alive, children)) and time.monotonic() < settle:
        time.sleep(0.1)
    left = [pid for pid in children if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, output
    assert set(os.listdir("/dev/shm")) <= shm_before
    assert not [p for p in (tmp_path / "out").glob("*") if not p.name.startswith(".")]  # nothing visible
    if sig != signal.SIGKILL:  # what the workers were writing is discarded (SIGTERM's left it, until a rerun)
        assert not list((tmp_path / "out").glob(".*.partial")), output
    said = output.strip().splitlines()[-1:]  # after the progress bar
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and said == ["ddpipe: interrupted"] and "Traceback" not in output, output
    if sig == signal.SIGTERM:  # it was Python's default: death without a word, then the resource tracker's warning
        assert proc.returncode == 128 + signal.SIGTERM and said == ["ddpipe: terminated"], output
        assert "Traceback" not in output and "leaked" not in output, output
