"""The distributed part of a training script, under any launcher: ``ddpipe.distributed``.

    job = ddpipe.distributed.init()                 # mpiexec, srun, torchrun or plain python
    loader = ddpipe.Loader(path, 256, comm=job.comm)
    model = ddpipe.distributed.wrap(model.to(job.device), job, averaging="ddp")  # or "mpi"
    ...
    loss = criterion(model(images), labels)
    model.backward(loss)                            # gradients averaged across ranks
    optimizer.step()

:func:`init` finds out who this process is, initialises torch.distributed's default process group
(NCCL on GPUs, gloo on CPUs) without the user exporting ``RANK`` or ``MASTER_ADDR`` (under MPI or
Slurm, rank 0's address is shared over MPI), and by default makes an uncaught exception on any rank
end the whole job within seconds, printed once by the rank that raised it.

:func:`wrap` gives both ways of averaging gradients one shape: PyTorch DDP, or ddpipe's MPI path
(bucketed ``Iallreduce`` posted from gradient hooks). Both start every rank from rank 0's weights.

:func:`stop_on_signals` stops every rank after the same step when a scheduler signals any of them.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..comm import Comm, World, init_comm, launched_by_mpi, launched_by_torchrun
from ..comm.base import DEFAULT_TIMEOUT, end_job_on_uncaught
from ..decode.output import named_device
from ..errors import DdpipeError
from .mpi_allreduce import DEFAULT_BUCKET_BYTES, MPIGradientAverager
from .stop import STOP_SIGNALS, StopRequest, StopVote

AVERAGING = ("ddp", "mpi")


@dataclass(frozen=True)
class Job:
    """This process in the job: its world, ddpipe's communicator (hand it to every ``Loader``), the
    device it trains on, and the launcher that started it (``"mpi"``, ``"torchrun"`` or ``"none"``)."""

    world: World
    comm: Comm
    device: torch.device
    launcher: str

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def size(self) -> int:
        return self.world.size

    @property
    def local_rank(self) -> int:
        return self.world.local_rank

    @property
    def is_main(self) -> bool:
        return self.world.rank == 0


def init(device: str = "auto", *, timeout: float = DEFAULT_TIMEOUT, abort_on_error: bool = True,
         process_group: bool = True, comm: Comm | None = None) -> Job:
    """Set up this process of the job. ``device``: ``"auto"`` (this rank's GPU by local rank, else
    the CPU), ``"cpu"`` or ``"cuda"``. ``process_group``: also initialise torch.distributed's default
    process group (if the script has not), as DDP needs. ``abort_on_error``: an uncaught exception
    (Ctrl-C included) on any rank ends every rank now, instead of leaving the others to wait out the
    collective timeout."""
    comm = comm or init_comm(timeout, abort_on_error=False)  # ending the job is set up below, after torch's hook
    target = _device(device, comm.world.local_rank)
    launcher = "mpi" if launched_by_mpi() else "torchrun" if launched_by_torchrun() else "none"
    job = Job(comm.world, comm, target, launcher)
    if process_group and comm.world.size > 1:
        init_process_group(job, timeout)
    if abort_on_error and comm.world.size > 1:  # after torch's own hook (init_process_group installs one)
        end_job_on_uncaught(comm)
    return job


def _device(device: str, local_rank: int) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    target = named_device(device)
    if target.type == "cuda":
        if target.index is None:
            target = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(target)
    return target


def init_process_group(job: Job, timeout: float = DEFAULT_TIMEOUT) -> None:
    """torch.distributed's default process group for this job (NCCL on GPUs, gloo on CPUs), unless
    the script made one already; under MPI, rank 0 picks the address and MPI tells every rank."""
    import datetime
    import socket

    import torch.distributed as dist

    backend = "nccl" if job.device.type == "cuda" else "gloo"
    if dist.is_initialized():
        existing = str(dist.get_backend())
        if backend not in existing:
            raise DdpipeError(f"the default process group uses {existing}, which cannot average "
                              f"{job.device.type} gradients well: create it with {backend} (or let ddpipe create it)")
        return
    wait = datetime.timedelta(seconds=timeout)
    if job.launcher == "torchrun":
        dist.init_process_group(backend, timeout=wait)
        return
    address = None
    if job.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            address = f"tcp://{socket.gethostname()}:{s.getsockname()[1]}"
    address = job.comm.allgather(address)[0]
    dist.init_process_group(backend, init_method=address, rank=job.rank, world_size=job.size, timeout=wait)
    # a rank leaving while another's gloo threads still talked to it ended the job with "terminate called
    # without an active exception" about one run in three on 4 ranks: leave together, then tear down
    atexit.register(_leave_process_group)


def _leave_process_group() -> None:
    import datetime

    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        if dist.get_backend() == "gloo":  # bounded: a rank that died must not hang the others' exit
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
    except RuntimeError:
        pass
    dist.destroy_process_group()


class DataParallel(nn.Module):
    """A model whose gradients are averaged across the job's ranks, the same to use whichever way
    averages them: call it, then :meth:`backward` on the loss, then step the optimizer."""

    def __init__(self, model: nn.Module, job: Job, averaging: str = "ddp",
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        super().__init__()
        if averaging not in AVERAGING:
            raise DdpipeError(f"averaging must be one of {', '.join(AVERAGING)}, not {averaging!r}")
        self.module = model
        self.averaging = averaging
        self.averager: MPIGradientAverager | None = None
        self.trained: nn.Module = model
        if job.size > 1 and averaging == "mpi":
            if job.launcher != "mpi":
                raise DdpipeError("averaging='mpi' needs an MPI launcher (mpiexec or srun); under torchrun use 'ddp'")
            self.averager = MPIGradientAverager(model, job.comm.gradient_channel(), bucket_bytes)
            self.averager.broadcast_parameters()
        elif job.size > 1:
            from torch.nn.parallel import DistributedDataParallel

            init_process_group(job)
            ids = [job.device.index or 0] if job.device.type == "cuda" else None
            # DDP broadcasts rank 0's parameters and buffers as it wraps
            self.trained = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_bytes / 2**20)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.trained(*args, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.averager is not None:
            self.averager.zero_grad()  # in place: its gradients are views into the fusion buffers
        else:
            self.module.zero_grad(set_to_none=set_to_none)

    def backward(self, loss: torch.Tensor, scaler: torch.amp.GradScaler | None = None) -> None:
        """Backward on ``loss`` (scaled by ``scaler`` for mixed precision); when it returns, every
        rank holds the average of the ranks' gradients."""
        if self.averager is not None:  # prescaled by 1 / world size: the allreduced sum is the average
            loss = loss * self.averager.loss_scale
        if scaler is not None:
            loss = scaler.scale(loss)
        loss.backward()
        if self.averager is not None:
            self.averager.synchronize()

    def close(self) -> None:
        if self.averager is not None:
            self.averager.close()


def wrap(model: nn.Module, job: Job, averaging: str = "ddp", bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> DataParallel:
    """``model`` (already on ``job.device``) with its gradients averaged by ``"ddp"`` or ``"mpi"``;
    every rank starts from rank 0's weights."""
    return DataParallel(model, job, averaging, bucket_bytes)


@contextlib.contextmanager
def stop_on_signals(job: Job, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[StopVote]:
    """Within it, SIGTERM or SIGUSR1 (``signals``) to any rank, as a scheduler sends before it ends or
    preempts a job, asks the job to stop; ``vote.agreed()``, called once per step on every rank, is then
    True on every rank after the same step: save a checkpoint there and leave the loop. A second signal
    ends a rank at once. Every rank enters it at the same point (it makes a process group)::

        with ddpipe.distributed.stop_on_signals(job) as stop:
            for images, labels in loader:
                ...                     # the step
                if stop.agreed():
                    save(); break
    """
    request = StopRequest()
    import torch.distributed as dist

    if job.size > 1 and not dist.is_initialized():
        init_process_group(job)  # the vote's group is made from it (a script that init()ed without it)
    vote = StopVote.for_job(request, job.size, job.comm.timeout)
    restore = request.catch(signals)
    try:
        yield vote
    except BaseException:
        restore()  # and no wait for the last vote: the other ranks may never cast it
        raise
    restore()
    vote.close()


def broadcast_parameters(model: nn.Module, job: Job) -> None:
    """Every rank takes rank 0's parameters and buffers (:func:`wrap` does this itself)."""
    if job.size == 1:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
        return
    channel = job.comm.gradient_channel()
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            host = t.detach().cpu().numpy().copy()
            channel.broadcast(host)
            t.copy_(torch.from_numpy(host))
    channel.free()


def shutdown(job: Job) -> None:
    """Leave the job cleanly: ddpipe's collectives, then torch.distributed's default group."""
    job.comm.close()
    _leave_process_group()
