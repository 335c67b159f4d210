"""Reading another process's memory directly (Linux cross-memory attach, ``process_vm_readv``): how a
rank takes the samples a node peer sends it straight from the buffers the peer read them into.

One copy, by the kernel, done by the receiver alone: the sender packs nothing and need not be
scheduled while it happens. The same mechanism MPI libraries use for large messages within a node
(MPICH, Open MPI's ``vader``), called here without MPI's rendezvous, since the exchange's header
already tells the receiver where the bytes lie.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from typing import Any

import numpy as np

from ..errors import DdpipeError

_IOV_MAX = 1024  # iovecs per call (Linux's UIO_MAXIOV)
_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


def _syscalls() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # ctypes releases the GIL for the call
        read = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    read.restype = ctypes.c_ssize_t
    return libc


def allow_node_peers() -> None:
    """Let the node's other processes read this one's memory where Yama restricts it to ancestors
    (``ptrace_scope`` 1, the default on Ubuntu), as Open MPI does for the same purpose; the kernel
    still requires the same user."""
    libc = _syscalls()
    if libc is not None:
        libc.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)


def parts_table(parts: list[Any]) -> np.ndarray:
    """Where ``parts`` (buffers) lie in this process, as ``struct iovec`` entries: (address, length) pairs."""
    table = np.empty((len(parts), 2), dtype=np.int64)
    for i, part in enumerate(parts):
        a = np.frombuffer(part, dtype=np.uint8)
        table[i] = a.ctypes.data, a.size
    return table


def read_parts(pid: int, table: np.ndarray, into: np.ndarray) -> None:
    """Copy the buffers of process ``pid`` that ``table`` lists (see :func:`parts_table`), back to
    back, into ``into``."""
    libc = _syscalls()
    if libc is None:
        raise DdpipeError("cross-memory reads need Linux")
    at = into.ctypes.data
    local = np.empty(2, dtype=np.int64)
    for start in range(0, len(table), _IOV_MAX):
        chunk = np.ascontiguousarray(table[start : start + _IOV_MAX])
        want = int(chunk[:, 1].sum())
        local[:] = at, want
        got = libc.process_vm_readv(pid, local.ctypes.data, 1, chunk.ctypes.data, len(chunk), 0)
        if got != want:
            code = ctypes.get_errno()
            raise DdpipeError(f"reading {want} bytes from node peer process {pid} failed "
                              f"({errno.errorcode.get(code, code) if got < 0 else f'{got} bytes read'})")
        at += want


def neighbour_readable(node_comm: Any) -> bool:
    """Whether this rank can read its node neighbour's memory: each rank reads a value the next one
    holds. Collective over ``node_comm``; the caller agrees on the answer with the others."""
    allow_node_peers()
    mine = np.array([node_comm.Get_rank() + 1], dtype=np.int64)
    where = node_comm.allgather((os.getpid(), parts_table([mine])))
    neighbour = (node_comm.Get_rank() + 1) % node_comm.Get_size()
    got = np.zeros(1, dtype=np.int64)
    try:
        read_parts(where[neighbour][0], where[neighbour][1], got.view(np.uint8))
    except DdpipeError:
        return False
    finally:
        node_comm.Barrier()  # ``mine`` outlives every read of it
    return bool(got[0] == neighbour + 1)
