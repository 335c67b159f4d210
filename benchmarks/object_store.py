"""What reading a dataset from object storage costs: a cold epoch from an HTTP object server that
adds a per-request latency and caps the bandwidth, against the cap itself and against the peers' ways
of reading a bucket, in one run.

    python benchmarks/object_store.py [--n 2000] [--latency-ms 20] [--bandwidth 200MB/s] [--repeats 3]

The server (a process of its own, so that it does not share the reader's interpreter) serves the
dataset's directory over HTTP with ranged GETs; every request waits ``--latency-ms`` before its
first byte, and all responses together are paced to ``--bandwidth`` (a shared schedule, as one link
would). moto's S3 server serves one request at a time (~40 ms each here), so it is no place for
speed figures; ddpipe speaks to this server through the same client (obstore) and code as to S3.

Rows, each a cold epoch of every sample's bytes (no decoding):
- ddpipe: ``EncodedStream("http://.../ds")``: shards fetched by ranged requests, 8 MB each,
  8 at once, the next shard ahead of the one being read;
- whole-shard download, one shard at a time (MosaicML Streaming's way: each shard fetched whole,
  then read);
- a sequential stream of each tar (WebDataset's ``pipe:curl`` way: one request per shard, read as
  it arrives);
- local files: the same Loader on the dataset's directory, from the page cache (what the store costs
  beside no store at all).
- the server's ceiling: every shard fetched whole by curl, four at once, to /dev/null: what this
  server and machine deliver at most (the server shares the machine's cores with the reader).
*of cap*: the rate as a share of the bandwidth cap; *of ceiling*: as a share of the ceiling's.
"""

from __future__ import annotations

import argparse
import http.server
import io
import multiprocessing
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import save, synth_shards

from ddpipe.bench.harness import machine, median, table
from ddpipe.units import parse_size


class Pacer:
    """One link's bandwidth shared by every response: each piece waits for its slot."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.next_free = time.monotonic()

    def send(self, out: Any, data: bytes) -> None:
        for i in range(0, len(data), 1 << 20):
            piece = data[i : i + (1 << 20)]
            with self.lock:
                now = time.monotonic()
                # a token bucket: a piece written late (the machine busy) may catch up by 50 ms, so
                # the link's average stays at the rate rather than losing each write's own time
                self.next_free = max(self.next_free, now - 0.05) + len(piece) / self.rate
                wait = self.next_free - now - len(piece) / self.rate
            if wait > 0:
                time.sleep(wait)
            out.write(piece)


def serve(root: str, latency: float, rate: float, port_out: Any) -> None:
    pacer = Pacer(rate)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            time.sleep(latency)
            super().do_HEAD()

        def do_GET(self) -> None:
            time.sleep(latency)
            path = Path(self.translate_path(self.path))
            if not path.is_file():
                self.send_error(404)
                return
            size = path.stat().st_size
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            start, end = (int(m.group(1)), min(int(m.group(2) or size - 1), size - 1)) if m else (0, size - 1)
            with open(path, "rb") as f:
                f.seek(start)
                body = f.read(end - start + 1)
            self.send_response(206 if m else 200)
            if m:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            pacer.send(self.wfile, body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: Handler(*a, directory=root))
    server.daemon_threads = True
    port_out.put(server.server_address[1])
    server.serve_forever()


def epoch_ceiling(base: str, files: list[str]) -> int:
    """What the server and link give at most: every shard fetched whole by curl, four at once,
    straight to /dev/null (nothing parsed, nothing kept)."""
    def fetch(name: str) -> None:
        subprocess.run(["curl", "-s", "-f", "-o", os.devnull, f"{base}/{name}"], check=True)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(fetch, files))
    return 0  # nothing read: the bytes went to /dev/null


def epoch_ddpipe(url: str) -> int:
    import ddpipe

    loader = ddpipe.EncodedStream(url, 64, shuffle="none")  # a new loader: nothing fetched yet
    return sum(len(s["jpg"]) for batch in loader for s in batch)


def epoch_whole_shards(base: str, files: list[str]) -> int:
    n = 0
    for name in files:
        with urllib.request.urlopen(f"{base}/{name}") as r:
            data = r.read()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar:
                f = tar.extractfile(member)
                if f is not None and member.name.endswith(".jpg"):
                    n += len(f.read())
    return n


def epoch_webdataset(base: str, files: list[str]) -> int:
    import webdataset as wds

    urls = [f"pipe:curl -s -f {base}/{name}" for name in files]
    return sum(len(s["jpg"]) for s in wds.WebDataset(urls, shardshuffle=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--bandwidth", default="200MB/s")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    root = synth_shards(args.n, "objects", "wds", shard_bytes=32_000_000, seed=0)
    rate = float(parse_size(args.bandwidth.removesuffix("/s")))
    files = sorted(p.name for p in root.glob("*.tar"))
    total = sum((root / f).stat().st_size for f in files)
    ports: Any = multiprocessing.get_context("spawn").Queue()
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(str(root.parent), args.latency_ms / 1e3,
                                                                               rate, ports), daemon=True)
    server.start()
    try:
        base = f"http://127.0.0.1:{ports.get(timeout=60)}/{root.name}"
        ways = {
            "ddpipe Loader from the store (ranged, concurrent)": lambda: epoch_ddpipe(base),
            "whole-shard download, one at a time (Streaming's way)": lambda: epoch_whole_shards(base, files),
            "a sequential stream of each tar (WebDataset pipe:curl)": lambda: epoch_webdataset(base, files),
            "ddpipe Loader from local files (page cache)": lambda: epoch_ddpipe(str(root)),
            "the server's ceiling: curl, 4 shards at once, to /dev/null": lambda: epoch_ceiling(base, files),
        }
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        for rep in range(args.repeats):
            for name in ways if rep % 2 == 0 else reversed(list(ways)):
                t0 = time.perf_counter()
                got = ways[name]()
                seconds[name].append(time.perf_counter() - t0)
                print(f"  {name}: {seconds[name][-1]:.2f} s ({got / 1e6:.0f} MB of images read)", file=sys.stderr)
    finally:
        server.kill()
    ideal = total / rate
    ours = median(seconds[next(iter(ways))])
    ceiling = median(seconds[list(ways)[-1]])
    rows = [{"way": name, "seconds": median(s), "mb_s": total / median(s) / 1e6, "of_cap": ideal / median(s),
             "of_ceiling": ceiling / median(s), "vs_ddpipe": median(s) / ours} for name, s in seconds.items()]
    cols = [("way", "reading the dataset", "s"), ("seconds", "epoch s", ".2f"), ("mb_s", "MB/s", ".0f"),
            ("of_cap", "of cap", ".2f"), ("of_ceiling", "of ceiling", ".2f"),
            ("vs_ddpipe", "time / ddpipe's", ".2f")]
    text = table(rows, cols)
    print(text)
    doc = {"benchmark": "object_store", "command": f"python benchmarks/object_store.py --n {args.n} --latency-ms "
           f"{args.latency_ms:g} --bandwidth {args.bandwidth} --repeats {args.repeats}", "machine": machine(),
           "bytes": total, "shards": len(files), "latency_ms": args.latency_ms, "bandwidth": rate,
           "rows": rows, "runs": seconds, "table": text}
    print(f"\nwrote {save('object_store', doc)}", file=sys.stderr)


if __name__ == "__main__":
    main()
