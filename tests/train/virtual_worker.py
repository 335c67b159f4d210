"""One rank of a real data-parallel job that tests/train/test_virtual.py repeats with virtual ranks:
the Loader with partial exchange, PyTorch DDP over gloo, batch norm unsynchronised."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

import ddpipe
import ddpipe.distributed

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.train.test_virtual import EPOCHS, PLAN, SEED, batch_tensors, make_model, make_optimizer


def main(data: str, out: str) -> None:
    torch.set_num_threads(1)
    job = ddpipe.distributed.init(device="cpu")
    torch.manual_seed(SEED)
    model = make_model()
    wrapped = ddpipe.distributed.wrap(model, job, "ddp")
    optimizer = make_optimizer(model)
    loader = ddpipe.EncodedStream(data, plan=PLAN, seed=SEED, comm=job.comm)
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        for batch in loader:
            images, labels = batch_tensors(
                np.stack([np.frombuffer(s["bin"], dtype=np.float32) for s in batch]),
                np.array([int(s["cls"]) for s in batch]))
            ddpipe.train.train_step(wrapped, optimizer, images, labels)
    if job.rank == 0:
        torch.save(model.state_dict(), out)
    ddpipe.distributed.shutdown(job)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
