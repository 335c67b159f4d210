"""The data-parallel training loop fed by ddpipe's Loader.

Per epoch it logs, from every rank: images/s, mean loss, top-1 accuracy on a held-out dataset when
one is given, and the data wait: the time each step spends waiting for its batch as a share of the
step (the stall percentage). Checkpoints hold the model, the optimizer, the step and the loader's
state, so training resumes mid-epoch with exactly the samples the epoch had not yet yielded.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..comm import Comm, launched_by_mpi
from ..decode import normalize
from ..errors import DdpipeError
from ..formats.atomic import atomic_write_bytes
from ..pipeline import Loader
from .mpi_allreduce import DEFAULT_BUCKET_BYTES, MPIGradientAverager
from .step import train_step


@dataclass(frozen=True)
class TrainOptions:
    epochs: int = 1
    allreduce: str = "ddp"  # "ddp" or "mpi"
    lr: float = 0.1  # for a global batch of ``reference_batch``; scaled linearly with the real one
    reference_batch: int = 256
    warmup_epochs: float = 0.0  # linear warm-up from lr / warmup_factor (Goyal et al., 2017)
    momentum: float = 0.9
    weight_decay: float = 1e-4
    amp: bool = False  # mixed precision (GPU)
    channels_last: bool = False
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    checkpoint: Path | None = None
    checkpoint_every: int = 0  # steps; 0: at the end of each epoch only
    max_steps: int = 0  # stop after this many steps in total (0: no limit), e.g. to test resumption


@dataclass
class EpochLog:
    epoch: int
    steps: int = 0
    images: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0
    loss_sum: float = 0.0
    top1: float | None = None
    per_rank: list[dict[str, float]] = field(default_factory=list)

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds else 0.0

    @property
    def stall(self) -> float:
        return self.wait_seconds / self.seconds if self.seconds else 0.0


def scaled_lr(opt: TrainOptions, global_batch: int, epoch_fraction: float) -> float:
    """Linear scaling with the global batch, after a linear warm-up over ``warmup_epochs``."""
    target = opt.lr * global_batch / opt.reference_batch
    if opt.warmup_epochs and epoch_fraction < opt.warmup_epochs:
        return target * (0.1 + 0.9 * epoch_fraction / opt.warmup_epochs)
    return target


class Trainer:
    def __init__(self, model: nn.Module, loader: Loader, comm: Comm, options: TrainOptions,
                 evaluate: Loader | None = None, log: Callable[[str], None] | None = None) -> None:
        self.opt = options
        self.loader, self.eval_loader, self.comm = loader, evaluate, comm
        self.device = loader.device or torch.device("cpu")
        self.model = model.to(self.device)
        if options.channels_last:
            # supported at run time; torch's stubs omit memory_format from Module.to
            self.model = self.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.log = log or (lambda line: print(line, flush=True) if comm.world.rank == 0 else None)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=options.lr, momentum=options.momentum,
                                         weight_decay=options.weight_decay)
        self.averager: MPIGradientAverager | None = None
        if options.allreduce == "mpi" and comm.world.size > 1 and not launched_by_mpi():
            raise DdpipeError("allreduce='mpi' needs an MPI launcher (mpiexec or srun); under torchrun use 'ddp'")
        if options.allreduce == "mpi" and comm.world.size > 1:
            self.averager = MPIGradientAverager(self.model, comm.gradient_channel(), options.bucket_bytes)
            self.averager.broadcast_parameters()
            self.trained: nn.Module = self.model
        elif options.allreduce == "ddp" and comm.world.size > 1:
            from .ddp import wrap_ddp

            self.trained = wrap_ddp(self.model, comm, self.device, options.bucket_bytes)
        elif options.allreduce in ("ddp", "mpi"):
            self.trained = self.model
        else:
            raise ValueError(f"allreduce must be 'ddp' or 'mpi', not {options.allreduce!r}")
        use_amp = options.amp and self.device.type == "cuda"
        self.amp_dtype = torch.float16 if use_amp else None
        self.scaler = torch.amp.GradScaler("cuda") if use_amp else None
        self.step = 0
        self.epoch = 0
        if options.checkpoint is not None and options.checkpoint.exists():
            self._restore(options.checkpoint)

    @property
    def global_batch(self) -> int:
        return self.loader.options.batch_size * self.comm.world.size

    def _images(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype == torch.uint8:  # uint8 batches are normalised here, on the device
            images = normalize(images, self.loader.decode_options)
        if self.opt.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def fit(self) -> list[EpochLog]:
        logs = []
        while self.epoch < self.opt.epochs:
            if self.opt.max_steps and self.step >= self.opt.max_steps:
                break
            logs.append(self._epoch())
        return logs

    def _epoch(self) -> EpochLog:
        loader, log = self.loader, EpochLog(self.epoch)
        if loader.epoch != self.epoch:
            loader.set_epoch(self.epoch)
        batches = max(len(loader), 1)
        self.trained.train()
        t_epoch = time.perf_counter()
        t_wait = time.perf_counter()
        stopped = False
        for images, labels in loader:
            log.wait_seconds += time.perf_counter() - t_wait
            for group in self.optimizer.param_groups:
                group["lr"] = scaled_lr(self.opt, self.global_batch, self.epoch + log.steps / batches)
            loss = train_step(self.trained, self.optimizer, self._images(images), labels, self.averager,
                              self.scaler, self.amp_dtype)
            log.loss_sum += float(loss) * len(labels)
            log.images += len(labels)
            log.steps += 1
            self.step += 1
            if self.opt.checkpoint and self.opt.checkpoint_every and self.step % self.opt.checkpoint_every == 0:
                self.save(self.opt.checkpoint)
            if self.opt.max_steps and self.step >= self.opt.max_steps:
                stopped = True
                break
            t_wait = time.perf_counter()
        log.seconds = time.perf_counter() - t_epoch
        if not stopped:
            self.epoch += 1
            if self.eval_loader is not None:
                log.top1 = self._top1()
            if self.opt.checkpoint:
                self.save(self.opt.checkpoint)
        self._report(log)
        return log

    def _top1(self) -> float:
        assert self.eval_loader is not None
        self.trained.eval()
        correct = total = 0
        with torch.no_grad():
            for images, labels in self.eval_loader:
                correct += int((self.trained(self._images(images)).argmax(1) == labels).sum())
                total += len(labels)
        both = self.comm.allgather((correct, total))
        return sum(c for c, _ in both) / max(sum(t for _, t in both), 1)

    def _report(self, log: EpochLog) -> None:
        mine = {"images": log.images, "seconds": log.seconds, "wait": log.wait_seconds, "loss": log.loss_sum}
        log.per_rank = self.comm.allgather(mine)
        total = sum(r["images"] for r in log.per_rank)
        slowest = max(r["seconds"] for r in log.per_rank)
        loss = sum(r["loss"] for r in log.per_rank) / max(total, 1)
        stalls = " ".join(f"{100 * r['wait'] / r['seconds']:.0f}%" if r["seconds"] else "-" for r in log.per_rank)
        top1 = f", top-1 {100 * log.top1:.2f}%" if log.top1 is not None else ""
        self.log(f"epoch {log.epoch}: {total} images in {slowest:.1f} s, {total / max(slowest, 1e-9):.0f} images/s, "
                 f"loss {loss:.4f}{top1}, data wait per rank {stalls}")

    def save(self, path: Path) -> None:
        """Model, optimizer, step and loader state, written atomically by rank 0."""
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                 "epoch": self.epoch, "loader": self.loader.state_dict(),
                 "scaler": self.scaler.state_dict() if self.scaler else None}
        if self.comm.world.rank == 0:
            buf = io.BytesIO()
            torch.save(state, buf)
            atomic_write_bytes(path, buf.getvalue())
        self.comm.barrier()

    def _restore(self, path: Path) -> None:
        state: dict[str, Any] = torch.load(path, map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch = state["step"], state["epoch"]
        self.loader.load_state_dict(state["loader"])
        if self.averager is not None:
            self.averager.broadcast_parameters()
        self.log(f"resumed from {path}: epoch {self.epoch}, step {self.step}, "
                 f"{len(self.loader)} batches left in the epoch")
