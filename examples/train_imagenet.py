"""Train an image classifier on ddpipe shards: a complete data-parallel script to copy and adapt.

    python examples/train_imagenet.py DATA [--val VAL]                     # one process
    mpiexec -n 8 python examples/train_imagenet.py DATA --averaging mpi    # MPI (or srun)
    torchrun --nproc-per-node 8 examples/train_imagenet.py DATA            # torchrun

ResNet-50 by default (``--model smallcnn`` for a quick run); partial shuffling across ranks;
optional node-local staging; SGD with the learning rate scaled to the global batch and a linear
warm-up; AMP and channels-last on GPUs; a progress line every ``--log-every`` steps; top-1 on
``--val`` after each epoch; checkpoints that resume mid-epoch with exactly the samples left, and one
saved when a scheduler's SIGTERM (or Slurm's ``--signal=USR1@SECONDS``) stops every rank after a step.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

import ddpipe
import ddpipe.distributed
from ddpipe.train.held_out import as_trained, held_out_labels
from ddpipe.train.models import build_model


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data")
    p.add_argument("--val", help="a held-out dataset: top-1 after each epoch")
    p.add_argument("--model", default="resnet50", help="resnet18/34/50/101 or smallcnn")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--lr", type=float, default=0.1, help="for a global batch of 256")
    p.add_argument("--warmup-epochs", type=float, default=5.0)
    p.add_argument("--averaging", choices=["ddp", "mpi"], default="ddp")
    p.add_argument("--exchange-fraction", type=float, default=0.3, help="Q of partial shuffling")
    p.add_argument("--stage-dir", help="node-local directory to stage shards into")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--decode", default="auto", help="auto, dali-gpu, dali-cpu or pil")
    p.add_argument("--checkpoint", type=Path, help="saved every --checkpoint-every steps and at epoch ends")
    p.add_argument("--checkpoint-every", type=int, default=500)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--max-steps", type=int, default=0, help="stop (after a checkpoint) at this step")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main(args: argparse.Namespace, job: ddpipe.distributed.Job, started: float) -> None:
    gpu = job.device.type == "cuda"
    # require_labels: a sample with no cls stops the epoch naming it (the loss needs a class for each)
    decode = ddpipe.DecodeOptions(decoder=args.decode, device=str(job.device), size=args.image_size,
                                  resize_shorter=round(args.image_size * 8 / 7), dtype="uint8", channels_last=gpu,
                                  require_labels=True)
    train = ddpipe.Loader(args.data, plan=ddpipe.PlanOptions(batch_size=args.batch_size, shuffle="partial",
                                                             exchange_fraction=args.exchange_fraction, drop_last=True),
                          decode=decode, stage_dir=args.stage_dir, seed=args.seed, comm=job.comm)
    val, val_numbers = None, None
    if args.val:
        # pad=False: each validation image counted once, however many ranks share them (no padding copies)
        val = ddpipe.Loader(args.val, args.batch_size, shuffle="none", pad=False,
                            decode=dataclasses.replace(decode, train=False), comm=job.comm)
        # a validation set converted on its own numbers its classes its own way: scored by class name
        numbers = held_out_labels(train.dataset.classes, val.dataset)
        val_numbers = None if numbers is None else torch.from_numpy(numbers).to(job.device)

    torch.manual_seed(args.seed)
    model = build_model(args.model, len(train.dataset.classes) or 1000).to(job.device)
    if gpu:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # missing from torch's stubs
    model = ddpipe.distributed.wrap(model, job, args.averaging)  # every rank starts from rank 0's weights
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler("cuda") if gpu else None
    global_batch = args.batch_size * job.size
    peak_lr = args.lr * global_batch / 256  # linear scaling (Goyal et al., 2017)

    step, epoch = 0, 0
    if args.checkpoint:  # made now: a directory that cannot be was found by the first save, an epoch in
        args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    if args.checkpoint and args.checkpoint.exists():
        state = torch.load(args.checkpoint, map_location=job.device, weights_only=False)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scaler is not None and state["scaler"]:
            scaler.load_state_dict(state["scaler"])
        step, epoch = state["step"], state["epoch"]
        train.load_state_dict(state["loader"])  # the rest of the interrupted epoch, on any number of ranks
        if job.is_main:
            print(f"resumed from {args.checkpoint}: epoch {epoch}, step {step}, {len(train)} batches left", flush=True)

    def save() -> None:
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                 "epoch": epoch, "scaler": scaler.state_dict() if scaler else None, "loader": train.state_dict()}
        if job.is_main and args.checkpoint:  # written whole, then renamed: never half a checkpoint
            partial = args.checkpoint.with_name(args.checkpoint.name + ".partial")
            torch.save(state, partial)
            os.replace(partial, args.checkpoint)
        job.comm.barrier()

    # a scheduler's SIGTERM (or Slurm's --signal=USR1@...) to any rank: every rank saves after one step
    with ddpipe.distributed.stop_on_signals(job) as stop:
        first_batch, stopped = True, False
        while epoch < args.epochs:
            if train.epoch != epoch:
                train.set_epoch(epoch)
            batches = len(train)  # what is left of this epoch (all of it, unless resumed)
            whole = train.batches_per_epoch
            before = whole - batches  # what a resumed epoch had done
            done = images = 0
            loss_sum = wait = 0.0
            t_epoch = t_wait = time.perf_counter()
            for x, y in train:
                wait += time.perf_counter() - t_wait
                if first_batch and job.is_main:
                    print(f"first batch after {time.perf_counter() - started:.1f} s", flush=True)
                    first_batch = False
                warm = (epoch + (before + done) / whole) / args.warmup_epochs if args.warmup_epochs else 1.0
                for group in optimizer.param_groups:
                    group["lr"] = peak_lr * (0.1 + 0.9 * min(warm, 1.0))
                x = ddpipe.normalize(x, decode)  # uint8 batches become floats on the device
                if gpu:
                    x = x.contiguous(memory_format=torch.channels_last)
                model.zero_grad()
                with torch.autocast(job.device.type, dtype=torch.float16, enabled=gpu):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                model.backward(loss, scaler)  # gradients averaged across ranks
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                step, done, images = step + 1, done + 1, images + len(y)
                loss_sum += float(loss) * len(y)
                if done % args.log_every == 0 or done == batches:
                    report(job, epoch, done, batches, images, loss_sum, wait, time.perf_counter() - t_epoch)
                if args.checkpoint and step % args.checkpoint_every == 0:
                    save()
                asked = stop.agreed()  # every rank, every step: True on all after the same step
                if asked or (args.max_steps and step >= args.max_steps):
                    save()
                    if job.is_main:
                        print(f"stopped at step {step}" + (" (asked by a signal)" if asked else ""), flush=True)
                    stopped = True
                    break
                t_wait = time.perf_counter()
            if stopped:
                break
            epoch += 1
            if val is not None:
                top1, images = evaluate(model, val, val_numbers, decode, job)
                if job.is_main:
                    print(f"epoch {epoch - 1}: top-1 {100 * top1:.2f}% of {images} images", flush=True)
            save()
    ddpipe.distributed.shutdown(job)


def report(job: ddpipe.distributed.Job, epoch: int, done: int, batches: int, images: int, loss_sum: float,
           wait: float, seconds: float) -> None:
    """One line for the job: images/s, mean loss so far this epoch, and every rank's data wait."""
    ranks = job.comm.allgather((images, loss_sum, wait))
    total = sum(r[0] for r in ranks)
    loss = sum(r[1] for r in ranks) / max(total, 1)
    waits = " ".join(f"{100 * r[2] / max(seconds, 1e-9):.0f}%" for r in ranks)
    if job.is_main:
        print(f"epoch {epoch} step {done}/{batches}: {total / max(seconds, 1e-9):.0f} images/s, loss {loss:.6f}, "
              f"data wait per rank {waits}", flush=True)


def evaluate(model: torch.nn.Module, val: ddpipe.Loader, numbers: torch.Tensor | None, decode: ddpipe.DecodeOptions,
             job: ddpipe.distributed.Job) -> tuple[float, int]:
    """Top-1 over every rank's share of the held-out images (their labels as the training set's class
    numbers), and how many images that is."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in val:
            y = as_trained(y, numbers)
            correct += int((model(ddpipe.normalize(x, decode)).argmax(1) == y).sum())
            total += len(y)
    model.train()
    both = job.comm.allgather((correct, total))
    images = sum(t for _, t in both)
    return sum(c for c, _ in both) / max(images, 1), images


if __name__ == "__main__":
    arguments, t0 = parse_args(), time.perf_counter()
    this = ddpipe.distributed.init()  # who this process is; torch.distributed set up; a failing rank ends all
    try:
        main(arguments, this, t0)
    except ddpipe.DdpipeError as e:  # a bad path or dataset: said in one line, not a traceback
        if this.is_main or not e.job_wide:  # job-wide: every rank raised it alike; rank 0 says it
            print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr, flush=True)
        if not e.job_wide:
            this.comm.end_job(1)  # the other ranks would wait for this one in their next collective
        ddpipe.distributed.shutdown(this)
        raise SystemExit(1) from None
