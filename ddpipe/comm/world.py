"""Who this process is among the job's processes: a plain value, and the launcher that started it.

The launcher's environment is read here, at the edge, and nowhere deeper."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# Variables that MPI launchers (MPICH/Hydra, Open MPI, Slurm's PMI/PMIx) set in every rank.
_MPI_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def launched_by_mpi(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return any(v in env for v in _MPI_VARS)


def launched_by_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env


def launched_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank as the launcher that :func:`ddpipe.init_comm` follows named it (MPI's:
    Hydra's, Slurm's PMI or PMIx, Open MPI's; else torchrun's), without starting MPI; None where no
    launcher did, or named it in no variable read here."""
    env = os.environ if environ is None else environ
    names = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK") if launched_by_mpi(env) \
        else ("RANK",) if launched_by_torchrun(env) else ()
    for name in names:
        if env.get(name, "").isdigit():
            return int(env[name])
    return None


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity: what taskset, cgroups or the batch
    system left it), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class World:
    """Who this process is among the job's processes: a plain value that tests build directly.

    ``cores``: the cores this process may use on its node, which the node's ranks share; ``host``:
    the node's host name (:func:`ddpipe.init_comm` reads it; empty where nobody did)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node: int = 0
    num_nodes: int = 1
    cores: int = 1
    host: str = ""

    @property
    def cores_per_rank(self) -> int:
        return max(1, self.cores // self.local_size)
