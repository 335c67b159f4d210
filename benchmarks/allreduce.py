"""The cost of averaging gradients: one exchange of ResNet-50's gradients (25.6 M float32) through
ddpipe's MPI path and through DDP's, against raw MPI.Allreduce of the same bytes in the same run;
and the step-time overhead of data parallelism, 2 ranks against 1, on synthetic data; and the cost of
``ddpipe train``'s stop vote, steps casting it against steps without, alternating in the same run.

    python benchmarks/allreduce.py [--ranks 2] [--repeats 7]

MPI path: gradients set on ResNet-50's own parameters (views into the fusion buffers, prescaled as
backward leaves them), every bucket's Iallreduce posted, then synchronize(): the whole exchange a
step pays. DDP's: gloo
all_reduce of the same bytes in DDP's 25 MB buckets. Step overhead: ResNet-18 on 64x64 synthetic
images, batch 16 per rank, one thread per rank, MPI path, against the same step on one rank.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _common import DATA, mpiexec, save

from ddpipe.bench.harness import machine, median, table


def worker(out: Path, repeats: int) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import ddpipe.distributed
    from ddpipe.train.models import build_model
    from ddpipe.train.mpi_allreduce import MPIGradientAverager
    from ddpipe.train.step import train_step
    from ddpipe.train.stop import StopRequest, StopVote

    torch.set_num_threads(1)
    job = ddpipe.distributed.init("cpu")
    ddpipe.distributed.init_process_group(job)  # torch.distributed's group at every size, for the DDP figure
    comm = job.comm
    world = MPI.COMM_WORLD
    model = build_model("resnet50")
    params = [p for p in model.parameters()]
    count = sum(p.numel() for p in params)
    averager = MPIGradientAverager(model, comm.gradient_channel())
    for p in params:
        assert p.grad is not None  # the averager gave every parameter its bucket view
        p.grad.copy_(torch.randn_like(p))  # gradients as backward leaves them (views into the buckets)
    raw = np.random.rand(count).astype(np.float32)
    flat = torch.randn(count)
    chunks = list(torch.split(flat, 25 * 2**20 // 4))
    times: dict[str, list[float]] = {"mpi": [], "raw": [], "ddp": []}
    for _ in range(repeats):
        world.Barrier()
        t0 = time.perf_counter()
        for b in range(len(averager.buckets)):
            averager._post(b)  # what the gradient hooks do during backward
        averager.synchronize()
        times["mpi"].append(time.perf_counter() - t0)
        world.Barrier()
        t0 = time.perf_counter()
        world.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM)
        times["raw"].append(time.perf_counter() - t0)
        world.Barrier()
        t0 = time.perf_counter()
        for c in chunks:
            dist.all_reduce(c)
        times["ddp"].append(time.perf_counter() - t0)
    # step time of data parallelism on synthetic data
    small = build_model("resnet18", 10)
    stepped = ddpipe.distributed.wrap(small, job, "mpi")
    opt = torch.optim.SGD(small.parameters(), lr=0.01)
    x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))
    # ddpipe train's steps also cast the stop vote (ddpipe/train/stop.py): steps with and without it
    # alternate, so that both see the same machine
    vote = StopVote.for_job(StopRequest(), job.size, comm.timeout)
    steps: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 * (repeats + 2)):
        voted = i % 2 == 1
        world.Barrier()
        t0 = time.perf_counter()
        train_step(stepped, opt, x, y)
        if voted:
            vote.agreed()
        if i >= 4:
            steps[voted].append(time.perf_counter() - t0)
    vote.close()
    result = {k: max(world.allgather(median(v))) for k, v in times.items()}
    result["step"] = max(world.allgather(median(steps[False])))
    result["step_voted"] = max(world.allgather(median(steps[True])))
    result["bytes"] = count * 4
    if comm.world.rank == 0:
        out.write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--worker", metavar="OUT")
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.worker), args.repeats)
        return
    DATA.mkdir(parents=True, exist_ok=True)
    one, many = DATA / "allreduce-1.json", DATA / f"allreduce-{args.ranks}.json"
    mpiexec(1, __file__, "--repeats", args.repeats, "--worker", one)
    mpiexec(args.ranks, __file__, "--repeats", args.repeats, "--worker", many)
    r1, rn = json.loads(one.read_text()), json.loads(many.read_text())
    mb = rn["bytes"] / 1e6
    rows = [{"what": f"raw MPI.Allreduce, {mb:.0f} MB (reference)", "ms": rn["raw"] * 1e3, "vs_raw": 1.0}]
    for key, what in (("mpi", "ddpipe MPI path: bucketed Iallreduce + average"),
                      ("ddp", "DDP's exchange: gloo all_reduce of 25 MB buckets")):
        rows.append({"what": what, "ms": rn[key] * 1e3, "vs_raw": rn[key] / rn["raw"]})
    steps = [{"ranks": 1, "step_ms": r1["step"] * 1e3, "vs_one": 1.0},
             {"ranks": args.ranks, "step_ms": rn["step"] * 1e3, "vs_one": rn["step"] / r1["step"]}]
    vote = {"ranks": args.ranks, "step_ms": rn["step_voted"] * 1e3, "plain_step_ms": rn["step"] * 1e3,
            "vs_plain": rn["step_voted"] / rn["step"]}
    text = (table(rows, [("what", f"gradient exchange, {args.ranks} ranks", "s"), ("ms", "ms", ".1f"),
                         ("vs_raw", "/ raw Allreduce", ".2f")])
            + "\n\n" + table(steps, [("ranks", "ranks", "d"), ("step_ms", "ResNet-18 step ms", ".0f"),
                                     ("vs_one", "/ 1 rank", ".2f")])
            + "\n\n" + table([vote], [("ranks", "ranks", "d"), ("step_ms", "step ms with the stop vote", ".1f"),
                                     ("plain_step_ms", "without (reference)", ".1f"),
                                     ("vs_plain", "/ without", ".3f")]))
    path = save("allreduce", {"benchmark": "allreduce", "command": f"python benchmarks/allreduce.py --ranks "
                              f"{args.ranks} --repeats {args.repeats}", "machine": machine(), "rows": rows,
                              "steps": steps, "stop_vote": vote, "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
