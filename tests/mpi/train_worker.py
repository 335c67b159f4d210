"""Run under mpiexec by test_train_mpi.py: a few data-parallel steps on a fixed global batch.

argv: PATH ("mpi" or "ddp") OUT.  Rank r trains on its slice of each global batch; rank 0 saves
the final weights, which must equal one process training on the whole batches.
"""

from __future__ import annotations

import sys

import torch

import ddpipe.distributed
from ddpipe.train.models import SmallCNN
from ddpipe.train.step import train_step

GLOBAL_BATCH, STEPS = 16, 4


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(GLOBAL_BATCH, 3, 16, 16, generator=g), torch.randint(0, 5, (GLOBAL_BATCH,), generator=g))
            for _ in range(STEPS)]


def main() -> None:
    path, out = sys.argv[1], sys.argv[2]
    job = ddpipe.distributed.init("cpu", timeout=60)
    rank, world = job.rank, job.size
    torch.manual_seed(100 + rank)  # different on every rank: the start from rank 0 must be enforced
    model = SmallCNN(5, batch_norm=False)
    trained = ddpipe.distributed.wrap(model, job, path, bucket_bytes=4096)  # several buckets, even for a small model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    per = GLOBAL_BATCH // world
    for x, y in batches():
        train_step(trained, opt, x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per])
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out)


if __name__ == "__main__":
    main()
