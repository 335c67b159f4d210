"""The data-parallel training loop fed by ddpipe's Loader.

Per epoch it logs, from every rank: images/s, mean loss, top-1 accuracy on a held-out dataset when
one is given, and the data wait: the time each step spends waiting for its batch as a share of the
step (the stall percentage). Checkpoints hold the model, the optimizer, the step and the loader's
state, so training resumes mid-epoch with exactly the samples the epoch had not yet yielded.
"""

from __future__ import annotations

import io
import math
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..decode import normalize
from ..errors import DdpipeError, OptionError
from ..fields import local_path_option, number_option, refuse_non_boolean_flags, whole_option
from ..formats.atomic import atomic_write_bytes
from ..pipeline import Loader
from .distributed import DataParallel, Job, wrap
from .held_out import as_trained, held_out_labels
from .mpi_allreduce import DEFAULT_BUCKET_BYTES
from .step import train_step
from .stop import StopVote


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
    max_steps: int = 0  # stop after this many steps in total (0: no limit), saving a checkpoint first
    log_every: int = 0  # a progress line every this many steps (0: at epoch ends only)
    progress_bar: bool = True  # a bar on rank 0, when it writes to a terminal

    def __post_init__(self) -> None:
        refuse_non_boolean_flags(self)
        for name in ("lr", "warmup_epochs", "weight_decay", "momentum"):
            number_option(getattr(self, name), name)
        if self.allreduce not in ("ddp", "mpi"):
            raise OptionError(f"allreduce must be 'ddp' or 'mpi', not {self.allreduce!r}")
        if not 0 < self.lr < math.inf:  # NaN fails every comparison
            raise OptionError(f"lr must be a finite number more than 0, not {self.lr}")
        for name in ("warmup_epochs", "weight_decay"):
            if not 0 <= getattr(self, name) < math.inf:
                raise OptionError(f"{name} must be a finite number, 0 or more, not {getattr(self, name)}")
        if not 0 <= self.momentum < 1:
            raise OptionError(f"momentum must be in [0, 1), not {self.momentum}")
        for name, least in (("epochs", 1), ("reference_batch", 1), ("bucket_bytes", 1), ("checkpoint_every", 0),
                            ("max_steps", 0), ("log_every", 0)):
            whole_option(getattr(self, name), name, least)
        if self.checkpoint is not None:  # a str given is kept as a Path (it was AttributeError 'exists' at the start)
            object.__setattr__(self, "checkpoint", local_path_option(self.checkpoint, "checkpoint",
                                                                     "a file on this machine"))


@dataclass
class EpochLog:
    epoch: int
    steps: int = 0
    images: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0
    loss_sum: float = 0.0
    top1: float | None = None
    evaluated: int = 0  # held-out images top-1 is over (each once: the evaluation loader does not pad)
    served: int = 0  # with a decode service: this rank's batches the servers decoded, and those decoded here
    decoded_here: int = 0
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
    """``ddpipe train``'s loop, built on :mod:`ddpipe.distributed` as a user's own script would be:
    the model is wrapped with :func:`~ddpipe.distributed.wrap` for the job ``job``."""

    def __init__(self, model: nn.Module, loader: Loader, job: Job, options: TrainOptions,
                 evaluate: Loader | None = None, log: Callable[[str], None] | None = None,
                 stop: StopVote | None = None) -> None:
        self.opt = options
        self.loader, self.eval_loader, self.job, self.comm = loader, evaluate, job, job.comm
        # its labels as the training dataset's numbers, its classes matched by name (every rank alike)
        numbers = held_out_labels(loader.dataset.classes, evaluate.dataset) if evaluate is not None else None
        self.device = loader.device
        # on the device once, not copied there for each held-out batch
        self._held_out_numbers = torch.from_numpy(numbers).to(self.device) if numbers is not None else None
        self.model = model.to(self.device)
        if options.channels_last:
            # supported at run time; torch's stubs omit memory_format from Module.to
            self.model = self.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.log = log or (lambda line: print(line, flush=True) if job.is_main else None)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=options.lr, momentum=options.momentum,
                                         weight_decay=options.weight_decay)
        self.trained: DataParallel = wrap(self.model, job, options.allreduce, options.bucket_bytes)
        use_amp = options.amp and self.device.type == "cuda"
        self.amp_dtype = torch.float16 if use_amp else None
        self.scaler = torch.amp.GradScaler("cuda") if use_amp else None
        self.step = 0
        self.epoch = 0
        self._vote = stop  # ddpipe.distributed.stop_on_signals's: the ranks agree on the step to stop after
        self.stopped_by_signal = False
        if options.checkpoint is not None:
            saved = self._read_checkpoint(options.checkpoint)
            if saved is not None:
                self._restore(options.checkpoint, saved)

    @property
    def global_batch(self) -> int:
        return self.loader.stream.options.batch_size * self.comm.world.size

    def _images(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype == torch.uint8:  # uint8 batches are normalised here, on the device
            images = normalize(images, self.loader.decoding.options)
        if self.opt.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def fit(self) -> list[EpochLog]:
        logs = []
        if self.epoch >= self.opt.epochs:
            where = f" ({self.opt.checkpoint})" if self.opt.checkpoint else ""
            self.log(f"nothing left to do: the checkpoint{where} has finished all {self.opt.epochs} epochs; "
                     "ask for more with --epochs")
        while self.epoch < self.opt.epochs and not self.stopped_by_signal:
            if self.opt.max_steps and self.step >= self.opt.max_steps:
                break
            logs.append(self._epoch())
        return logs

    def _epoch(self) -> EpochLog:
        loader, log = self.loader, EpochLog(self.epoch)
        if loader.epoch != self.epoch:
            loader.set_epoch(self.epoch)
        batches = max(len(loader), 1)
        whole = max(loader.batches_per_epoch, 1)
        before = whole - len(loader)  # batches a resumed epoch had already done
        self.trained.train()
        t_epoch = time.perf_counter()
        t_wait = time.perf_counter()
        stopped = False
        bar = self._bar(batches)
        # summed on the device: reading a GPU loss every step would make the host wait for each step
        # before asking the loader for the next batch, so the GPU would idle while the host caught up
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        served_before = self._served()
        for images, labels in loader:
            log.wait_seconds += time.perf_counter() - t_wait
            for group in self.optimizer.param_groups:
                group["lr"] = scaled_lr(self.opt, self.global_batch, self.epoch + (before + log.steps) / whole)
            loss = train_step(self.trained, self.optimizer, self._images(images), labels, self.scaler,
                              self.amp_dtype)
            loss_sum += loss.double() * len(labels)
            log.images += len(labels)
            log.steps += 1
            self.step += 1
            if self.opt.checkpoint and self.opt.checkpoint_every and self.step % self.opt.checkpoint_every == 0:
                self.save(self.opt.checkpoint)
            if self.opt.log_every and log.steps % self.opt.log_every == 0 and log.steps < batches:
                log.loss_sum = float(loss_sum)
                self._progress(log, batches, time.perf_counter() - t_epoch)
            if bar is not None:
                bar.update()
            if stopped := self._stops_here():
                break
            t_wait = time.perf_counter()
        log.loss_sum = float(loss_sum)  # the epoch's time includes waiting for its last step
        log.seconds = time.perf_counter() - t_epoch
        served, decoded_here = self._served()
        log.served, log.decoded_here = served - served_before[0], decoded_here - served_before[1]
        if bar is not None:
            bar.close()
        if not stopped:
            self.epoch += 1
            if self.eval_loader is not None:
                log.top1, log.evaluated = self._top1()
            if self.opt.checkpoint:
                self.save(self.opt.checkpoint)
        self._report(log)
        return log

    def _stops_here(self) -> bool:
        """Whether the run stops after this step (every rank agreed on a signal, or --max-steps is
        reached), having saved its checkpoint."""
        if self._vote is not None and self._vote.agreed():
            self.stopped_by_signal = True
            asked = self._vote.request
            self._stop(asked.name if asked.signum else "a signal to another rank")
            return True
        if self.opt.max_steps and self.step >= self.opt.max_steps:
            self._stop("--max-steps")
            return True
        return False

    def _stop(self, why: str) -> None:
        """A run told to stop keeps what it did: a checkpoint of this step, where one is asked for."""
        if self.opt.checkpoint:
            self.save(self.opt.checkpoint)
            self.log(f"stopped after step {self.step} ({why}); checkpoint {self.opt.checkpoint}")
        else:
            self.log(f"stopped after step {self.step} ({why}); nothing saved (no --checkpoint)")

    def _top1(self) -> tuple[float, int]:
        """Top-1 accuracy on the held-out dataset, over all ranks, and the images it is over."""
        assert self.eval_loader is not None
        self.trained.eval()
        correct = total = 0
        with torch.no_grad():
            for images, labels in self.eval_loader:
                labels = as_trained(labels, self._held_out_numbers)
                correct += int((self.trained(self._images(images)).argmax(1) == labels).sum())
                total += len(labels)
        both = self.comm.allgather((correct, total))
        evaluated = sum(t for _, t in both)
        return sum(c for c, _ in both) / max(evaluated, 1), evaluated

    def _bar(self, batches: int) -> Any:
        """A progress bar on rank 0 when it writes to a terminal."""
        import sys

        if not (self.opt.progress_bar and self.job.is_main and sys.stderr.isatty()):
            return None
        from tqdm import tqdm

        return tqdm(total=batches, desc=f"epoch {self.epoch}", unit="step", dynamic_ncols=True, leave=False)

    def _progress(self, log: EpochLog, batches: int, seconds: float) -> None:
        """A line every ``log_every`` steps: every rank's figures so far (every rank is at this step)."""
        mine = {"images": log.images, "wait": log.wait_seconds, "loss": log.loss_sum}
        ranks = self.comm.allgather(mine)
        images = sum(r["images"] for r in ranks)
        loss = sum(r["loss"] for r in ranks) / max(images, 1)
        waits = " ".join(f"{100 * r['wait'] / max(seconds, 1e-9):.0f}%" for r in ranks)
        self.log(f"epoch {log.epoch} step {log.steps}/{batches}: {images / max(seconds, 1e-9):.0f} images/s, "
                 f"loss {loss:.4f}, data wait per rank {waits}")

    def _served(self) -> tuple[int, int]:
        """Batches the decode servers decoded for this rank so far, and those it decoded itself (0, 0
        without a service, or before its first batch)."""
        stats = self.loader.service_stats
        return (0, 0) if stats is None else (stats.remote_batches, stats.local_batches)

    def _report(self, log: EpochLog) -> None:
        mine = {"images": log.images, "seconds": log.seconds, "wait": log.wait_seconds, "loss": log.loss_sum,
                "served": log.served, "here": log.decoded_here}
        log.per_rank = self.comm.allgather(mine)
        total = sum(r["images"] for r in log.per_rank)
        slowest = max(r["seconds"] for r in log.per_rank)
        loss = sum(r["loss"] for r in log.per_rank) / max(total, 1)
        stalls = " ".join(f"{100 * r['wait'] / r['seconds']:.0f}%" if r["seconds"] else "-" for r in log.per_rank)
        top1 = f", top-1 {100 * log.top1:.2f}% of {log.evaluated} images" if log.top1 is not None else ""
        self.log(f"epoch {log.epoch}: {total} images in {slowest:.1f} s, {total / max(slowest, 1e-9):.0f} images/s, "
                 f"loss {loss:.4f}{top1}{self._servers_part(log.per_rank)}, data wait per rank {stalls}")

    def _servers_part(self, per_rank: list[dict[str, float]]) -> str:
        """With a decode service, how many of the job's batches the servers decoded: servers that never
        answered (a wrong address, a port closed between the nodes) leave the trainers decoding on
        their own, at their own speed, with one warning at the start; each epoch's line says so."""
        if not self.loader.decoding.options.service:
            return ""
        served = sum(int(r["served"]) for r in per_rank)
        everything = served + sum(int(r["here"]) for r in per_rank)
        return f", decode servers {served} of {everything} batches"

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

    def _read_checkpoint(self, path: Path) -> bytes | None:
        """The checkpoint's bytes as rank 0 reads them, on every rank; None where rank 0 has none. Rank 0
        writes it (:meth:`save`), so it alone need see the path: a node-local one on other nodes either held
        nothing, and those ranks started afresh beside a rank 0 that resumed (their epochs' plans apart, the
        exchange failed on them), or an older run's file."""
        found: tuple[bytes | None, str] = (None, "")
        if self.comm.world.rank == 0 and path.exists():
            try:
                found = (path.read_bytes(), "")
            except OSError as e:
                found = (None, f"the checkpoint cannot be read: {e.strerror or e}")
        data, why = self.comm.allgather(found)[0]
        if why:
            raise DdpipeError(why, path=path).everywhere()
        return data

    def _restore(self, path: Path, saved: bytes) -> None:
        # every rank has the same bytes: each fails alike, and says so without ending the others
        # weights_only: tensors and plain values, never code (a checkpoint is a file like any input)
        try:
            state: dict[str, Any] = torch.load(io.BytesIO(saved), map_location=self.device, weights_only=True)
            if not isinstance(state, dict) or not {"model", "optimizer", "step", "epoch", "loader"} <= set(state):
                raise ValueError("not a ddpipe train checkpoint (model, optimizer, step, epoch, loader)")
        except pickle.UnpicklingError:  # torch's own message runs to a paragraph
            raise DdpipeError("not a checkpoint ddpipe train can resume from: not a PyTorch file of tensors and plain "
                              "values", path=path).everywhere() from None
        except (RuntimeError, ValueError, EOFError, OSError) as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DdpipeError(f"not a checkpoint ddpipe train can resume from: {reason}",
                              path=path).everywhere() from None
        mismatch = _model_mismatch(self.model.state_dict(), state["model"])
        if mismatch:  # torch's own error lists every key, over many lines
            raise DdpipeError(f"a checkpoint of another model ({mismatch}): resume with the --model, and the classes, "
                              "it was saved with, or give another --checkpoint", path=path).everywhere()
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch = state["step"], state["epoch"]
        given = self.loader.stream.seed
        self.loader.load_state_dict(state["loader"])
        kept = self.loader.stream.seed  # the saved order goes on: a seed given now would replay other samples
        self.log(f"resumed from {path}: epoch {self.epoch}, step {self.step}, "
                 f"{len(self.loader)} batches left in the epoch"
                 + (f"; the samples keep the checkpoint's seed, {kept}, not {given}" if kept != given else ""))


def _model_mismatch(ours: dict[str, Any], saved: object) -> str:
    """How a checkpoint's model parameters differ from this model's, by a first example; "" if they match."""
    if not isinstance(saved, dict):
        return "its model is not a dict of parameters"
    missing = [k for k in ours if k not in saved]
    extra = [k for k in saved if k not in ours]
    if missing or extra:
        return f"{len(missing)} of this model's parameters missing, e.g. {missing[0]!r}" if missing else \
            f"{len(extra)} parameters this model lacks, e.g. {extra[0]!r}"
    for k, t in ours.items():
        shape = tuple(getattr(saved[k], "shape", ()))
        if shape != tuple(t.shape):
            return f"{k!r} is {'x'.join(map(str, shape)) or 'a scalar'} there, {'x'.join(map(str, t.shape))} here"
    return ""
