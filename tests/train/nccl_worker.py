"""Run by test_gpu.py under torchrun: the loader's communicator first, then DDP on the GPU, an epoch."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import ddpipe
from ddpipe.comm import init_comm
from ddpipe.decode import DecodeOptions
from ddpipe.train.loop import Trainer, TrainOptions
from ddpipe.train.models import SmallCNN


def main() -> None:
    comm = init_comm(timeout=60)
    loader = ddpipe.Loader(sys.argv[1], 16, decode="dali-gpu", device="cuda", shuffle="partial", drop_last=True,
                           comm=comm, decode_options=DecodeOptions(size=32, resize_shorter=36, dtype="float16"))
    trainer = Trainer(SmallCNN(6), loader, comm, TrainOptions(epochs=1, amp=True), log=lambda line: None)
    if comm.world.size == 1:  # DDP wraps only for several ranks; on one GPU wrap it here to see its backend
        from ddpipe.train.ddp import wrap_ddp

        trainer.trained = wrap_ddp(trainer.model, comm, torch.device("cuda", 0), 25 * 2**20)
    trainer.fit()
    backend = dist.get_backend()
    print(f"backend {'nccl' if 'nccl' in str(backend) else backend}, steps {trainer.step}", flush=True)
    comm.close()


if __name__ == "__main__":
    main()
