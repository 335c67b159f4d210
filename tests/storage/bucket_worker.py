"""A user's script reading a dataset from a bucket under mpiexec (tests/storage): each rank writes
the keys it was given, one per line, to OUT/rank-R.txt.

argv: URL OUT"""

from __future__ import annotations

import sys
from pathlib import Path

import ddpipe


def main() -> None:
    url, out = sys.argv[1], Path(sys.argv[2])
    loader = ddpipe.EncodedStream(url, 2, shuffle="partial", exchange_fraction=0.5, round_size=4)
    keys = [s["__key__"] for batch in loader for s in batch]
    (out / f"rank-{loader.comm.world.rank}.txt").write_text("\n".join(keys) + "\n")


if __name__ == "__main__":
    main()
