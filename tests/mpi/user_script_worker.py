"""A user's training script, run by test_user_script_faults.py under mpiexec.

argv: DATA OUT MODE [RANK]. ``raise``: rank RANK raises after its first batch, the others train on
(and wait for it in the next collective). ``wait``: every rank writes its pid and its decoder's
worker pids, then trains on until interrupted; ``wait-reading``: the same, DALI decoding what a
reading process of each rank reads (``read_in="process"``)."""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

import ddpipe
import ddpipe.distributed
from ddpipe.formats.atomic import atomic_write_bytes
from ddpipe.train.models import SmallCNN

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests
from tests.helpers import descendants


def main() -> None:
    data, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # a test whose job hangs asks where each thread is
    job = ddpipe.distributed.init("cpu", timeout=300)
    decode = ddpipe.DecodeOptions(decoder="pil" if mode == "wait" else "dali-cpu", size=32, resize_shorter=32,
                                  dtype="uint8", threads=2, read_in="process" if mode == "wait-reading" else "thread")
    loader = ddpipe.Loader(data, 4, decode=decode, shuffle="partial", drop_last=True, comm=job.comm)
    model = ddpipe.distributed.wrap(SmallCNN(3), job)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(10_000):
        loader.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            model.zero_grad()
            model.backward(torch.nn.functional.cross_entropy(model(ddpipe.normalize(x)), y))
            optimizer.step()
            if mode == "raise" and job.rank == int(sys.argv[4]) and step == 1:
                (out / "raised_at").write_text(str(time.time()))
                raise RuntimeError(f"a bad thing on rank {job.rank}")
            if mode.startswith("wait") and epoch == 0 and step == 0:
                # whole or not at all: the test reads it as soon as it exists (it once read it empty)
                pids = [os.getpid(), *descendants(os.getpid())]
                atomic_write_bytes(out / f"pids.{job.rank}", json.dumps(pids).encode())


if __name__ == "__main__":
    main()
