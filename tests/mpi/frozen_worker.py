"""Run on two real hosts by test_frozen_host.py: a Loader with partial shuffling, epoch after epoch.

argv: DATA MODE
  freeze: say "ready RANK PID HOST" after the first batch, then read epochs until the job ends (the
          test freezes one host, and the other's ranks must end the job naming it);
  slow:   host mnode2 reads from a source that takes 70 s to open a shard, so the other host's ranks
          wait that long in the first exchange round; the epoch must still finish ("done N").
"""

from __future__ import annotations

import os
import socket
import sys

import ddpipe
from ddpipe.comm import init_comm


def main() -> None:
    data, mode = sys.argv[1], sys.argv[2]
    comm = init_comm()  # the default timeout and silence: what a user gets
    host = socket.gethostname()
    slow = mode == "slow" and host == "mnode2"
    loader = ddpipe.EncodedStream(data, 4, shuffle="partial", exchange_fraction=0.5, round_size=8, seed=1,
                           comm=comm, source_limits="70s" if slow else None)
    if mode == "slow":
        seen = sum(len(batch) for batch in loader)
        print(f"done {sum(comm.allgather(seen))}", flush=True)
        return
    for epoch in range(10_000):
        loader.set_epoch(epoch)
        for b, _ in enumerate(loader):
            if epoch == 0 and b == 0:
                print(f"ready {comm.world.rank} {os.getpid()} {host}", flush=True)


if __name__ == "__main__":
    main()
