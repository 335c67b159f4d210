"""Run under mpiexec as 2 nodes by test_nodes_mpi.py: both ranks serve files and fetch the other's
at the same time, round after round (as two node leaders staging for each other do).

argv: DIR  (DIR/r<rank>-<k>.bin: the files rank <rank> serves as items k)"""

from __future__ import annotations

import sys
from pathlib import Path

from ddpipe.comm import init_comm


def main() -> None:
    root = Path(sys.argv[1])
    comm = init_comm(timeout=60)
    link = comm.peer_link()
    assert link is not None
    me, other = comm.world.rank, 1 - comm.world.rank
    mine = sorted(root.glob(f"r{me}-*.bin"))
    link.serve(lambda item: str(mine[item]) if 0 <= item < len(mine) else None)
    theirs = sorted(root.glob(f"r{other}-*.bin"))
    wrong = 0
    for _ in range(20):
        for k, path in enumerate(theirs):
            comm.barrier()  # both ask at once
            got = bytearray()
            ok = link.fetch(other, k, got.extend, timeout=30)
            wrong += not ok or bytes(got) != path.read_bytes()
    comm.barrier()
    print(f"rank {me}: {wrong} wrong", flush=True)
    link.close()


if __name__ == "__main__":
    main()
