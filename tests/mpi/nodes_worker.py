"""Run under mpiexec, as several emulated nodes, by test_nodes_mpi.py: staged epochs with partial
shuffling into one local directory per node ({node}), then half an epoch whose state a later launch
on another node count resumes.

argv: DATA STAGE_TEMPLATE OUT_JSON PHASE [CAPACITY]   (PHASE "run" or "resume")
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import ddpipe
from ddpipe.comm import init_comm


def keys(batches: list[ddpipe.SampleBatch]) -> list[list[str]]:
    return [[s["__key__"] for s in b] for b in batches]


def main() -> None:
    data, template, out, phase = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    capacity = int(sys.argv[5]) if len(sys.argv) > 5 else None
    comm = init_comm(timeout=120)
    w = comm.world
    state_file = out.with_name("state.pkl")

    def loader() -> ddpipe.EncodedStream:
        return ddpipe.EncodedStream(data, 4, shuffle="partial", exchange_fraction=0.4, round_size=8,
                                    seed=5, stage_dir=template, stage_capacity=capacity, comm=comm)

    mine: dict[str, object] = {"rank": w.rank, "node": w.node, "local_rank": w.local_rank,
                               "node_ranks": comm.node_ranks()}
    if phase == "run":
        ld = loader()
        epochs, cross_node_bytes = [], 0
        node_of = comm.allgather(w.node)
        for epoch in range(2):
            ld.set_epoch(epoch)
            epochs.append(keys(list(ld)))
            assert ld.stats.exchange is not None
            cross_node_bytes += sum(b for rnd in ld.stats.exchange.round_bytes for dest, b in enumerate(rnd)
                                    if node_of[dest] != w.node)
        assert ld.stager is not None
        ld.set_epoch(2)
        half, part = len(ld) // 2, []
        for b, batch in enumerate(ld):
            part.append([s["__key__"] for s in batch])
            if b + 1 == half:
                state = ld.state_dict()
                break
        if w.rank == 0:
            state_file.write_bytes(pickle.dumps(state))
        mine.update(epochs=epochs, part=part, cross_node_bytes=cross_node_bytes, stage_dir=str(ld.stager.dir),
                    copied=ld.stager.stats["copied"], evicted=ld.stager.stats["evicted"],
                    staged=sorted(p.name for p in ld.stager.dir.glob("*.tar")))
    else:
        ld = loader()
        ld.load_state_dict(pickle.loads(state_file.read_bytes()))
        mine.update(rest=keys(list(ld)))
        assert ld.stager is not None
        mine.update({k: ld.stager.stats[k] for k in ("copied", "peer_copied", "peer_bytes")},
                    stage_dir=str(ld.stager.dir))
    everyone = comm.allgather(mine)
    if w.rank == 0:
        out.write_text(json.dumps(everyone))


if __name__ == "__main__":
    main()
