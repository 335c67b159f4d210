"""The cluster projection (``ddpipe bench --project``'s model, ddpipe/bench/projection.py) against
epochs measured on 1, 2 and 3 emulated nodes, each bound by a different term of the model.

    python benchmarks/projection.py [--n 3000] [--throttle 50MB/s,5ms] [--repeats 3]

The model says an epoch takes as long as its slowest stage: max(step, decode, fetch, exchange). Each
case below makes one term the largest, and feeds the model only what is measured apart from the
epoch it predicts (never the epoch itself), in the same job:

- fetch: each node reads the dataset through its own slow link (the slow-source model, per node),
  cold, without decoding; fed the link's bandwidth and latency.
- decode: decoding (DALI on the CPU) from the page cache; fed each rank's decoding rate measured on
  the same encoded batches held in memory, every rank decoding at once (no reading, no exchange).
- step: a simulated step (a sleep per batch) three times as long as reading a batch from the page
  cache; fed the step's time and the raw read rate.
- exchange: Q = 0.9 without decoding, from the page cache; fed the bandwidth of raw exchange rounds
  between the nodes (the same round sizes through ``comm.alltoallv``, nothing read) and of reading
  the shards from the page cache (every rank at once, nothing exchanged).

MPICH's cliques make the nodes (2 ranks each), and they share this machine's 2 cores: with more
ranks than cores, rates measured apart and an epoch that runs everything at once share the cores
differently, and the table says by how much the model is off for each.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from _common import DATA, mpiexec, raw_read, save, synth_shards, timed_epoch

import ddpipe
from ddpipe.bench.harness import drain, machine, median, table
from ddpipe.bench.projection import Cluster, Workload, project
from ddpipe.comm import Comm, init_comm
from ddpipe.decode import DecodeOptions
from ddpipe.staging import SourceLimits

RANKS_PER_NODE = 2
BATCH = 64
SIZE = 128  # decoded side: decoding stays the largest term without taking minutes on 2 cores
Q_EXCHANGE = 0.9
CASES = ("fetch", "decode", "step", "exchange")


def raw_read_rate(comm: Comm, files: list[Path]) -> float:
    """Bytes/s of the whole job reading its share of the files from the page cache, every rank at once."""
    mine = files[comm.world.rank :: comm.world.size]
    raw_read(mine)  # warm
    comm.barrier()
    t0 = time.perf_counter()
    nbytes = raw_read(mine)
    seconds = max(comm.allgather(time.perf_counter() - t0))
    return float(sum(comm.allgather(nbytes)) / seconds)


def raw_exchange_rate(comm: Comm, segment: int, rounds: int) -> float:
    """Bytes/s one node sends to the others in exchange rounds of ``segment`` bytes per rank pair,
    nothing read: the link's beta as the model uses it."""
    w = comm.world
    payload = np.ones(segment, dtype=np.uint8).data
    for _ in range(2):  # the zones and slots grow in the first rounds
        comm.alltoallv([[payload]] * w.size, what="raw exchange")
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(rounds):
        comm.alltoallv([[payload]] * w.size, what="raw exchange")
    seconds = max(comm.allgather(time.perf_counter() - t0))
    off_node = w.size - w.local_size
    return float(w.local_size * off_node * segment * rounds / seconds)


def memory_decode_rate(comm: Comm, root: Path) -> float:
    """Images/s one rank decodes, fed its encoded batches from memory, every rank at once."""
    import torch

    from ddpipe.bench.measure import decode_held, held_batches
    from ddpipe.decode.output import make_decoder

    options = DecodeOptions(decoder="dali-cpu", device="cpu", size=SIZE, resize_shorter=SIZE, dtype="uint8")
    batches = held_batches(ddpipe.EncodedStream(root, BATCH, shuffle="none", comm=comm))
    images = sum(len(batch) for batch in batches)
    decoder = make_decoder("dali-cpu", options, BATCH, torch.device("cpu"))
    for _ in range(2):  # the first pass warms DALI's pipeline and the heap
        seconds, _ = decode_held(comm, batches, lambda batch: None, lambda: decoder)
    decoder.close()
    return images / seconds


def worker(root: Path, throttle: str, out: Path) -> None:
    comm = init_comm()
    dataset = ddpipe.open_dataset(root)
    files = [root / s.file for s in dataset.manifest.shards]
    figures: dict[str, float] = {}

    # fetch-bound: cold through each node's slow link; the model is fed the link
    unthrottled = ddpipe.EncodedStream(root, BATCH, shuffle="partial", comm=comm)
    figures["read_epoch"] = timed_epoch(unthrottled, files)
    figures["read_rate_per_rank"] = len(dataset) / comm.world.size / figures["read_epoch"]
    figures["fetch"] = timed_epoch(ddpipe.EncodedStream(root, BATCH, shuffle="partial", comm=comm,
                                                        source_limits=throttle), files)
    # decode-bound, warm; fed the decoding rate measured from memory
    decoding = ddpipe.Loader(root, BATCH, shuffle="partial", comm=comm, decoder="dali-cpu", device="cpu", size=SIZE,
                             resize_shorter=SIZE, dtype="uint8")
    drain(decoding)
    figures["decode"] = timed_epoch(decoding)
    decoding.close()
    figures["decode_rate_per_rank"] = memory_decode_rate(comm, root)
    # step-bound, warm: a step three times the time a rank's share takes to read
    drain(unthrottled)
    warm = timed_epoch(unthrottled)
    steps = len(unthrottled)
    figures["step_time"] = max(3 * warm / steps, 0.02)
    comm.barrier()
    t0 = time.perf_counter()
    for _ in unthrottled:
        time.sleep(figures["step_time"])
    figures["step"] = max(comm.allgather(time.perf_counter() - t0))
    # exchange-bound, warm, Q = 0.9; fed raw exchange rounds and raw reads, each measured alone
    exchanging = ddpipe.EncodedStream(root, BATCH, shuffle="partial", comm=comm, exchange_fraction=Q_EXCHANGE)
    drain(exchanging)
    figures["exchange"] = timed_epoch(exchanging)
    per_rank = len(dataset) / comm.world.size
    round_samples = 512  # the loader's default round
    sample_bytes = dataset.manifest.num_bytes / len(dataset)
    segment = int(Q_EXCHANGE * round_samples * sample_bytes / max(comm.world.size - 1, 1))
    figures["exchange_rate_per_node"] = raw_exchange_rate(comm, segment, max(int(per_rank // round_samples), 1) * 4)
    figures["read_rate_all"] = raw_read_rate(comm, files)
    if comm.world.rank == 0:
        out.write_text(json.dumps(figures))


def projected(case: str, nodes: int, f: dict[str, float], images: int, image_bytes: float,
              link: SourceLimits) -> tuple[float, str]:
    """The model's epoch and bottleneck for ``case``, fed only what was measured apart from it."""
    many = 1e18  # a term the case does not exercise: never the largest
    cluster = Cluster(nodes=nodes, gpus_per_node=RANKS_PER_NODE, fs_bandwidth=many, open_latency=0.0,
                      link_bandwidth=many, link_latency=0.0)
    work = Workload(images=images, image_bytes=image_bytes, batch_size=BATCH, step_time=0.0,
                    decode_rate=f["read_rate_per_rank"], shuffle="partial")
    if case == "fetch":
        cluster = Cluster(**{**cluster.__dict__, "fs_bandwidth": nodes * (link.bandwidth or many),
                             "open_latency": link.latency})
    elif case == "decode":
        cluster = Cluster(**{**cluster.__dict__, "fs_bandwidth": f["read_rate_all"]})
        work = Workload(**{**work.__dict__, "decode_rate": f["decode_rate_per_rank"]})
    elif case == "step":  # warm, no decoding: reading from the page cache is the data's one cost
        cluster = Cluster(**{**cluster.__dict__, "fs_bandwidth": f["read_rate_all"]})
        work = Workload(**{**work.__dict__, "step_time": f["step_time"], "decode_rate": many})
    else:
        cluster = Cluster(**{**cluster.__dict__, "fs_bandwidth": f["read_rate_all"],
                             "link_bandwidth": f["exchange_rate_per_node"] if nodes > 1 else many})
        work = Workload(**{**work.__dict__, "exchange_fraction": Q_EXCHANGE, "decode_rate": many})
    p = project(cluster, work, staging=False)
    return p.epoch, p.bottleneck


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--throttle", default="50MB/s,5ms", help="each node's link to the shared dataset")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", nargs=2, metavar=("DATA", "OUT"))
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), args.throttle, Path(args.worker[1]))
        return
    root = synth_shards(args.n, "projection", shard_bytes=4_000_000)  # enough shards to share evenly
    manifest = ddpipe.load_manifest(root)
    link = SourceLimits.parse(args.throttle)
    image_bytes = manifest.num_bytes / manifest.num_samples
    rows, runs = [], []
    for nodes in (1, 2, 3):
        figures = []
        for _ in range(args.repeats):
            out = DATA / "projection-run.json"
            mpiexec(nodes * RANKS_PER_NODE, __file__, "--throttle", args.throttle, "--worker", root, out, nodes=nodes)
            figures.append(json.loads(out.read_text()))
        runs.append({"nodes": nodes, "runs": figures})
        f = {k: median([run[k] for run in figures]) for k in figures[0]}
        for case in CASES:
            if case == "exchange" and nodes == 1:
                continue  # one node: nothing leaves it
            epoch, bottleneck = projected(case, nodes, f, manifest.num_samples, image_bytes, link)
            rows.append({"case": f"{case}-bound", "nodes": nodes, "ranks": nodes * RANKS_PER_NODE,
                         "measured_s": f[case], "projected_s": epoch, "ratio": epoch / f[case],
                         "bottleneck": bottleneck})
    text = table(rows, [("case", "case", "s"), ("nodes", "nodes", "d"), ("ranks", "ranks", "d"),
                        ("measured_s", "measured epoch s", ".2f"), ("projected_s", "projected epoch s", ".2f"),
                        ("ratio", "projected / measured", ".2f"), ("bottleneck", "projected bottleneck", "s")])
    command = f"python benchmarks/projection.py --n {args.n} --throttle {args.throttle} --repeats {args.repeats}"
    path = save("projection", {"benchmark": "projection", "command": command, "machine": machine(), "rows": rows,
                               "runs": runs, "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
