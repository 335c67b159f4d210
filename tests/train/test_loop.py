"""The training loop: learning-rate schedule, and resumption from a mid-epoch checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ddpipe
import ddpipe.distributed
from ddpipe.decode import DecodeOptions
from ddpipe.train.loop import Trainer, TrainOptions, scaled_lr
from ddpipe.train.models import SmallCNN

from ..decode.images import labelled_samples


def test_linear_scaling_and_warmup() -> None:
    opt = TrainOptions(lr=0.1, reference_batch=256, warmup_epochs=5)
    assert scaled_lr(opt, 1024, 10.0) == pytest.approx(0.4)  # 4x the batch, 4x the rate (Goyal et al.)
    assert scaled_lr(opt, 1024, 0.0) == pytest.approx(0.04)  # warm-up starts at a tenth
    assert scaled_lr(opt, 1024, 2.5) == pytest.approx(0.22)
    assert scaled_lr(TrainOptions(lr=0.1), 512, 0.0) == pytest.approx(0.2)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("train") / "wds"
    ddpipe.write_dataset(root, iter(labelled_samples(48, np.random.default_rng(4))), samples_per_shard=16,
                         classes=[str(c) for c in range(6)])
    return root


def loader(data: Path) -> ddpipe.Loader:
    return ddpipe.Loader(data, 8, decoder="dali-cpu", device="cpu", shuffle="local", drop_last=True,
                         decode=DecodeOptions(size=32, resize_shorter=36, dtype="uint8", threads=1))


def trainer(data: Path, checkpoint: Path | str, **kw: object) -> Trainer:
    torch.manual_seed(0)
    return Trainer(SmallCNN(6), loader(data), ddpipe.distributed.init("cpu", comm=ddpipe.comm.Comm()),
                   TrainOptions(epochs=2, lr=0.05, checkpoint=checkpoint, **kw),  # type: ignore[arg-type]
                   log=lambda line: None)


def test_resume_from_a_mid_epoch_checkpoint(data: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    first = trainer(data, ckpt, checkpoint_every=1, max_steps=3)
    logs = first.fit()
    assert first.step == 3 and first.epoch == 0 and logs[0].images == 24
    saved = {k: v.clone() for k, v in first.model.state_dict().items()}
    resumed = trainer(data, str(ckpt))  # a fresh process would do this (a str: AttributeError 'exists' before)
    assert resumed.step == 3 and resumed.epoch == 0
    assert all(torch.equal(resumed.model.state_dict()[k], v) for k, v in saved.items())
    assert len(resumed.loader) == 3  # 48 samples in batches of 8: 6, of which 3 were done
    logs = resumed.fit()
    assert [log.images for log in logs] == [24, 48]  # the rest of epoch 0, then a whole epoch 1
    assert resumed.step == 12 and resumed.epoch == 2
    assert logs[-1].loss_sum / logs[-1].images < logs[0].loss_sum / logs[0].images  # it learns


def test_channels_last_training_on_cpu(data: Path, tmp_path: Path) -> None:
    t = trainer(data, tmp_path / "c.pt", channels_last=True, max_steps=2)
    t.fit()
    assert t.step == 2
    conv = next(m for m in t.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_warm_up_continues_where_a_resumed_epoch_stopped(data: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    trainer(data, ckpt, warmup_epochs=2, checkpoint_every=1, max_steps=3).fit()
    resumed = trainer(data, ckpt, warmup_epochs=2, max_steps=4)  # one step more: the 4th of epoch 0's 6
    resumed.fit()
    opt = resumed.opt
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(scaled_lr(opt, 8, 3 / 6))  # 3 of 6 done


@pytest.mark.parametrize("bad", [{"lr": -1.0}, {"lr": 0.0}, {"lr": float("nan")}, {"lr": float("inf")},
                                 {"warmup_epochs": -1.0}, {"momentum": 1.0}, {"weight_decay": float("nan")},
                                 {"epochs": 0}, {"reference_batch": 0}, {"allreduce": "nccl"}, {"max_steps": -1}])
def test_training_options_a_step_cannot_use_are_refused_when_made(bad: dict[str, Any]) -> None:
    """A negative learning rate reached torch's SGD (a traceback from ddpipe train --lr -1); NaN trained
    on NaN without a word."""
    with pytest.raises(ddpipe.OptionError, match=next(iter(bad))):
        TrainOptions(**bad)
