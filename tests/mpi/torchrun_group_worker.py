"""Run by test_launchers.py under torchrun: ddpipe's loader beside the script's own default process
group, made before the loader (``before``) or only after a whole epoch (``after``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import ddpipe
from ddpipe.comm import init_comm


def main() -> None:
    data, out, when = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if when == "before":
        dist.init_process_group("gloo")
    comm = init_comm(timeout=60)
    loader = ddpipe.EncodedStream(data, 4, shuffle="partial", exchange_fraction=0.5, round_size=8, comm=comm)
    keys = [s["__key__"] for batch in loader for s in batch]
    untouched = not dist.is_initialized()  # an epoch with exchange, and still no default group
    if when == "after":
        dist.init_process_group("gloo")
    total = torch.tensor([comm.world.rank + 1.0])
    dist.all_reduce(total)  # the script's own collective, on its own group
    loader.set_epoch(1)
    again = [s["__key__"] for batch in loader for s in batch]  # ddpipe's, with the default group present
    (out / f"rank{comm.world.rank}.json").write_text(json.dumps({
        "keys": keys, "again": again, "untouched": untouched, "backend": str(dist.get_backend()),
        "total": total.item(), "world": dist.get_world_size()}))
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
