"""Run under mpiexec by tests/test_plan_command.py: what every rank's Loader yields in epoch 0 of
each shuffle, as global indices (keys are 's/<index>').

argv: DATA_DIR OUT_JSON BATCH Q...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ddpipe
from ddpipe.comm import init_comm


def main() -> None:
    data, out, batch = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    fractions = [float(q) for q in sys.argv[4:]]
    comm = init_comm(timeout=120)
    report = {}
    for shuffle, q in [("local", 0.0), *(("partial", q) for q in fractions), ("global", 0.0)]:
        options = ddpipe.PlanOptions(shuffle=shuffle, exchange_fraction=q, batch_size=batch, buffer_size=16,
                                     round_size=24)
        loader = ddpipe.EncodedStream(data, plan=options, seed=5, comm=comm)
        stream = [int(s["__key__"].split("/")[1]) for b in loader for s in b]
        report[f"{shuffle} {q:g}"] = comm.allgather(stream)
    if comm.world.rank == 0:
        out.write_text(json.dumps(report))
    comm.close()


if __name__ == "__main__":
    main()
