"""The process world and the collectives ddpipe issues. The one module that imports mpi4py.

A process started without a launcher is a world of one and never loads MPI. Under ``mpiexec``
or ``srun`` (PMI), ranks come from MPI itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# Variables that MPI launchers (MPICH/Hydra, Open MPI, Slurm's PMI/PMIx) set in every rank.
_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def launched_by_mpi(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return any(v in env for v in _LAUNCHER_VARS)


@dataclass(frozen=True)
class World:
    """Who this process is among the job's processes: a plain value that tests build directly."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node: int = 0
    num_nodes: int = 1


class Comm:
    """Collectives over the job's world; with one process they return immediately."""

    def __init__(self, mpi_comm: Any = None) -> None:
        self._comm = mpi_comm
        if mpi_comm is None:
            self.world = World()
        else:
            local = mpi_comm.Split_type(_comm_type_shared(), key=mpi_comm.Get_rank())
            leaders = mpi_comm.allgather(mpi_comm.Get_rank() if local.Get_rank() == 0 else None)
            leader = local.bcast(mpi_comm.Get_rank() if local.Get_rank() == 0 else None, root=0)
            node_leaders = [r for r in leaders if r is not None]
            self.world = World(
                rank=mpi_comm.Get_rank(),
                size=mpi_comm.Get_size(),
                local_rank=local.Get_rank(),
                local_size=local.Get_size(),
                node=node_leaders.index(leader),
                num_nodes=len(node_leaders),
            )
            local.Free()

    def allgather(self, value: T) -> list[T]:
        if self._comm is None:
            return [value]
        result: list[T] = self._comm.allgather(value)
        return result

    def barrier(self) -> None:
        if self._comm is not None:
            self._comm.Barrier()


def _comm_type_shared() -> Any:
    from mpi4py import MPI

    return MPI.COMM_TYPE_SHARED


def init_comm() -> Comm:
    """The job's communicator: MPI's world under a launcher, else a world of one."""
    if not launched_by_mpi():
        return Comm()
    try:
        from mpi4py import MPI
    except ImportError as e:
        from .errors import DdpipeError

        raise DdpipeError("launched under MPI but mpi4py is missing: pip install 'ddpipe[mpi]'") from e
    return Comm(MPI.COMM_WORLD)
