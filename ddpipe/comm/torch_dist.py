"""Collectives through torch.distributed, for jobs started by ``torchrun`` without MPI.

ddpipe's collectives run on a gloo process group of its own, made from torchrun's rendezvous store
under a prefix of its own. torch's *default* process group belongs to the training script: ddpipe
neither creates nor uses it, so the script makes it with the backend it wants (NCCL on GPUs),
before or after the loader exists.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import pickle
import sys
import time
import weakref
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import numpy as np

from .base import DEFAULT_TIMEOUT, Comm, Segment, WhileWaiting, pack_parts, segment_lengths, split_views
from .world import World, available_cores

T = TypeVar("T")
LEAVE_TIMEOUT = 60.0  # seconds a rank waits at exit for the others to leave too (as for torch's own group)


class TorchComm(Comm):
    _store: Any  # torchrun's rendezvous store, in which each group is named
    _group: Any

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, environ: Mapping[str, str] | None = None, *,
                 parent: TorchComm | None = None) -> None:
        import torch
        from torch.distributed.rendezvous import rendezvous

        self._torch = torch
        if parent is not None:  # a channel: a gloo group of its own over the parent's world
            self._share(parent)
            self._store = parent._store
            self._group = self._new_group()
            self._closed = False
            atexit.register(_leave_at_exit, weakref.ref(self))
            return
        env = os.environ if environ is None else environ
        self._store, rank, size = next(rendezvous("env://", timeout=timedelta(seconds=timeout)))
        local_size = int(env.get("LOCAL_WORLD_SIZE", "1"))
        node = int(env.get("GROUP_RANK", "0"))
        super().__init__(World(rank=rank, size=size, local_rank=int(env.get("LOCAL_RANK", "0")),
                               local_size=local_size, node=node, num_nodes=max(1, size // local_size)),
                         timeout)
        self._group = self._new_group()
        mine = {c for n_, c in self.allgather((node, available_cores())) if n_ == node}
        self.world = dataclasses.replace(self.world, cores=max(mine))
        self._closed = False
        # a script that never calls close() (one that only makes a Loader) leaves together all the same
        atexit.register(_leave_at_exit, weakref.ref(self))

    def _new_group(self) -> Any:
        """A gloo group of the world's ranks. Every rank makes its groups in the same order, so the n-th
        one here is the n-th one everywhere: a per-rank counter in the store names it the same on every
        rank."""
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import PrefixStore

        rank, size = self.world.rank, self.world.size
        n = self._store.add(f"ddpipe/comms/{rank}", 1)
        return dist.ProcessGroupGloo(PrefixStore(f"ddpipe/{n}/", self._store), rank, size,
                                     timedelta(seconds=self.timeout))

    def channel(self) -> TorchComm:
        return self if self.world.size == 1 else TorchComm(parent=self)

    def _wait(self, what: str, work: Any, while_waiting: WhileWaiting | None = None) -> None:
        try:
            while while_waiting is not None and not work.is_completed() and while_waiting():
                pass
            work.wait()
        except RuntimeError as e:  # gloo raises on its timeout or when a peer is gone
            self.abort(f"{what} failed: {e}; another rank died or hung")

    def _allgather_bytes(self, payload: bytes, what: str) -> list[bytes]:
        torch, size = self._torch, self.world.size
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
        self._wait(what, self._group.allgather([sizes], [torch.tensor([len(payload)], dtype=torch.int64)]))
        lengths = [int(s) for s in sizes]
        longest = max(lengths)
        mine = torch.zeros(longest, dtype=torch.uint8)
        mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else mine[:0]
        out = [torch.empty(longest, dtype=torch.uint8) for _ in range(size)]
        self._wait(what, self._group.allgather([out], [mine]))
        return [o[:n].numpy().tobytes() for o, n in zip(out, lengths, strict=True)]

    def allgather(self, value: T) -> list[T]:
        return [pickle.loads(p) for p in self._allgather_bytes(pickle.dumps(value), "allgather")]

    def barrier(self) -> None:
        self._wait("barrier", self._group.barrier())

    def alltoallv(self, segments: Sequence[Segment], what: str = "exchange", wanted: bool = True,
                  hold: int = 2, while_waiting: WhileWaiting | None = None) -> list[memoryview] | None:
        """One all-to-all of variable sizes: each byte crosses the wire once (``hold``, ``while_waiting``:
        see Comm)."""
        torch, size = self._torch, self.world.size
        lengths = segment_lengths(segments, size)
        header = torch.tensor([[int(n), int(wanted)] for n in lengths], dtype=torch.int64)  # see Comm.alltoallv
        got = torch.zeros(size, 2, dtype=torch.int64)
        self._wait(what, self._group.alltoall_base(got, header, [], [], _alltoall_options()), while_waiting)
        if not bool(got[:, 1].any()):
            return None
        incoming = got[:, 0].tolist()
        t0 = time.perf_counter()
        send = self._send_buffer(int(lengths.sum()))
        starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        for d in range(size):
            pack_parts(segments[d], send[starts[d] : starts[d + 1]])
        recv = np.empty(sum(incoming), dtype=np.uint8)
        rbuf = torch.from_numpy(recv)
        sbuf = torch.from_numpy(send[: starts[-1]])
        self._wait(what, self._group.alltoall_base(rbuf, sbuf, incoming, lengths.tolist(), _alltoall_options()))
        self.transfer_seconds += time.perf_counter() - t0
        return split_views(recv.data, incoming)

    def close(self) -> None:
        # without this, a rank leaving while gloo still talks to it can be killed with SIGABRT ("terminate
        # called without an active exception": 2 of 4 ranks of benchmarks/exchange.py's torchrun worker,
        # which did not call it, once in a few runs); once, whether called or run at exit
        if not self._closed:
            self._closed = True
            self.barrier()

    def _leave(self, timeout: float) -> None:
        """At exit: leave with the others, waiting ``timeout`` seconds at most (none: not at all) and
        saying nothing if they do not come (a rank still at work, or gone), then tear the group down."""
        if not self._closed and timeout > 0:
            self._closed = True
            with contextlib.suppress(RuntimeError):
                self._group.barrier().wait(timedelta(seconds=timeout))
        self._group = None


def _leave_at_exit(comm: weakref.ref[TorchComm]) -> None:
    alive = comm()
    if alive is None:
        return
    # after an uncaught exception (with the job-ending hook turned off) the others may be inside a
    # collective of their own: waiting for them would only hold back torchrun's noticing this exit
    failed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    alive._leave(0 if failed is not None else LEAVE_TIMEOUT)


def _alltoall_options() -> Any:
    import torch.distributed as dist

    return dist.AllToAllOptions()
