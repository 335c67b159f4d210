"""Run on two real hosts by test_heartbeat.py: ranks whose heartbeats (every 50 ms) end at different
moments, as a job's ranks leave.

argv: MODE
  staggered: each rank leaves 0.1 s after the one before it (a job's ranks after its last step),
             through the exit handlers a user's script gets from ``init_comm``;
  outlived:  (two ranks) rank 0 leaves at once; rank 1 waits until its heartbeats give a reason to
             stop waiting for it, and prints it ("reason 1: ...").
"""

from __future__ import annotations

import socket
import sys
import time

from mpi4py import MPI

from ddpipe.comm import init_comm
from ddpipe.comm.heartbeat import Heartbeats

SILENCE = 0.5


def main() -> None:
    mode = sys.argv[1]
    if mode == "staggered":
        comm = init_comm(silence=SILENCE)
        comm.barrier()
        time.sleep(0.1 * comm.world.rank)  # what keeps the ranks apart: leaving, not a wait for speed
        print(f"bye {comm.world.rank}", flush=True)
        return
    world = MPI.COMM_WORLD
    hosts = world.allgather(socket.gethostname())
    beats = Heartbeats(world.Dup(), hosts, silence=SILENCE)
    world.Barrier()
    if world.Get_rank() == 0:
        beats.stop()
        print("bye 0", flush=True)
        return
    deadline = time.monotonic() + 120  # a hang bound, far from the half second of silence
    while (reason := beats.silent()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"reason {world.Get_rank()}: {reason}", flush=True)


if __name__ == "__main__":
    main()
