"""The job's processes and the collectives ddpipe issues: the one package that talks to MPI and
torch.distributed.

A process started without a launcher is a world of one and never loads MPI. Under ``mpiexec`` or
``srun`` ranks come from MPI itself (``mpi``). Under ``torchrun``, which starts no MPI, the world
comes from its rendezvous and ddpipe's collectives go through a gloo group of its own
(``torch_dist``), never the training script's default process group.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from types import MappingProxyType

from .base import DEFAULT_TIMEOUT, Comm, GradientChannel, Watchdog, end_job_on_uncaught
from .heartbeat import DEFAULT_SILENCE
from .world import World, available_cores, launched_by_mpi, launched_by_torchrun


def init_comm(timeout: float = DEFAULT_TIMEOUT, tune_allocator: bool = True, abort_on_error: bool = True,
              silence: float = DEFAULT_SILENCE) -> Comm:
    """The job's communicator: MPI under mpiexec/srun, torch.distributed under torchrun, else a world
    of one. ``timeout``: how long a collective may wait for the others at most; ``silence``: under
    MPI, how long a rank waiting on others lets a peer go without a heartbeat before it ends the job
    naming the peer's host (:mod:`ddpipe.comm.heartbeat`).

    This is a data-loading process's set-up at the edge, the one place that reads the process's
    surroundings for the loaders given the communicator: the host name (``world.host``) and the
    environment (``comm.environ``: a staging directory's ``$VARS``, ``"auto"``). Two settings of the
    whole process, unless told not to: it tunes glibc's allocator for the churn of ~100 KB samples
    (:func:`ddpipe.memory.keep_freed_memory`), giving freed memory back after an epoch when the
    process has outgrown its first ones (``comm.allocator``, :class:`ddpipe.memory.EpochMemory`); and
    in a job of several ranks an uncaught exception on any rank ends every rank at once
    (:func:`ddpipe.comm.base.end_job_on_uncaught`)."""
    from ..memory import EpochMemory, keep_freed_memory

    if tune_allocator:
        keep_freed_memory()
    comm = _job_comm(timeout, silence)
    comm.world = dataclasses.replace(comm.world, host=socket.gethostname())
    comm.environ = MappingProxyType(dict(os.environ))
    comm.allocator = EpochMemory() if tune_allocator else None
    if abort_on_error and comm.world.size > 1:
        end_job_on_uncaught(comm)
    return comm


def _job_comm(timeout: float, silence: float) -> Comm:
    if launched_by_mpi():
        try:
            from .mpi import world_comm
        except ImportError as e:
            from ..errors import DdpipeError

            raise DdpipeError("launched under MPI but mpi4py is missing: pip install 'ddpipe[mpi]'") from e
        return world_comm(timeout, silence)
    if launched_by_torchrun():
        from .torch_dist import TorchComm

        return TorchComm(timeout)
    return Comm(World(cores=available_cores()), timeout)


__all__ = ["DEFAULT_SILENCE", "DEFAULT_TIMEOUT", "Comm", "GradientChannel", "Watchdog", "World", "available_cores",
           "init_comm", "launched_by_mpi", "launched_by_torchrun"]
