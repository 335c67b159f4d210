"""Collectives beside a loader's: the caller's own on the communicator it gave the loader (a training
loop's progress line), and a second loader's exchange, while the first exchanges in its thread.

    python beside_worker.py DATA_A DATA_B      (under mpiexec or torchrun)

Prints, per rank and epoch, how many samples each stream gave and whether every sample arrived whole
in its own stream (no mixed-up or truncated exchange)."""

from __future__ import annotations

import sys

import ddpipe


def main() -> None:
    a_path, b_path = sys.argv[1:3]
    comm = ddpipe.init_comm(timeout=60)
    # several rounds an epoch (512 samples a rank each), the caller's collectives among them
    a = ddpipe.EncodedStream(a_path, 16, shuffle="partial", exchange_fraction=0.5, comm=comm)
    b = ddpipe.EncodedStream(b_path, 16, shuffle="partial", exchange_fraction=0.5, comm=comm)
    for epoch in range(3):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        got_a = got_b = 0
        whole = True
        for steps, (batch_a, batch_b) in enumerate(zip(a, b, strict=True), 1):
            got_a += len(batch_a.samples)
            got_b += len(batch_b.samples)
            whole &= all(len(s["bin"]) == 64 for s in batch_a.samples)
            whole &= all(len(s["bin"]) == 96 for s in batch_b.samples)
            progress = comm.allgather(("progress", steps))  # what ddpipe train's log line does
            whole &= progress == [("progress", steps)] * comm.world.size
        print(f"rank {comm.world.rank} epoch {epoch}: {got_a} {got_b} whole {whole}", flush=True)
    comm.close()


if __name__ == "__main__":
    main()
