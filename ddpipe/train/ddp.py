"""PyTorch DistributedDataParallel under any launcher: NCCL on GPUs, gloo on CPUs.

Under torchrun the process group comes from its environment; under mpiexec or srun, rank 0 picks a
free port and MPI tells every rank where to meet.
"""

from __future__ import annotations

import atexit
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..comm import Comm, launched_by_torchrun
from ..errors import DdpipeError


def init_process_group(comm: Comm, device: torch.device) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    if dist.is_initialized():
        existing = str(dist.get_backend())
        if backend not in existing:
            raise DdpipeError(f"the default process group uses {existing}, which cannot average {device.type} "
                              f"gradients well: create it with {backend} (or let ddpipe create it)")
        return
    if launched_by_torchrun():
        dist.init_process_group(backend)
        return
    address = None
    if comm.world.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            address = f"tcp://{socket.gethostname()}:{s.getsockname()[1]}"
    address = comm.allgather(address)[0]
    dist.init_process_group(backend, init_method=address, rank=comm.world.rank, world_size=comm.world.size)
    # a rank leaving while another's gloo threads still talked to it ended the job with "terminate called
    # without an active exception" about one run in three on 4 ranks: leave together, then tear down
    atexit.register(_leave_process_group)


def _leave_process_group() -> None:
    if not dist.is_initialized():
        return
    try:
        if dist.get_backend() == "gloo":  # bounded: a rank that died must not hang the others' exit
            dist.monitored_barrier(timeout=timedelta(seconds=60))
    except RuntimeError:
        pass
    dist.destroy_process_group()


def wrap_ddp(model: nn.Module, comm: Comm, device: torch.device, bucket_bytes: int) -> DistributedDataParallel:
    init_process_group(comm, device)
    ids = [device.index or 0] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_bytes / 2**20)

