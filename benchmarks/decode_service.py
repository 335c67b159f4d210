"""Why the decode service exists: a trainer whose own core is busy with its step, fed by decoding on
that same core, against decoding on a server on the other core; all measured in one run.

    python benchmarks/decode_service.py [--images 2000] [--repeats 3] [--batch-size 64]

Every process is pinned with taskset: the trainer to core 0, a server to core 1.

- **trainer**: one rank, ``dali-cpu`` decoding (one thread) to 224x224 uint8, local shuffle; its
  step is work that takes its core ``--step-time`` seconds when alone (``busy_step``), by default
  as long as decoding a batch takes on one core (the raw rate below), so that neither decoding
  nor the step alone bounds the served case. Images/s and the share of the epoch spent waiting
  for data, from the first batch on (start-up excluded, as ``ddpipe bench`` takes rates);
  (a) decoding on core 0, (b) ``ddpipe serve`` on core 1. Reference: (a), as a ratio.
- **server**: a client on core 0 feeding the server on core 1 as fast as it decodes, with the
  epoch's encoded batches held in memory; reference: the same decoder decoding the same batches in
  one process on core 1 (the raw decode rate of that core, as the trainer would decode them).
- **transport**: decoded batches (64x3x224x224 uint8, 9.6 MB) from a server process on core 1 to a
  client on core 0, four in flight: ddpipe's wire and transport (headers, the image frame turned
  into a tensor) against raw pyzmq ROUTER/DEALER moving the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import DATA, save, synth_shards

from ddpipe.bench.harness import machine, median, table

BATCH_BYTES = 64 * 3 * 224 * 224


def decode_options(service: tuple[str, ...] = ()) -> Any:
    import ddpipe

    return ddpipe.DecodeOptions(decoder="dali-cpu", device="cpu", dtype="uint8", threads=1, service=service)


def encoded_batches(dataset: Path, batch_size: int) -> list[Any]:
    """The epoch's batches of encoded samples, read once (what a server is sent)."""
    import numpy as np

    import ddpipe
    from ddpipe.decode.batches import EncodedBatch

    ld = ddpipe.EncodedStream(dataset, batch_size, shuffle="local", seed=0)
    plan = ld.plan()
    out = []
    for b, samples in enumerate(ld):
        out.append(EncodedBatch.of(np.asarray(plan.batch(0, b)), [dict(s) for s in samples], _never))
    return out


def _never(index: int, sample: Any, reason: str) -> None:
    raise RuntimeError(f"sample {index}: {reason}")


_HASHED = bytes(1 << 18)


def busy_step(calls: int) -> None:
    """A step that needs its core: a fixed amount of work (hashing, which releases the GIL while it
    runs, as a GPU trainer's thread does while CUDA works), not a fixed time. A step timed by the
    clock would hand its core to decoding threads for free; a pure-Python spin would starve every
    thread of the GIL, local decoding's and the service client's alike."""
    for _ in range(calls):
        hashlib.sha256(_HASHED)  # ~0.1-0.2 ms


def calls_for(seconds: float) -> int:
    """How many hashing calls take ``seconds`` on this core, alone."""
    t0, n = time.perf_counter(), 200
    busy_step(n)
    return max(1, round(seconds * n / (time.perf_counter() - t0)))


def trainer(dataset: Path, out: Path, batch_size: int, step_time: float, repeats: int,
            service: tuple[str, ...]) -> None:
    import torch

    import ddpipe

    torch.set_num_threads(1)
    ld = ddpipe.Loader(dataset, batch_size, decode=decode_options(service), shuffle="local", seed=0)
    calls = calls_for(step_time)
    for _ in ld:  # warm-up: the page cache, the pipeline, the server's decoders
        pass
    rates, waits = [], []
    for e in range(repeats):
        ld.set_epoch(e + 1)
        images, waited, t0 = 0, 0.0, 0.0
        t = time.perf_counter()
        for b, (x, _) in enumerate(ld):
            if b == 0:  # steady state: from the first batch on (its start-up is the same either way)
                t0 = time.perf_counter()
            else:
                waited += time.perf_counter() - t
                images += len(x)
            busy_step(calls)
            t = time.perf_counter()
        seconds = time.perf_counter() - t0
        rates.append(images / seconds)
        waits.append(waited / seconds)
    stats = ld.service_stats
    ld.close()
    out.write_text(json.dumps({"images_per_s": median(rates), "wait": median(waits),
                               "local_batches": stats.local_batches if stats else None}))


def decode_rate(dataset: Path, out: Path, batch_size: int, repeats: int, service: tuple[str, ...]) -> None:
    """The epoch's batches decoded from memory as fast as they go: in this process (the core's
    decode limit), or through the servers of ``service``."""
    import torch

    from ddpipe.decode.output import make_decoder

    torch.set_num_threads(1)
    batches = encoded_batches(dataset, batch_size)
    decoder = make_decoder("dali-cpu", decode_options(service), batch_size, torch.device("cpu"))
    n = sum(len(b.indices) for b in batches)
    rates = []
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        for _ in decoder.decode(iter(batches), 0, r, _never):
            pass
        if r:  # the first builds the pipeline (here or on the server)
            rates.append(n / (time.perf_counter() - t0))
    decoder.close()
    out.write_text(json.dumps({"images_per_s": median(rates)}))


def echo_server(kind: str, batches: int) -> None:
    """Answer each request with a decoded batch: ddpipe's wire and listener, or raw pyzmq."""
    import numpy as np
    import zmq

    from ddpipe.service import wire
    from ddpipe.service.transport import listen

    images = np.random.default_rng(0).integers(0, 255, BATCH_BYTES, dtype=np.uint8).reshape(64, 3, 224, 224)
    if kind == "ddpipe":
        listener = listen("127.0.0.1:0", 1 << 30)
        print(listener.endpoint, flush=True)
        for _ in range(batches):
            got = None
            while got is None:
                got = listener.receive(1.0)
            peer, frames = got
            listener.send(peer, wire.decoded_message(wire.unpack(frames[0])["id"],
                                                     wire.DecodedBatch(images, [], 0.0)))
        time.sleep(0.5)  # the last reply leaves before the socket closes
        listener.close()
        return
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(f"tcp://127.0.0.1:{port}", flush=True)
    for _ in range(batches):
        peer, _ = sock.recv_multipart()
        sock.send_multipart([peer, images.data], copy=False)
    time.sleep(0.5)
    sock.close(linger=1000)
    ctx.term()


def echo_client(kind: str, endpoint: str, batches: int, out: Path) -> None:
    import numpy as np
    import torch
    import zmq

    from ddpipe.service import wire
    from ddpipe.service.transport import Links

    inflight = 4
    received = 0
    if kind == "ddpipe":
        links = Links()
        link = links.open(endpoint)
        while not any(k == "connected" for _, k, _ in links.wait(1.0)):
            pass
        t0 = time.perf_counter()
        for i in range(min(inflight, batches)):
            links.send(link, wire.decode_message(i, 0, 0, "dali-cpu", decode_options(), [], [], [], []))
        sent = min(inflight, batches)
        while received < batches:
            for _, kind_, frames in links.wait(1.0):
                if kind_ != "message" or frames is None:
                    continue
                decoded = wire.read_decoded(wire.unpack(frames[0]), frames[1:])
                tensor = torch.from_numpy(decoded.images)
                assert tensor.numel() == BATCH_BYTES
                received += 1
                if sent < batches:
                    links.send(link, wire.decode_message(sent, 0, 0, "dali-cpu", decode_options(), [], [], [], []))
                    sent += 1
        seconds = time.perf_counter() - t0
        links.close()
    else:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(endpoint)
        t0 = time.perf_counter()
        for _ in range(min(inflight, batches)):
            sock.send(b"x")
        sent = min(inflight, batches)
        while received < batches:
            parts = sock.recv_multipart(copy=False)
            array = np.frombuffer(parts[0].buffer, dtype=np.uint8)
            assert array.size == BATCH_BYTES
            received += 1
            if sent < batches:
                sock.send(b"x")
                sent += 1
        seconds = time.perf_counter() - t0
        sock.close(linger=0)
        ctx.term()
    out.write_text(json.dumps({"bytes_per_s": batches * BATCH_BYTES / seconds}))


def pinned(core: int, *args: str | os.PathLike[str]) -> list[str]:
    return ["taskset", "-c", str(core), sys.executable, *map(str, args)]


def run_json(cmd: list[str], out: Path) -> dict[str, Any]:
    subprocess.run(cmd, check=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"})
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def start(cmd: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"(tcp://\S+)", line)
    if found is None:
        proc.kill()
        raise SystemExit(f"{' '.join(cmd)} did not start: {line}")
    return proc, found.group(1)


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--step-time", type=float, default=0.0, help="seconds (default: a batch's decoding on one core)")
    ap.add_argument("--role", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--args", nargs="*", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        role_main(args)
        return
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("this benchmark pins the trainer and the server to two different cores: it needs two")
    dataset = synth_shards(args.images, "decode-service")
    scratch = DATA / "decode-service-runs"
    scratch.mkdir(parents=True, exist_ok=True)
    me, b, r = Path(__file__), str(args.batch_size), str(args.repeats)

    raw = run_json(pinned(1, me, "--role", "decode", "--args", dataset, scratch / "raw.json", b, r),
                   scratch / "raw.json")
    step = args.step_time or args.batch_size / raw["images_per_s"]
    local = run_json(pinned(0, me, "--role", "trainer", "--args", dataset, scratch / "local.json", b, str(step), r, ""),
                     scratch / "local.json")
    server, endpoint = start(pinned(1, "-m", "ddpipe", "serve", "--listen", "127.0.0.1:0", "--workers", "1"))
    try:
        served = run_json(pinned(0, me, "--role", "trainer", "--args", dataset, scratch / "served.json", b, str(step),
                                 r, endpoint), scratch / "served.json")
        fed = run_json(pinned(0, me, "--role", "decode", "--args", dataset, scratch / "feed.json", b, r, endpoint),
                       scratch / "feed.json")
    finally:
        stop(server)
    rates: dict[str, list[float]] = {"raw": [], "ddpipe": []}
    n_batches = 1000  # ~10 GB a run: shorter runs varied by up to 30% here (connection start, TCP buffers)
    for _ in range(args.repeats):  # alternating, medians: a run of either varies by ~10% here
        for kind in ("raw", "ddpipe"):
            echo, where = start(pinned(1, me, "--role", "echo-server", "--args", kind, str(n_batches)))
            out = scratch / f"echo-{kind}.json"
            rates[kind].append(run_json(pinned(0, me, "--role", "echo-client", "--args", kind, where, str(n_batches),
                                               out), out)["bytes_per_s"])
            echo.wait(timeout=120)
    transport = {kind: {"bytes_per_s": median(v)} for kind, v in rates.items()}

    trainer_rows = [
        {"what": "decoding on the trainer's core (reference)", "images_per_s": local["images_per_s"],
         "wait": 100 * local["wait"], "ratio": 1.0},
        {"what": "ddpipe serve on the other core", "images_per_s": served["images_per_s"],
         "wait": 100 * served["wait"], "ratio": served["images_per_s"] / local["images_per_s"]},
    ]
    server_rows = [
        {"what": "the same decoder in process on core 1 (reference)", "rate": raw["images_per_s"], "ratio": 1.0},
        {"what": "ddpipe serve on core 1, fed from core 0", "rate": fed["images_per_s"],
         "ratio": fed["images_per_s"] / raw["images_per_s"]},
    ]
    wire_rows = [
        {"what": "raw pyzmq ROUTER/DEALER (reference)", "gbps": transport["raw"]["bytes_per_s"] / 1e9, "ratio": 1.0},
        {"what": "ddpipe wire + transport, to a tensor", "gbps": transport["ddpipe"]["bytes_per_s"] / 1e9,
         "ratio": transport["ddpipe"]["bytes_per_s"] / transport["raw"]["bytes_per_s"]},
    ]
    text = "\n\n".join([
        table(trainer_rows, [("what", f"trainer on core 0, step {step * 1e3:.0f} ms busy per batch of "
                              f"{args.batch_size}", "s"), ("images_per_s", "images/s", ".0f"),
                             ("wait", "data wait %", ".0f"), ("ratio", "/ local", ".2f")]),
        table(server_rows, [("what", "decoding on one core, dali-cpu 224x224 uint8", "s"),
                            ("rate", "images/s", ".0f"), ("ratio", "/ in process", ".2f")]),
        table(wire_rows, [("what", "decoded batches of 9.6 MB, core 1 -> core 0", "s"), ("gbps", "GB/s", ".2f"),
                          ("ratio", "/ raw pyzmq", ".2f")]),
    ])
    command = (f"python benchmarks/decode_service.py --images {args.images} --batch-size {args.batch_size} "
               f"--repeats {args.repeats}" + (f" --step-time {args.step_time}" if args.step_time else ""))
    path = save("decode_service", {"benchmark": "decode_service", "command": command, "machine": machine(),
                                   "step_time": step, "trainer": trainer_rows, "server": server_rows,
                                   "transport": wire_rows, "served_local_batches": served["local_batches"],
                                   "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


def role_main(args: argparse.Namespace) -> None:
    a = args.args
    if args.role == "trainer":
        trainer(Path(a[0]), Path(a[1]), int(a[2]), float(a[3]), int(a[4]), tuple(x for x in a[5:] if x))
    elif args.role == "decode":
        decode_rate(Path(a[0]), Path(a[1]), int(a[2]), int(a[3]), tuple(x for x in a[4:] if x))
    elif args.role == "echo-server":
        echo_server(a[0], int(a[1]))
    elif args.role == "echo-client":
        echo_client(a[0], a[1], int(a[2]), Path(a[3]))


if __name__ == "__main__":
    main()
