"""Run under mpiexec by tests/mpi/test_loader_mpi.py: iterate loaders, report what each rank yielded.

argv: DATA_DIR OUT_JSON PHASE  (PHASE "run": full epochs and save mid-epoch states; "resume": load them)
"""

from __future__ import annotations

import functools
import json
import pickle
import sys
from pathlib import Path

import ddpipe
from ddpipe.comm import init_comm
from ddpipe.sample import KEY, Sample, owned

MODES = ["none", "local", "partial", "global"]
FORMATS = ["wds", "hdf5", "lmdb"]


def keys(batches: list[ddpipe.SampleBatch]) -> list[list[str]]:
    return [[s["__key__"] for s in b] for b in batches]


def wrong_bytes(loader: ddpipe.EncodedStream, stored: dict[str, Sample]) -> list[str]:
    """The keys of samples yielded with bytes other than their shard's, or with a field that is not a
    ``bytes`` of its own (a view of a receive buffer, which a decoder of the user's own, ``json.loads``
    say, cannot take), over two epochs, each batch dropped once checked (as training does: then
    received samples' memory is reused round after round)."""
    wrong = []
    for epoch in (3, 4):
        loader.set_epoch(epoch)
        for batch in loader:
            wrong += [s["__key__"] for s in batch
                      if s != stored[s["__key__"]] or not all(type(v) is bytes for k, v in s.items() if k != KEY)]
    return wrong


def main() -> None:
    data, out, phase = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    comm = init_comm(timeout=120)
    rank = comm.world.rank
    report: dict[str, object] = {"world": comm.world.size}
    stored = {fmt: {s["__key__"]: owned(s) for s in ddpipe.open_dataset(data / fmt)} for fmt in FORMATS}
    for fmt in FORMATS:
        for mode in MODES:
            for drop_last in (False, True):
                name = f"{fmt}-{mode}-{int(drop_last)}"

                loader = functools.partial(ddpipe.EncodedStream, data / fmt, batch_size=5, shuffle=mode,
                                           exchange_fraction=0.4, seed=11, drop_last=drop_last, buffer_size=16,
                                           round_size=9, comm=comm)

                state_file = data / f"state-{name}.pkl"
                if phase == "run":
                    ld = loader()
                    ld.set_epoch(3)
                    first = keys(list(ld))
                    again = keys(list(ld))
                    ld.set_epoch(4)
                    other = keys(list(ld))
                    # mid-epoch: take the state after half the batches, as a checkpoint would
                    ld.set_epoch(3)
                    half = len(ld) // 2
                    part = []
                    for b, batch in enumerate(ld):
                        part.append([s["__key__"] for s in batch])
                        if b + 1 == half:
                            state = ld.state_dict()
                            break
                    if rank == 0:
                        state_file.write_bytes(pickle.dumps(state))
                    comm.barrier()
                    fresh = loader()
                    fresh.load_state_dict(pickle.loads(state_file.read_bytes()))
                    rest = keys(list(fresh))
                    mine = {"first": first, "again": again, "other": other, "len": len(first), "part": part,
                            "rest": rest, "wrong_bytes": wrong_bytes(loader(), stored[fmt])}
                else:
                    fresh = loader()
                    fresh.load_state_dict(pickle.loads(state_file.read_bytes()))
                    mine = {"rest": keys(list(fresh)), "len": len(fresh)}
                everyone = comm.allgather(mine)
                if rank == 0:
                    report[name] = everyone
    if rank == 0:
        out.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
