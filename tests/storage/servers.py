"""Real servers for the storage tests, on 127.0.0.1: moto's S3 endpoint, and a plain HTTP server of a
directory that answers ranged GETs and can be told to fail (503 for a while, or go away)."""

from __future__ import annotations

import http.server
import os
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# no SDK may look for credentials or a region anywhere else, nor probe the cloud metadata address
S3_ENV = {"AWS_EC2_METADATA_DISABLED": "true", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_REGION": "us-east-1", "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull}


@contextmanager
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on a free port of 127.0.0.1: its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


class _Handler(http.server.SimpleHTTPRequestHandler):
    server: RangeServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _failing(self) -> bool:
        with self.server.lock:
            self.server.requests += 1
            if self.server.refuse:
                self.send_error(403, "Forbidden")
                return True
            if self.server.fail_next > 0:
                self.server.fail_next -= 1
                self.server.failed += 1
                self.send_error(503, "Slow Down")
                return True
        return False

    def do_HEAD(self) -> None:
        if not self._failing():
            super().do_HEAD()

    def do_GET(self) -> None:
        if self._failing():
            return
        path = Path(self.translate_path(self.path))
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if not path.is_file() or match is None or not self.server.ranges:
            super().do_GET()
            return
        size = path.stat().st_size
        start = int(match.group(1))
        end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
        if start >= size:
            self.send_error(416)
            return
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self.wfile.write(body)


class RangeServer(http.server.ThreadingHTTPServer):
    """Serves ``root`` over HTTP with ranged GETs (or, ``ranges`` off, without them). ``fail_next``:
    that many requests are answered 503."""

    daemon_threads = True

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock = threading.Lock()
        self.fail_next = 0
        self.refuse = False  # answer 403, as a store refusing the credentials does
        self.failed = 0
        self.requests = 0
        self.ranges = True  # False: a range is answered with the whole file, as http.server's own does
        super().__init__(("127.0.0.1", 0), lambda *a: _Handler(*a, directory=str(root)))
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
