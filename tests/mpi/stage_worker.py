"""Run under mpiexec by test_staging_mpi.py: two staged epochs with partial shuffling; rank 0 reports."""

from __future__ import annotations

import json
import sys

import ddpipe
from ddpipe.comm import init_comm


def main() -> None:
    comm = init_comm(timeout=60)
    data, stage, out = sys.argv[1], sys.argv[2], sys.argv[3]
    capacity = int(sys.argv[4]) if len(sys.argv) > 4 else None
    loader = ddpipe.EncodedStream(data, 4, shuffle="partial", exchange_fraction=0.3, round_size=8,
                           stage_dir=stage, stage_capacity=capacity, source_limits="50MB/s,2ms", comm=comm)
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        epochs.append([s["__key__"] for batch in loader for s in batch])
    assert loader.stager is not None
    report = comm.allgather({"rank": comm.world.rank, "local_rank": comm.world.local_rank,
                             "copied": loader.stager.stats["copied"], "epochs": epochs})
    if comm.world.rank == 0:
        with open(out, "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    main()
