"""The cost of the partial exchange: epoch time with Q = 0.3 against Q = 0, and the exchange's
throughput against raw MPI Alltoallv of the same bytes, on real ranks.

    python benchmarks/exchange.py [--n 3000] [--ranks 2 4 8] [--repeats 15] [--round-size 128 512]
                                  [--torchrun-ranks 2 4 8] [--slow-source 600MB/s] [--name exchange]

Data: synth ImageNet-like JPEGs in 16 MB WebDataset shards. Each repeat runs one epoch per Q,
alternating, with the shards evicted from the page cache first (cold, the I/O-bound case the
exchange is meant to hide behind) and then again warm; the epoch time is the slowest rank's. The
reference for throughput replays each round's byte counts, rank by rank, through plain
``MPI.Ialltoallv`` on preallocated buffers in the same run. The exchange's own time is what it costs
a rank: packing the samples to send, moving the bytes once every rank has arrived, and unpacking
(the slowest rank's), in wall time and in its thread's processor time (which leaves out the turns of
the rank's other threads, reading and batching, on a node with fewer free cores than threads); the
time spent waiting for slower ranks to arrive (reading or decoding behind the others) is shown
apart, as it is not the exchange's cost but the stages' imbalance. *Landed*: the share of the bytes
exchanged that reached their receivers without a second copy (through the receivers' landing zones,
ddpipe/comm/landing.py). Each round size (the loader's default is 512) is a run of its own. *Slow
source*: the same epochs, warm, read through ddpipe's model of a shared file system
(``SourceLimits``: the node's ranks share --slow-source of bandwidth, 600 MB/s by default), so that
reading is I/O-bound throughout, as on a cluster; on this machine the cold epochs are so only in
part (fast local disk: in /proc/stat the 2 cores were busy 52% of a cold Q = 0 epoch on 8 ranks and
waited on the disk 41%; 39% and 50% on 2 ranks). *Disk limit*: the reference for the cold epochs,
measured in the same run: every rank maps its share of the shards, evicted first, paged in whole (no
checksum, no parsing), the slowest rank's seconds: what the disk and the kernel allow. *Alone*: the
exchange's own code over an epoch's samples already in memory, with nothing else running in the
process, against raw Alltoallv of that run's bytes: what the exchange adds to MPI's cost by itself.
The streams hand their samples on as views (``EncodedStream.views``), as they go to DALI on ddpipe's
GPU path, at either Q: a consumer of ``bytes`` (the default) copies every sample once at either Q,
its shard's or its round's buffer's, a cost of its own rather than the exchange's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import mmap
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from _common import DATA, mpiexec, save, synth_shards, timed_epoch, torchrun

import ddpipe
from ddpipe.bench.harness import evict_page_cache, machine, median, table
from ddpipe.comm import Comm, init_comm
from ddpipe.exchange import ExchangeShuffler
from ddpipe.loader_stats import ExchangeStats
from ddpipe.reading import read_samples

BATCH = 64
SLOW_REPEATS = 9  # slow-source epochs take ~0.6 s: fewer repeats than the others


def raw_alltoallv(round_bytes_all: Sequence[Sequence[Sequence[int]]], rank: int) -> float:
    """Seconds plain MPI needs to move the same byte matrix, round by round."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    total = 0.0
    for j in range(len(round_bytes_all[rank])):
        send = round_bytes_all[rank][j]
        recv = [round_bytes_all[src][j][rank] for src in range(len(round_bytes_all))]
        sbuf = np.ones(sum(send), dtype=np.uint8)
        rbuf = np.empty(sum(recv), dtype=np.uint8)
        sd = np.concatenate([[0], np.cumsum(send)[:-1]]).tolist()
        rd = np.concatenate([[0], np.cumsum(recv)[:-1]]).tolist()
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Ialltoallv([sbuf, (send, sd), MPI.BYTE], [rbuf, (recv, rd), MPI.BYTE]).Wait()
        total += time.perf_counter() - t0
    return total


def disk_limit(files: list[Path], comm: Comm) -> float:
    """Seconds for the ranks to read every shard cold, each rank its share, mapped and paged in whole
    (one call a shard, nothing else done): the slowest rank's, as an epoch's."""
    if comm.world.local_rank == 0:
        evict_page_cache(files)
    comm.barrier()
    t0 = time.perf_counter()
    for path in files[comm.world.rank :: comm.world.size]:
        with open(path, "rb") as f:
            mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                      prot=mmap.PROT_READ).close()
    return float(max(comm.allgather(time.perf_counter() - t0)))


def bytes_sent(stream: ddpipe.EncodedStream) -> int:
    """What the stream's last epoch sent to other ranks (nothing without an exchange)."""
    return stream.stats.exchange.bytes_sent if stream.stats.exchange is not None else 0


def worker(root: Path, out: Path, repeats: int, round_size: int, slow_source: str) -> None:
    comm = init_comm()
    files = [root / s.file for s in ddpipe.load_manifest(root).shards]
    # each evicted before its cold epochs: none of their shards kept mapped, which would keep their pages in
    loaders = {q: ddpipe.EncodedStream(root, BATCH, shuffle="partial", exchange_fraction=q,
                                  round_size=round_size, comm=comm, keep_mapped=False)
               for q in (0.0, 0.3)}
    slow = {q: ddpipe.EncodedStream(root, BATCH, shuffle="partial", exchange_fraction=q,
                               round_size=round_size, comm=comm, source_limits=slow_source)
            for q in (0.0, 0.3)}
    for stream in (*loaders.values(), *slow.values()):
        stream.views = True
    times: dict[str, list[float]] = {f"{kind}-{q}": [] for kind in ("cold", "warm", "slow") for q in (0.0, 0.3)}
    times["disk"] = []
    exchange, cpu, waiting, raw, moved = [], [], [], [], []
    landed = sent = 0
    for rep in range(repeats):
        times["disk"].append(disk_limit(files, comm))
        for q in (0.0, 0.3) if rep % 2 == 0 else (0.3, 0.0):
            # the stream's channel: its exchange state (and count of bytes landed) is its own
            before = getattr(loaders[q].comm, "landed_bytes", 0)
            times[f"cold-{q}"].append(timed_epoch(loaders[q], files))
            sent += bytes_sent(loaders[q])
            times[f"warm-{q}"].append(timed_epoch(loaders[q]))
            sent += bytes_sent(loaders[q])
            landed += getattr(loaders[q].comm, "landed_bytes", 0) - before
            if rep < SLOW_REPEATS:
                times[f"slow-{q}"].append(timed_epoch(slow[q]))
        stats = loaders[0.3].stats.exchange or ExchangeStats()
        everyone = comm.allgather(stats.round_bytes)
        exchange.append(max(comm.allgather(stats.seconds)))
        cpu.append(max(comm.allgather(stats.cpu_seconds)))
        waiting.append(max(comm.allgather(stats.wait_seconds)))
        raw.append(max(comm.allgather(raw_alltoallv(everyone, comm.world.rank))))
        moved.append(sum(sum(sum(r) for r in rank) for rank in everyone))
    alone, alone_raw = exchange_alone(loaders[0.3], repeats)
    landed_share = sum(comm.allgather(landed)) / max(sum(comm.allgather(sent)), 1)
    if comm.world.rank == 0:
        out.write_text(json.dumps({"times": times, "exchange_s": exchange, "exchange_cpu_s": cpu, "wait_s": waiting,
                                   "raw_s": raw, "bytes": moved, "alone_s": alone, "alone_raw_s": alone_raw,
                                   "landed_share": landed_share}))


def exchange_alone(loader: ddpipe.EncodedStream, repeats: int) -> tuple[list[float], list[float]]:
    """The exchange's own code (pack, transfer, unpack) over an epoch's samples already in memory, and
    raw Alltoallv of the same bytes, each alone in the process: the slowest rank's seconds, per repeat."""
    comm = loader.comm
    plan = loader.plan().ranks[comm.world.rank]
    samples = list(read_samples(loader.dataset, plan.reads))
    alone, raw = [], []
    for _ in range(repeats):
        shuffler = ExchangeShuffler(comm, plan, views=True)
        comm.barrier()
        shuffler.run(iter(samples), lambda item: True)
        alone.append(max(comm.allgather(shuffler.exchange_seconds)))
        everyone = comm.allgather(shuffler.round_bytes)
        raw.append(max(comm.allgather(raw_alltoallv(everyone, comm.world.rank))))
    return alone, raw


def loopback_bytes() -> int | None:
    """Bytes sent through the loopback interface so far (Linux), or None."""
    try:
        for line in Path("/proc/net/dev").read_text().splitlines():
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[8])  # transmit bytes
    except (OSError, ValueError, IndexError):
        pass
    return None


def torch_worker(root: Path, out: Path, repeats: int, round_size: int) -> None:
    """Under torchrun: Q = 0.3 epochs through ddpipe's gloo group, with the loopback traffic they made."""
    comm = init_comm()
    loader = ddpipe.EncodedStream(root, BATCH, shuffle="partial", exchange_fraction=0.3,
                           round_size=round_size, comm=comm)
    loader.views = True
    timed_epoch(loader)  # warm: shards in page cache, the group's connections made
    exchanged = 0
    comm.barrier()
    before = loopback_bytes()
    for _ in range(repeats):
        timed_epoch(loader)
        exchanged += bytes_sent(loader)
    comm.barrier()
    after = loopback_bytes()
    totals = comm.allgather(exchanged)
    if comm.world.rank == 0:
        wire = None if before is None or after is None else after - before
        out.write_text(json.dumps({"exchanged": sum(totals), "wire": wire, "epochs": repeats}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--round-size", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--torchrun-ranks", type=int, nargs="*", default=[2, 4, 8])
    ap.add_argument("--slow-source", default="600MB/s", help="a node's bandwidth from the modelled shared file system")
    ap.add_argument("--name", default="exchange", help="the results' name: benchmarks/results/NAME.json")
    ap.add_argument("--worker", nargs=2, metavar=("DATA", "OUT"))
    ap.add_argument("--torch-worker", nargs=2, metavar=("DATA", "OUT"))
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), Path(args.worker[1]), args.repeats, args.round_size[0], args.slow_source)
        return
    if args.torch_worker:
        torch_worker(Path(args.torch_worker[0]), Path(args.torch_worker[1]), 3, args.round_size[0])
        return
    root = synth_shards(args.n, "exchange")
    rows = []
    for round_size, ranks in itertools.product(args.round_size, args.ranks):
        out = DATA / f"exchange-{round_size}-{ranks}.json"
        mpiexec(ranks, __file__, "--repeats", args.repeats, "--round-size", round_size, "--slow-source",
                args.slow_source, "--worker", root, out)
        r = json.loads(out.read_text())
        t = r["times"]
        rows.append({
            "round": round_size, "ranks": ranks,
            "cold_q0": median(t["cold-0.0"]), "cold_q3": median(t["cold-0.3"]),
            "cold_ratio": median([b / a for a, b in zip(t["cold-0.0"], t["cold-0.3"], strict=True)]),
            "disk": median(t["disk"]),
            "cold_q0_disk": median([a / d for a, d in zip(t["cold-0.0"], t["disk"], strict=True)]),
            "cold_q3_disk": median([b / d for b, d in zip(t["cold-0.3"], t["disk"], strict=True)]),
            "warm_q0": median(t["warm-0.0"]), "warm_q3": median(t["warm-0.3"]),
            "warm_ratio": median([b / a for a, b in zip(t["warm-0.0"], t["warm-0.3"], strict=True)]),
            "slow_q0": median(t["slow-0.0"]),
            "slow_ratio": median([b / a for a, b in zip(t["slow-0.0"], t["slow-0.3"], strict=True)]),
            "exchanged_mb": median(r["bytes"]) / 1e6,
            "exchange_mb_s": median([b / s / 1e6 for b, s in zip(r["bytes"], r["exchange_s"], strict=True)]),
            "raw_mb_s": median([b / s / 1e6 for b, s in zip(r["bytes"], r["raw_s"], strict=True)]),
            "vs_raw": median([raw / ours for raw, ours in zip(r["raw_s"], r["exchange_s"], strict=True)]),
            "cpu_vs_raw": median([raw / ours for raw, ours in zip(r["raw_s"], r["exchange_cpu_s"], strict=True)]),
            "alone_mb_s": median([b / s / 1e6 for b, s in zip(r["bytes"], r["alone_s"], strict=True)]),
            "alone_vs_raw": median([raw / ours for raw, ours in zip(r["alone_raw_s"], r["alone_s"], strict=True)]),
            "wait_s": median(r["wait_s"]), "landed": r["landed_share"],
        })
    cols = [("round", "round", "d"), ("ranks", "ranks", "d"), ("cold_q0", "cold Q=0 s", ".2f"),
            ("cold_q3", "cold Q=0.3 s", ".2f"),
            ("cold_ratio", "cold Q=0.3 / Q=0", ".2f"), ("disk", "disk limit s", ".2f"),
            ("cold_q0_disk", "cold Q=0 / disk", ".2f"), ("cold_q3_disk", "cold Q=0.3 / disk", ".2f"),
            ("warm_q0", "warm Q=0 s", ".2f"),
            ("warm_q3", "warm Q=0.3 s", ".2f"), ("warm_ratio", "warm Q=0.3 / Q=0", ".2f"),
            ("slow_q0", "slow source Q=0 s", ".2f"), ("slow_ratio", "slow source Q=0.3 / Q=0", ".2f"),
            ("exchanged_mb", "MB exchanged", ".0f"), ("exchange_mb_s", "exchange MB/s", ".0f"),
            ("raw_mb_s", "raw Alltoallv MB/s", ".0f"), ("vs_raw", "exchange / raw", ".2f"),
            ("cpu_vs_raw", "processor time: exchange / raw", ".2f"),
            ("alone_mb_s", "alone MB/s", ".0f"), ("alone_vs_raw", "alone / raw", ".2f"),
            ("wait_s", "waiting for peers s", ".2f"), ("landed", "landed", ".2f")]
    text = table(rows, cols)
    wire_rows = []
    for ranks in args.torchrun_ranks:
        out = DATA / f"exchange-torchrun-{ranks}.json"
        torchrun(ranks, __file__, "--round-size", args.round_size[0], "--torch-worker", root, out)
        r = json.loads(out.read_text())
        wire_rows.append({"ranks": ranks, "epochs": r["epochs"], "exchanged_mb": r["exchanged"] / 1e6,
                          "wire_mb": None if r["wire"] is None else r["wire"] / 1e6,
                          "wire_ratio": None if r["wire"] is None else r["wire"] / r["exchanged"]})
    if wire_rows:
        text += f"\n\nUnder torchrun (gloo), rounds of {args.round_size[0]}:\n\n" + table(wire_rows, [
            ("ranks", "ranks", "d"), ("epochs", "epochs", "d"), ("exchanged_mb", "MB exchanged", ".0f"),
            ("wire_mb", "MB through loopback", ".0f"), ("wire_ratio", "loopback / exchanged", ".3f")])
    command = " ".join(map(str, ["python benchmarks/exchange.py", "--n", args.n, "--ranks", *args.ranks,
                                 "--repeats", args.repeats, "--round-size", *args.round_size,
                                 "--torchrun-ranks", *args.torchrun_ranks, "--slow-source", args.slow_source,
                                 *(["--name", args.name] if args.name != "exchange" else [])]))
    path = save(args.name, {"benchmark": "exchange", "command": command, "machine": machine(), "rows": rows,
                             "torchrun_rows": wire_rows,
                             "batch_size": BATCH, "round_sizes": args.round_size, "slow_source": args.slow_source,
                             "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
