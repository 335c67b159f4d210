"""Run under mpiexec by tests/mpi/test_service_mpi.py: each rank's batches decoded here, then
through the given decode servers; reports whether they are the same, batch by batch.

argv: DATA_DIR OUT_JSON ENDPOINT[,ENDPOINT...] [ENDPOINT...]  (each argument after OUT_JSON: one set of servers)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import ddpipe
from ddpipe.comm import init_comm

FORMATS = ["wds", "hdf5", "lmdb"]


def batches(root: Path, comm: ddpipe.comm.Comm, service: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    decode = ddpipe.DecodeOptions(decoder="dali-cpu", device="cpu", size=24, resize_shorter=28, dtype="uint8",
                                  threads=1, service=tuple(service))
    loader = ddpipe.Loader(root, 3, decode=decode, shuffle="partial", exchange_fraction=0.5, seed=9, comm=comm)
    loader.set_epoch(1)
    out = [(x.clone(), y.clone()) for x, y in loader]
    loader.close()
    return out


def main() -> None:
    data, out, sets = Path(sys.argv[1]), Path(sys.argv[2]), [a.split(",") for a in sys.argv[3:]]
    comm = init_comm(timeout=120)
    report: dict[str, object] = {}
    for fmt in FORMATS:
        local = batches(data / fmt, comm, [])
        for service in sets:
            served = batches(data / fmt, comm, service)
            report[f"{fmt}-{len(service)}"] = {
                "batches": len(local),
                "same": len(local) == len(served) and all(torch.equal(a, c) and torch.equal(b, d)
                                                          for (a, b), (c, d) in zip(local, served, strict=True)),
                "labels": [int(v) for _, y in local for v in y],
            }
    everyone = comm.allgather(report)
    if comm.world.rank == 0:
        out.write_text(json.dumps(everyone))


if __name__ == "__main__":
    main()
