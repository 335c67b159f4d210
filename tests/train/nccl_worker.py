"""Run by test_gpu.py under torchrun: the loader's communicator first, then DDP on the GPU, an epoch."""

from __future__ import annotations

import sys

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ddpipe
import ddpipe.distributed
from ddpipe.decode import DecodeOptions
from ddpipe.train.loop import Trainer, TrainOptions
from ddpipe.train.models import SmallCNN


def main() -> None:
    job = ddpipe.distributed.init("cuda", timeout=60)  # ddpipe's communicator first, then torch's group
    loader = ddpipe.Loader(sys.argv[1], 16, decoder="dali-gpu", device="cuda", shuffle="partial", drop_last=True,
                           comm=job.comm, decode=DecodeOptions(size=32, resize_shorter=36, dtype="float16"))
    trainer = Trainer(SmallCNN(6), loader, job, TrainOptions(epochs=1, amp=True), log=lambda line: None)
    if job.size == 1:  # DDP wraps only for several ranks; on one GPU make the group and wrap here to see its backend
        ddpipe.distributed.init_process_group(job)
        trainer.trained.trained = DistributedDataParallel(trainer.model, device_ids=[0])
    trainer.fit()
    print(f"backend {'nccl' if 'nccl' in str(dist.get_backend()) else dist.get_backend()}, steps {trainer.step}",
          flush=True)
    ddpipe.distributed.shutdown(job)


if __name__ == "__main__":
    main()
