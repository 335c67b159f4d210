"""Decode servers for the tests: real ``ddpipe serve`` processes on loopback, stopped with SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..helpers import alive, descendants


@dataclass
class Server:
    proc: subprocess.Popen[str]
    endpoint: str

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def kill(self) -> None:
        """SIGKILL: the server dies as a crashed machine's would, saying nothing to anyone."""
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> str:
        """SIGTERM, and what it printed; the server must end by itself, leaving no process behind."""
        kids = descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("a decode server did not end within 60 s of SIGTERM") from None
        settle = time.monotonic() + 20  # its pool's workers end as their parent goes: let them finish
        while any(map(alive, kids)) and time.monotonic() < settle:
            time.sleep(0.05)
        assert not [k for k in kids if alive(k)], "a decode server left processes behind"
        return out + err


def start_server(port: int = 0, *args: str, host: str = "127.0.0.1") -> Server:
    """``ddpipe serve`` on ``host`` (port 0: a free one), once it says where it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "ddpipe", "serve", "--listen", f"{host}:{port}",
                             "--workers", "1", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the first line names the endpoint; a failed start ends the pipe
    found = re.search(r"listening on (tcp://\S+)", line)
    if found is None:
        proc.kill()
        raise AssertionError(f"ddpipe serve did not start: {line}{proc.communicate()[1]}")
    return Server(proc, found.group(1))


@contextmanager
def servers(n: int, *args: str) -> Iterator[list[Server]]:
    started = [start_server(0, *args) for _ in range(n)]
    try:
        yield started
    finally:
        for s in started:
            if s.proc.poll() is None:
                s.stop()
