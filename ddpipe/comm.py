"""The process world and the collectives ddpipe issues. The one module that imports mpi4py.

A process started without a launcher is a world of one and never loads MPI. Under ``mpiexec`` or
``srun`` ranks come from MPI itself. Under ``torchrun`` (which starts no MPI) the world comes from
its environment and ddpipe's collectives go through ``torch.distributed`` (gloo).

No collective waits forever, and none burns a core while waiting. Small collectives, where ranks
wait for each other to arrive, are posted non-blocking and polled with short sleeps (a blocking
MPI call spins, taking the core from the peer it waits for). Bulk transfers, which start once every
rank has arrived, are blocking calls (MPI progresses a transfer only inside MPI calls, so sleeping
between polls would stall it) under a watchdog thread. A rank that dies makes the launcher end the
job; a rank that hangs makes the others, after ``timeout`` seconds, print which collective stalled
and abort the whole job with a non-zero exit.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")

# Variables that MPI launchers (MPICH/Hydra, Open MPI, Slurm's PMI/PMIx) set in every rank.
_MPI_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
DEFAULT_TIMEOUT = float(300)


def launched_by_mpi(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return any(v in env for v in _MPI_VARS)


def launched_by_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env


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
    """Collectives over the job's world. A world of one needs no MPI and returns at once."""

    def __init__(self, world: World | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.world = world or World()
        self.timeout = timeout

    def allgather(self, value: T) -> list[T]:
        return [value]

    def barrier(self) -> None:
        return None

    def alltoallv(self, send: np.ndarray, counts: list[int], what: str = "exchange") -> list[memoryview]:
        """``send`` holds one segment per rank, back to back, ``counts[d]`` bytes for rank ``d``;
        returns the segment each rank sent here: views of a receive buffer that the next call
        reuses, so copy out what must outlive it."""
        if len(counts) != self.world.size or sum(counts) > len(send):
            raise ValueError("one segment per rank, within the send buffer")
        return [send[: counts[0]].data]

    def allreduce_max(self, value: int, what: str = "agreement") -> int:
        return value

    def node_ranks(self) -> list[int]:
        """The global ranks on this process's node (itself included)."""
        w = self.world
        return list(range(w.node * w.local_size, (w.node + 1) * w.local_size))

    def abort(self, message: str) -> None:
        print(f"ddpipe: rank {self.world.rank}: {message}", file=sys.stderr, flush=True)
        raise SystemExit(1)

    def close(self) -> None:
        """Leave the job's collectives cleanly (every rank calls it, at the end)."""


class Watchdog:
    """Calls ``on_timeout(what)`` if a watched call outlives its deadline. One thread per communicator."""

    def __init__(self, timeout: float, on_timeout: Any) -> None:
        self.timeout = timeout
        self._on_timeout = on_timeout
        self._cond = threading.Condition()
        self._what: str | None = None
        self._deadline = 0.0
        threading.Thread(target=self._watch, daemon=True, name="ddpipe-watchdog").start()

    def _watch(self) -> None:
        with self._cond:
            while True:
                if self._what is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left <= 0:
                    self._on_timeout(self._what)
                    self._what = None
                    continue
                self._cond.wait(timeout=left)

    def watch(self, what: str) -> _Watched:
        return _Watched(self, what)

    def _arm(self, what: str) -> None:
        with self._cond:
            self._what, self._deadline = what, time.monotonic() + self.timeout
            self._cond.notify()

    def _disarm(self) -> None:
        with self._cond:
            self._what = None


class _Watched:
    def __init__(self, dog: Watchdog, what: str) -> None:
        self._dog, self._what = dog, what

    def __enter__(self) -> None:
        self._dog._arm(self._what)

    def __exit__(self, *exc: object) -> None:
        self._dog._disarm()


class MPIComm(Comm):
    """Collectives through mpi4py, each under the watchdog's deadline.

    One thread issues ddpipe's collectives at a time (the loader's producer), on a communicator
    of ddpipe's own, so one watchdog deadline at a time suffices.
    """

    def __init__(self, mpi_comm: Any, timeout: float = DEFAULT_TIMEOUT) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = mpi_comm
        rank = mpi_comm.Get_rank()
        local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        is_leader = local.Get_rank() == 0
        leaders = [r for r in mpi_comm.allgather(rank if is_leader else None) if r is not None]
        leader = local.bcast(rank if is_leader else None, root=0)
        world = World(rank=rank, size=mpi_comm.Get_size(), local_rank=local.Get_rank(),
                      local_size=local.Get_size(), node=leaders.index(leader), num_nodes=len(leaders))
        self.node_comm = local
        self._node_ranks = [int(r) for r in local.allgather(rank)]
        super().__init__(world, timeout)
        self._recv = np.empty(0, dtype=np.uint8)  # reused: fresh pages would fault inside every exchange
        self._dog = Watchdog(timeout, lambda what: self.abort(
            f"{what} did not complete within {timeout:.0f} s: another rank died or hung; aborting the job"))

    def abort(self, message: str) -> None:
        print(f"ddpipe: rank {self.world.rank}: {message}", file=sys.stderr, flush=True)
        self._comm.Abort(1)

    def node_ranks(self) -> list[int]:
        return list(self._node_ranks)

    def _arrive(self, request: Any, what: str) -> None:
        """Wait for a small collective, sleeping between polls, until the deadline."""
        deadline = time.monotonic() + self.timeout
        delay = 2e-5
        while not request.Test():
            if time.monotonic() > deadline:
                self.abort(f"{what} did not complete within {self.timeout:.0f} s: another rank died or hung; "
                           "aborting the job")
            time.sleep(delay)
            delay = min(delay * 1.5, 1e-3)

    def barrier(self) -> None:
        self._arrive(self._comm.Ibarrier(), "barrier")

    def allreduce_max(self, value: int, what: str = "agreement") -> int:
        out = np.zeros(1, dtype=np.int64)
        self._arrive(self._comm.Iallreduce(np.array([value], dtype=np.int64), out, op=self._mpi.MAX), what)
        return int(out[0])

    def allgather(self, value: T) -> list[T]:
        payload = pickle.dumps(value)
        parts = self._allgatherv(payload, "allgather")
        return [pickle.loads(p) for p in parts]

    def _allgatherv(self, payload: bytes, what: str) -> list[bytes]:
        size = self.world.size
        sizes = np.zeros(size, dtype=np.int64)
        displs = np.zeros(size, dtype=np.int64)
        self._arrive(self._comm.Iallgather(np.array([len(payload)], dtype=np.int64), sizes), what)
        with self._dog.watch(what):
            displs[1:] = np.cumsum(sizes)[:-1]
            out = np.empty(int(sizes.sum()), dtype=np.uint8)
            send = np.frombuffer(payload, dtype=np.uint8)
            self._comm.Allgatherv(send, [out, (sizes.tolist(), displs.tolist()), self._mpi.BYTE])
        return [out[d : d + s].tobytes() for d, s in zip(displs.tolist(), sizes.tolist(), strict=True)]

    def alltoallv(self, send: np.ndarray, counts: list[int], what: str = "exchange") -> list[memoryview]:
        size = self.world.size
        if len(counts) != size or sum(counts) > len(send):
            raise ValueError("one segment per rank, within the send buffer")
        if max(counts, default=0) >= 2**31:
            raise ValueError("an exchange round moves over 2 GiB between two ranks: lower round_size")
        send_sizes = np.array(counts, dtype=np.int64)
        recv_sizes = np.zeros(size, dtype=np.int64)
        send_displs = np.concatenate([[0], np.cumsum(send_sizes)[:-1]]).tolist()
        sbuf = send[: sum(counts)]
        self._arrive(self._comm.Ialltoall(send_sizes, recv_sizes), what)
        with self._dog.watch(what):
            recv_displs = np.concatenate([[0], np.cumsum(recv_sizes)[:-1]]).tolist()
            if len(self._recv) < recv_sizes.sum():
                self._recv = np.empty(int(recv_sizes.sum() * 1.25), dtype=np.uint8)
            rbuf = self._recv
            self._comm.Alltoallv([sbuf, (send_sizes.tolist(), send_displs), self._mpi.BYTE],
                                 [rbuf, (recv_sizes.tolist(), recv_displs), self._mpi.BYTE])
        view = rbuf.data  # no copy: callers unpack straight from the receive buffer
        return [view[d : d + s] for d, s in zip(recv_displs, recv_sizes.tolist(), strict=True)]


class TorchComm(Comm):
    """Collectives through torch.distributed (gloo), for jobs started by ``torchrun`` without MPI."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        self._dist = dist
        self._owns_group = not dist.is_initialized()
        if self._owns_group:
            # The default group is the training script's: with a GPU its CUDA tensors go over NCCL, so
            # DDP set up after the loader averages over NCCL (gloo-only left DDP on gloo). ddpipe's own
            # collectives use the gloo group of their own below.
            backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
        env = os.environ
        local_size = int(env.get("LOCAL_WORLD_SIZE", "1"))
        world = World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=int(env.get("LOCAL_RANK", "0")),
                      local_size=local_size, node=int(env.get("GROUP_RANK", "0")),
                      num_nodes=max(1, dist.get_world_size() // local_size))
        # ddpipe's own collectives get their own group, so they never interleave with the user's
        self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
        super().__init__(world, timeout)

    def _guard(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except RuntimeError as e:  # gloo raises on its timeout or when a peer is gone
            self.abort(f"{what} failed: {e}; another rank died or hung")

    def allgather(self, value: T) -> list[T]:
        out: list[Any] = [None] * self.world.size
        self._guard("allgather", self._dist.all_gather_object, out, value, self._group)
        return out

    def barrier(self) -> None:
        self._guard("barrier", self._dist.barrier, self._group)

    def allreduce_max(self, value: int, what: str = "agreement") -> int:
        return max(self.allgather(value))

    def close(self) -> None:
        # without this, a rank leaving while gloo still talks to it can be killed with SIGABRT
        self.barrier()
        if self._owns_group:
            self._dist.destroy_process_group()

    def alltoallv(self, send: np.ndarray, counts: list[int], what: str = "exchange") -> list[memoryview]:
        # gloo has no all-to-all of variable sizes: gather every segment (fine at torchrun scales)
        starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
        segments = [send[starts[d] : starts[d + 1]].tobytes() for d in range(self.world.size)]
        everything = self.allgather(segments)
        return [memoryview(everything[src][self.world.rank]) for src in range(self.world.size)]


def init_comm(timeout: float = DEFAULT_TIMEOUT) -> Comm:
    """The job's communicator: MPI under mpiexec/srun, torch.distributed under torchrun, else a world of one."""
    if launched_by_mpi():
        try:
            from mpi4py import MPI
        except ImportError as e:
            from .errors import DdpipeError

            raise DdpipeError("launched under MPI but mpi4py is missing: pip install 'ddpipe[mpi]'") from e
        # a communicator of our own: the training loop may run collectives on COMM_WORLD at the same time
        return MPIComm(MPI.COMM_WORLD.Dup(), timeout)
    if launched_by_torchrun():
        return TorchComm(timeout)
    return Comm()
