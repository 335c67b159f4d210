"""A user's script that uses the Loader alone (no ddpipe.distributed.init()), run by
test_user_script_faults.py under mpiexec.

argv: DATA OUT MODE [RANK]. ``raise``: rank RANK raises after its first batch while the others read
on (and wait for it in the next exchange round); ``raise-unhooked``: the same with
``init_comm(abort_on_error=False)`` (under torchrun, which ends the others itself). ``hook``: with
``init_comm(abort_on_error=False)``, print whether the process's exception hook is still Python's own."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import ddpipe


def main() -> None:
    data, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if mode == "hook":
        ddpipe.init_comm(abort_on_error=False)
        print(f"untouched={sys.excepthook is sys.__excepthook__}", flush=True)
        return
    comm = ddpipe.init_comm(abort_on_error=False) if mode == "raise-unhooked" else None
    loader = ddpipe.EncodedStream(data, 2, shuffle="partial", exchange_fraction=0.5, round_size=4,
                           comm=comm)
    for epoch in range(10_000):
        loader.set_epoch(epoch)
        for step, _ in enumerate(loader):
            if loader.comm.world.rank == int(sys.argv[4]) and step == 1:
                (out / "raised_at").write_text(str(time.time()))
                raise RuntimeError(f"a bad thing on rank {loader.comm.world.rank}")


if __name__ == "__main__":
    main()
