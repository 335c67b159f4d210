"""The GPU training paths: AMP with channels-last fed by GPU decoding, and DDP over NCCL under torchrun.

Skipped without CUDA (CI has no GPU); run on a GPU machine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import ddpipe
import ddpipe.distributed
from ddpipe.comm import Comm
from ddpipe.decode import DecodeOptions
from ddpipe.train.loop import Trainer, TrainOptions
from ddpipe.train.models import SmallCNN

from ..conftest import torchrun
from ..decode.images import labelled_samples

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (CI has none; run on the device machine)")
WORKER = Path(__file__).with_name("nccl_worker.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gputrain") / "wds"
    ddpipe.write_dataset(root, iter(labelled_samples(96, np.random.default_rng(4))), samples_per_shard=32,
                         classes=[str(c) for c in range(6)])
    return root


@pytest.mark.parametrize("dtype", ["float16", "uint8"])
def test_amp_channels_last_training_on_gpu_decoded_batches_learns(data: Path, dtype: str) -> None:
    torch.manual_seed(0)
    loader = ddpipe.Loader(data, 16, decoder="dali-gpu", device="cuda", shuffle="local", drop_last=True,
                           decode=DecodeOptions(size=32, resize_shorter=36, dtype=dtype, channels_last=True))
    job = ddpipe.distributed.init("cuda", comm=Comm())
    trainer = Trainer(SmallCNN(6), loader, job, TrainOptions(epochs=6, lr=0.05, amp=True, channels_last=True),
                      log=lambda line: None)
    assert trainer.scaler is not None and trainer.amp_dtype == torch.float16
    logs = trainer.fit()
    assert [log.images for log in logs] == [96] * 6
    losses = [log.loss_sum / log.images for log in logs]
    assert losses[-1] < 0.5 * losses[0], losses  # solid colours: it must learn them
    for p in trainer.model.parameters():  # master weights stay float32, finite, on the GPU
        assert p.dtype == torch.float32 and p.device.type == "cuda" and bool(torch.isfinite(p).all())
    conv = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_ddp_under_torchrun_averages_over_nccl(data: Path, tmp_path: Path) -> None:
    """The loader's communicator is made first, then DDP: the gradients must still go over NCCL."""
    proc = torchrun(1, WORKER, data, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "backend nccl" in proc.stdout and "steps 6" in proc.stdout, proc.stdout
