"""Whether another job stages the same dataset into the same directory with a capacity.

Jobs may share a staging directory and its copies (each copy is locked while it is made), but not
while either has a capacity: its stager evicts the copies its own readers are done with, which the
other job's readers may still wait for (they were in no plan of its own), and the notes that say a
node's rank is done with a shard are named by epoch and local rank, which the other job's ranks
have too. Two one-process jobs with capacities on one directory, started together: in three runs
of four, one waited for a copy until its timeout, then said its local rank 0 might be dead, and the
other was still running long after its epochs should have ended. So each node's stager holds a
lock on the dataset's directory while it stages: shared without a capacity, exclusive with one; a
job that cannot take it is refused at start.

The lock is a POSIX record lock (``fcntl.lockf``), which belongs to the process, not to one open
file: streams of one process (a script's training and evaluation streams) never refuse each other,
and the lock manager of a network file system sees it from every node. By POSIX's rule it goes when
any of them lets its descriptor go: a script that drops one of two such streams is no longer guarded.
"""

from __future__ import annotations

import fcntl
import os
import weakref
from pathlib import Path

LOCK_NAME = ".ddpipe-jobs.lock"


def hold_directory(owner: object, directory: Path, exclusive: bool) -> str | None:
    """Lock ``directory`` (a dataset's, under a stage directory) for this process for as long as
    ``owner`` lives: exclusively for a job with a capacity. None once held, else why it cannot be."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.lockf(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: another process holds it the other way
        os.close(fd)
        mine = "with a capacity" if exclusive else "without a capacity"
        return (f"another job stages this dataset into {directory.parent} now, and one of the two has a staging "
                f"capacity (this one is {mine}): it would evict the copies the other reads. Give this job a "
                "directory of its own, or give neither a capacity")
    except BaseException:
        os.close(fd)
        raise
    weakref.finalize(owner, os.close, fd)  # the lock goes with the descriptor
    return None
