"""Run under mpiexec by test_loader_mpi.py: break out of partial-shuffle epochs at many batches.

Every rank breaks at the same batch (as a checkpointing job does); each time, the loader must stop
without a hang and a fresh loader must continue with exactly the rest.
"""

from __future__ import annotations

import sys
import time

import ddpipe
from ddpipe import stream
from ddpipe.comm import init_comm
from ddpipe.reading import read_samples


def slow_read(dataset, indices, **kw):  # type: ignore[no-untyped-def]
    """Storage slower than the exchange, so that a rank stops while its exchanger waits on reading."""
    for sample in read_samples(dataset, indices, **kw):
        time.sleep(0.002)
        yield sample


setattr(stream, "read_samples", slow_read)  # noqa: B010 (what the stream reads with; not an export)


def main() -> None:
    comm = init_comm(timeout=30)  # a deadlock aborts the job within 30 s, failing the test
    root = sys.argv[1]
    total = len(ddpipe.open_dataset(root))
    for trial in range(12):
        loader = ddpipe.EncodedStream(root, 3, shuffle="partial", exchange_fraction=0.5, round_size=4,
                               buffer_size=4, prefetch=2, seed=trial, comm=comm)
        stop_at = trial % 3  # early, while rounds are still being read and exchanged
        seen = []
        for b, batch in enumerate(loader):
            seen += [s["__key__"] for s in batch]
            if b == stop_at:
                state = loader.state_dict()
                break
        fresh = ddpipe.EncodedStream(root, 3, shuffle="partial", exchange_fraction=0.5, round_size=4,
                              buffer_size=4, prefetch=2, seed=trial, comm=comm)
        fresh.load_state_dict(state)
        seen += [s["__key__"] for batch in fresh for s in batch]
        everything = [k for keys in comm.allgather(seen) for k in keys]
        if len(set(everything)) != total:
            raise SystemExit(f"trial {trial}: {len(set(everything))} distinct samples of {total}")
    if comm.world.rank == 0:
        print("all trials ok", flush=True)


if __name__ == "__main__":
    main()
