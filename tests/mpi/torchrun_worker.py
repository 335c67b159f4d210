"""Run by test_launchers.py under torchrun: one epoch with the exchange, keys written per rank.
With a third argument ``loader-only``, as a script that only makes a Loader: no communicator of its
own, never closed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ddpipe
from ddpipe.comm import init_comm


def main() -> None:
    loader_only = sys.argv[3:] == ["loader-only"]
    comm = None if loader_only else init_comm(timeout=60)
    loader = ddpipe.EncodedStream(sys.argv[1], batch_size=4, shuffle="partial", exchange_fraction=0.5,
                           round_size=8, comm=comm)
    comm = loader.comm
    keys = [s["__key__"] for batch in loader for s in batch]
    out = Path(sys.argv[2]) / f"rank{comm.world.rank}.json"
    exchange = loader.stats.exchange
    out.write_text(json.dumps({"world": [comm.world.rank, comm.world.size, comm.world.local_rank],
                               "keys": keys, "sent": exchange.samples_sent if exchange is not None else 0}))
    if not loader_only:
        comm.close()


if __name__ == "__main__":
    main()
