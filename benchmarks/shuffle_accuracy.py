"""Where does local shuffling lose accuracy at scale, and which exchange fraction Q recovers it?

    python benchmarks/shuffle_accuracy.py [--worlds 16 64 256 1024] [--seeds 3] [--epochs 8] [--jobs 2]
                                          [--per-class 2560]

The problem (ddpipe.bench.class_problem): 100 classes, 256,000 8x8 images written class after class
into 200 WebDataset shards, so each worker holds a few classes, 250 samples at W = 1,024. For every
world size W, every shuffle mode (none, local, partial at each Q, global) and several seeds, an MLP
with batch normalisation trains by data-parallel SGD for W ranks, carried out by ddpipe's virtual
ranks (ddpipe.train.virtual): each rank's batches are what its Loader yields (the real epoch plan,
sticky shard assignment, exchange included), batch norm is per rank with rank 0's running statistics,
and gradients are averaged, with a local batch of 16 and the learning rate scaled to the global
batch. The reference measured in the same run is ``global`` shuffling; the table gives each mode's
top-1 against it and the share of the local-to-global gap each Q recovers, with the stream scores
``ddpipe plan`` reports for the same plan (batch skew: how far a rank's local batch is from the
dataset's class mix). A real run of 4 ranks under mpiexec (the Loader over the shards, PyTorch
DDP) repeats one configuration, as the check that virtual and real ranks agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from _common import DATA, FIGURES, RESULTS, ROOT, mpiexec, save

import ddpipe
from ddpipe.bench import class_problem as cp
from ddpipe.bench.harness import machine, table
from ddpipe.quality import score_epoch

BATCH = 16  # per rank
BUFFER = ddpipe.PlanOptions.buffer_size  # the Loader's default shuffle buffer
BUFFER_STUDY = ([("local", 0.0), ("partial", 0.3), ("partial", 0.7), ("global", 0.0)], [1024, 4096, 16384])
# weights compared after a few steps (later, rounding differences grow as SGD amplifies them), accuracy
# after the epoch
REAL_CHECK: dict[str, Any] = {"world": 4, "mode": "partial", "q": 0.3, "seed": 0, "epochs": 1, "compare_at_step": 50}


def per_class_argument(options: cp.ProblemOptions) -> str:
    """What a record's command adds for a problem of another size than the default."""
    return "" if options.per_class == cp.ProblemOptions.per_class else f" --per-class {options.per_class}"


def configs(fractions: list[float]) -> list[tuple[str, float]]:
    return [("none", 0.0), ("local", 0.0), *(("partial", q) for q in fractions), ("global", 0.0)]


def plan_options(mode: str, q: float, buffer_size: int = BUFFER) -> ddpipe.PlanOptions:
    return ddpipe.PlanOptions(shuffle=mode, exchange_fraction=q, batch_size=BATCH, drop_last=True,
                              buffer_size=buffer_size)


def train_virtual(data: Path, problem_options: cp.ProblemOptions, world: int, mode: str, q: float, seed: int,
                  epochs: int, snapshot_at: int = -1, buffer_size: int = BUFFER) -> dict[str, Any]:
    """One configuration with W virtual ranks; returns its top-1 on the held-out set (and the weights
    after ``snapshot_at`` steps)."""
    import torch

    from ddpipe.train.virtual import per_rank_batch_norm, virtual_batches, virtual_step

    torch.set_num_threads(1)  # one configuration per core
    problem = cp.make_problem(problem_options)
    manifest = ddpipe.load_manifest(data)
    images, labels = cp.as_tensor(problem.train_images), torch.from_numpy(problem.train_labels)
    torch.manual_seed(seed)
    model = per_rank_batch_norm(cp.make_model(problem.options.classes), world)
    optimizer = cp.make_optimizer(model)
    options = plan_options(mode, q, buffer_size)
    per_epoch = ddpipe.plan_epoch(manifest, world, seed, 0, options).num_batches
    schedule = cp.Schedule(world * BATCH, per_epoch * epochs, per_epoch)
    t0, step, state = time.perf_counter(), 0, None
    for epoch in range(epochs):
        for batch in virtual_batches(manifest, world, seed, epoch, options):
            for group in optimizer.param_groups:
                group["lr"] = schedule.rate(step)
            index = torch.from_numpy(batch.reshape(-1))
            virtual_step(model, optimizer, images[index], labels[index])
            step += 1
            if step == snapshot_at:
                state = {k.replace(".layer.", "."): v.clone() for k, v in model.state_dict().items()}
    accuracy = cp.top1(model, problem.test_images, problem.test_labels)
    return {"world": world, "mode": mode, "q": q, "seed": seed, "buffer": buffer_size, "top1": accuracy,
            "seconds": time.perf_counter() - t0, "state": state}


def stream_scores(data: Path, problem: cp.Problem, world: int, mode: str, q: float,
                  buffer_size: int = BUFFER) -> dict[str, float]:
    plan = ddpipe.plan_epoch(ddpipe.load_manifest(data), world, 0, 0, plan_options(mode, q, buffer_size))
    return score_epoch([r.order for r in plan.ranks], problem.train_labels, BATCH).to_dict()


def real_worker(data: Path, out: Path, problem_options: cp.ProblemOptions) -> None:
    """A rank of the real job that REAL_CHECK describes: the Loader over the shards, PNGs decoded
    here, PyTorch DDP over gloo."""
    import torch
    from PIL import Image

    import ddpipe.distributed

    torch.set_num_threads(1)
    c = REAL_CHECK
    job = ddpipe.distributed.init(device="cpu")
    problem = cp.make_problem(problem_options)
    torch.manual_seed(int(c["seed"]))
    model = cp.make_model(problem.options.classes)
    wrapped = ddpipe.distributed.wrap(model, job, "ddp")
    optimizer = cp.make_optimizer(model)
    loader = ddpipe.EncodedStream(data, plan=plan_options(str(c["mode"]), float(c["q"])), seed=int(c["seed"]),
                                  comm=job.comm)
    schedule = cp.Schedule(job.size * BATCH, len(loader) * int(c["epochs"]), len(loader))
    step, state = 0, None
    for epoch in range(int(c["epochs"])):
        loader.set_epoch(epoch)
        for batch in loader:
            images = np.stack([np.asarray(Image.open(io.BytesIO(s["png"]))) for s in batch])
            labels = torch.tensor([int(s["cls"]) for s in batch])
            for group in optimizer.param_groups:
                group["lr"] = schedule.rate(step)
            ddpipe.train.train_step(wrapped, optimizer, cp.as_tensor(images), labels)
            step += 1
            if step == c["compare_at_step"]:
                state = {k: v.clone() for k, v in model.state_dict().items()}
    if job.rank == 0:
        torch.save({"state": state, "top1": cp.top1(model, problem.test_images, problem.test_labels)}, out)
    ddpipe.distributed.shutdown(job)


def real_check(data: Path, problem_options: cp.ProblemOptions) -> dict[str, Any]:
    import torch

    out = DATA / "shuffle-accuracy-real.pt"
    c = REAL_CHECK
    t0 = time.perf_counter()
    mpiexec(int(c["world"]), __file__, "--real-worker", data, out, "--per-class", str(problem_options.per_class))
    real = torch.load(out)
    virtual = train_virtual(data, problem_options, int(c["world"]), str(c["mode"]), float(c["q"]), int(c["seed"]),
                            int(c["epochs"]), int(c["compare_at_step"]))
    diff = max(float((virtual["state"][k].double() - v.double()).abs().max()) for k, v in real["state"].items())
    return {**c, "real_top1": real["top1"], "virtual_top1": virtual["top1"], "max_weight_difference": diff,
            "seconds": time.perf_counter() - t0}


def real_check_note(check: dict[str, Any]) -> str:
    return (f"Real {check['world']} ranks under mpiexec against {check['world']} virtual ranks ({check['mode']} "
            f"Q={check['q']}, {check['epochs']} epoch, seed {check['seed']}): largest weight difference after "
            f"{check['compare_at_step']} steps {check['max_weight_difference']:.1e}; top-1 after the epoch "
            f"{100 * check['real_top1']:.2f}% (real) and {100 * check['virtual_top1']:.2f}% (virtual).")


def summarise(runs: list[dict[str, Any]], scores: dict[tuple[int, str, float], dict[str, float]],
              worlds: list[int], fractions: list[float]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows, summary = [], []
    for world in worlds:
        def mean(mode: str, q: float, world: int = world) -> tuple[float, float]:
            accs = [100 * r["top1"] for r in runs if (r["world"], r["mode"], r["q"]) == (world, mode, q)]
            return float(np.mean(accs)), float(np.std(accs))

        best, _ = mean("global", 0.0)
        local, _ = mean("local", 0.0)
        gap = best - local
        recovering = None
        for mode, q in configs(fractions):
            acc, spread = mean(mode, q)
            recovered = (acc - local) / gap if gap > 0 else float("nan")
            score = scores[(world, mode, q)]
            rows.append({"world": world, "mode": mode if mode != "partial" else f"partial Q={q}", "top1": acc,
                         "std": spread, "vs_global": acc - best, "recovered": 100 * recovered,
                         "batch_skew": score["batch_skew"], "rank_skew": score["rank_skew"],
                         "step_skew": score["step_skew"]})
            if mode == "partial" and recovering is None and recovered >= 0.9:
                recovering = q
        summary.append({"world": world, "samples_per_worker": None, "global": best, "local": local, "gap": gap,
                        "q_recovering_90": recovering})
    return rows, summary


def plot(rows: list[dict[str, Any]], worlds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, world in enumerate(worlds):
        colour = f"C{i}"
        mine = [r for r in rows if r["world"] == world]
        qs = [0.0] + [float(r["mode"].split("=")[1]) for r in mine if r["mode"].startswith("partial")]
        accs = [r["top1"] for r in mine if r["mode"] == "local"] + [r["top1"] for r in mine
                                                                   if r["mode"].startswith("partial")]
        ax.plot(qs, accs, "o-", color=colour, label=f"W = {world}: local (Q = 0) and partial")
        ax.axhline(next(r["top1"] for r in mine if r["mode"] == "global"), color=colour, ls="--", lw=1)
    ax.set_xlabel("exchange fraction Q")
    ax.set_ylabel("top-1 % (held-out)")
    ax.set_title("Partial exchange against local shuffling (dashed: global shuffle)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def buffer_study(data: Path, problem: cp.Problem, world: int, seeds: int, epochs: int, jobs: int) -> None:
    """Where no Q recovers the gap, is the shuffle buffer the lever? The same training at one W with
    larger buffers (the reference in the same run: global shuffling)."""
    modes, buffers = BUFFER_STUDY
    todo = [(m, q, b, s) for m, q in modes for b in buffers for s in range(seeds) if m != "global" or b == BUFFER]
    with ProcessPoolExecutor(jobs) as pool:
        runs = [f.result() for f in [pool.submit(train_virtual, data, problem.options, world, m, q, s, epochs, -1, b)
                                     for m, q, b, s in todo]]
    for run in runs:
        run.pop("state")
    command = (f"python benchmarks/shuffle_accuracy.py --buffer-study {world} --seeds {seeds} --epochs {epochs}"
               + per_class_argument(problem.options))
    buffer_report(data, problem, world, runs, command, machine())


def buffer_report(data: Path, problem: cp.Problem, world: int, runs: list[dict[str, Any]], command: str,
                  where: dict[str, Any]) -> None:
    modes, buffers = BUFFER_STUDY
    best = float(np.mean([r["top1"] for r in runs if r["mode"] == "global"]))
    rows = []
    for m, q in modes:
        for b in buffers if m != "global" else [BUFFER]:
            accs = [100 * r["top1"] for r in runs if (r["mode"], r["q"], r["buffer"]) == (m, q, b)]
            score = stream_scores(data, problem, world, m, q, b)
            rows.append({"mode": m if m != "partial" else f"partial Q={q}", "buffer": b, "top1": float(np.mean(accs)),
                         "std": float(np.std(accs)), "vs_global": float(np.mean(accs)) - 100 * best,
                         "batch_skew": score["batch_skew"], "step_skew": score["step_skew"]})
    text = table(rows, [("mode", "shuffle", "s"), ("buffer", "buffer (samples)", "d"), ("top1", "top-1 %", ".2f"),
                        ("std", "std", ".2f"), ("vs_global", "vs global", "+.2f"), ("batch_skew", "batch skew", ".3f"),
                        ("step_skew", "step skew", ".3f")])
    path = save("shuffle_accuracy_buffer", {"benchmark": "shuffle_accuracy_buffer", "command": command,
                                            "machine": where, "world": world, "rows": rows, "runs": runs,
                                            "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.05, 0.1, 0.3, 0.5, 0.7, 0.9])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="configurations trained at once")
    ap.add_argument("--no-real-check", action="store_true", help="skip the 4-rank mpiexec run")
    ap.add_argument("--per-class", type=int, default=cp.ProblemOptions.per_class,
                    help="training images per class (fewer: a quicker run, and a problem of another size)")
    ap.add_argument("--buffer-study", type=int, metavar="W",
                    help="instead: at this W, local, Q = 0.3, 0.7 and global with shuffle buffers of "
                         + ", ".join(map(str, BUFFER_STUDY[1])) + " samples")
    ap.add_argument("--rescore", action="store_true",
                    help="rebuild the saved tables' stream scores from their runs, training nothing")
    ap.add_argument("--real-worker", nargs=2, metavar=("DATA", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    problem_options = cp.ProblemOptions(per_class=args.per_class)
    if args.real_worker:
        real_worker(Path(args.real_worker[0]), Path(args.real_worker[1]), problem_options)
        return
    default = problem_options == cp.ProblemOptions()
    data = DATA / "shuffle-accuracy" / ("train" if default else f"train-{args.per_class}-per-class")
    problem = cp.make_problem(problem_options)
    if not (data / "index.json").exists():
        cp.write_problem(problem, data)
    if args.buffer_study:
        buffer_study(data, problem, args.buffer_study, args.seeds, args.epochs, args.jobs)
        return
    if args.rescore:
        rescore(data, problem)
        return
    jobs = [(w, m, q, s) for w in args.worlds for m, q in configs(args.fractions) for s in range(args.seeds)]
    jobs.sort(key=lambda j: -j[0])  # the largest worlds first: their plans cost most
    runs = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(train_virtual, data, problem_options, w, m, q, s, args.epochs) for w, m, q, s in jobs]
        for future in futures:
            run = future.result()
            run.pop("state")
            runs.append(run)
            print(f"  W={run['world']} {run['mode']} Q={run['q']} seed={run['seed']}: {100 * run['top1']:.2f}% "
                  f"({run['seconds']:.0f} s)", file=sys.stderr, flush=True)
    check = None if args.no_real_check else real_check(data, problem_options)
    command = ("python benchmarks/shuffle_accuracy.py --worlds " + " ".join(map(str, args.worlds))
               + f" --seeds {args.seeds} --epochs {args.epochs}" + per_class_argument(problem_options))
    report(data, problem, runs, check, command, {"epochs": args.epochs, "seconds": time.perf_counter() - t0,
                                                 "machine": machine()})


def rescore(data: Path, problem: cp.Problem) -> None:
    """Rebuild the saved reports' tables from their training runs, with the stream scores of today's
    code (the scores are a pure function of the plans; nothing is trained again)."""
    doc = json.loads((RESULTS / "shuffle_accuracy.json").read_text())
    report(data, problem, doc["runs"], doc["real_check"], doc["command"],
           {"epochs": doc["epochs"], "seconds": doc["seconds"], "machine": doc["machine"]})
    study = RESULTS / "shuffle_accuracy_buffer.json"
    if study.exists():
        doc = json.loads(study.read_text())
        buffer_report(data, problem, doc["world"], doc["runs"], doc["command"], doc["machine"])


def report(data: Path, problem: cp.Problem, runs: list[dict[str, Any]], check: dict[str, Any] | None, command: str,
           extra: dict[str, Any]) -> None:
    worlds = sorted({r["world"] for r in runs})
    fractions = sorted({r["q"] for r in runs if r["mode"] == "partial"})
    scores = {(w, m, q): stream_scores(data, problem, w, m, q) for w in worlds for m, q in configs(fractions)}
    rows, summary = summarise(runs, scores, worlds, fractions)
    for s in summary:
        s["samples_per_worker"] = len(problem.train_labels) // s["world"]
    cols = [("world", "W", "d"), ("mode", "shuffle", "s"), ("top1", "top-1 %", ".2f"), ("std", "std", ".2f"),
            ("vs_global", "vs global", "+.2f"), ("recovered", "gap recovered %", ".0f"),
            ("batch_skew", "batch skew", ".3f"), ("rank_skew", "rank skew", ".3f"), ("step_skew", "step skew", ".3f")]
    text = table(rows, cols)
    summary_text = table(summary, [("world", "W", "d"), ("samples_per_worker", "samples/worker", "d"),
                                   ("global", "global %", ".2f"), ("local", "local %", ".2f"),
                                   ("gap", "gap (points)", ".2f"),
                                   ("q_recovering_90", "smallest Q recovering 90%", "g")])
    png = FIGURES / "shuffle_accuracy.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    plot(rows, worlds, png)
    shown = png.relative_to(ROOT) if png.is_relative_to(ROOT) else png  # a trial run's is elsewhere
    doc = {"benchmark": "shuffle_accuracy", "command": command, "batch_per_rank": BATCH,
           "problem": dataclasses.asdict(problem.options), "rows": rows, "summary": summary, "real_check": check,
           "runs": runs, "table": text, "summary_table": summary_text, "plot": str(shown), **extra}
    if check:
        doc["note"] = real_check_note(check)
    path = save("shuffle_accuracy", doc)
    print(text)
    print()
    print(summary_text)
    if check:
        print("\n" + doc["note"])
    print(f"\nwrote {path} and {png}", file=sys.stderr)


if __name__ == "__main__":
    main()
