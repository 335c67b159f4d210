"""A training loop's shape: every step ends in a collective on the caller's communicator, so no rank
takes its next batch before every rank has taken this one.

    python lockstep_worker.py DATA BATCH_SIZE BUFFER_SIZE      (under mpiexec)

Prints, per rank and epoch, how many samples it took, with the loader's other options at their
defaults and every sample exchanged."""

from __future__ import annotations

import sys

import ddpipe


def main() -> None:
    path, batch_size, buffer_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    comm = ddpipe.init_comm(timeout=60)
    stream = ddpipe.EncodedStream(path, batch_size, shuffle="partial", exchange_fraction=1.0,
                                  buffer_size=buffer_size, comm=comm)
    for epoch in range(2):
        stream.set_epoch(epoch)
        taken = 0
        for step, batch in enumerate(stream, 1):
            taken += len(batch.samples)
            comm.allgather(step)  # what the gradients' allreduce does
        print(f"rank {comm.world.rank} epoch {epoch}: {taken}", flush=True)
    comm.close()


if __name__ == "__main__":
    main()
