"""Run under mpiexec by test_faults_mpi.py: rank 1 dies or hangs after its first batch, mid-exchange.

argv: DATA_DIR FAULT ("kill" or "hang") TIMEOUT_S
"""

from __future__ import annotations

import os
import signal
import sys
import time

import ddpipe
from ddpipe.comm import init_comm


def main() -> None:
    data, fault, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    comm = init_comm(timeout=timeout)
    loader = ddpipe.EncodedStream(data, batch_size=4, shuffle="partial", exchange_fraction=0.5, round_size=6,
                           buffer_size=4, prefetch=4, comm=comm)
    for b, _ in enumerate(loader):
        if comm.world.rank == 1 and b == 0:
            if fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)  # hang: stop taking part in the exchange
    print(f"rank {comm.world.rank} finished", flush=True)


if __name__ == "__main__":
    main()
