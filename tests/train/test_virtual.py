"""The virtual-rank trainer computes what a real job of as many ranks computes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import ddpipe
from ddpipe.train.virtual import PerRankBatchNorm, per_rank_batch_norm, virtual_batches, virtual_step

from ..conftest import mpiexec

SEED = 3
EPOCHS = 2
RANKS = 4
# small rounds and buffer so that the exchange and the shuffle buffer act within these few samples
PLAN = ddpipe.PlanOptions(shuffle="partial", exchange_fraction=0.5, batch_size=4, round_size=8, buffer_size=6)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.Flatten(),
                         nn.Linear(6 * 16, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, 5))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, weight_decay=1e-3)


def batch_tensors(images: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(np.ascontiguousarray(images)).view(-1, 3, 4, 4), torch.from_numpy(labels).long()


def class_sorted(n: int, classes: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    labels = np.arange(n) * classes // n
    images = (rng.normal(size=(n, 48)) + labels[:, None] * 0.3).astype(np.float32)
    return images, labels


@pytest.mark.mpi
def test_virtual_ranks_reach_the_weights_of_a_real_job(tmp_path: Path) -> None:
    images, labels = class_sorted(104, 5, np.random.default_rng(0))  # 26 per rank: a partial last batch
    samples = ({"__key__": f"s/{i:04d}", "cls": b"%d" % labels[i], "bin": images[i].tobytes()}
               for i in range(len(labels)))
    ddpipe.write_dataset(tmp_path / "d", samples, samples_per_shard=10, classes=[str(c) for c in range(5)])
    proc = mpiexec(RANKS, Path(__file__).with_name("virtual_worker.py"), tmp_path / "d", tmp_path / "real.pt",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    real = torch.load(tmp_path / "real.pt")

    torch.manual_seed(SEED)
    model = per_rank_batch_norm(make_model(), RANKS)
    optimizer = make_optimizer(model)
    manifest = ddpipe.open_dataset(tmp_path / "d").manifest
    for epoch in range(EPOCHS):
        for step in virtual_batches(manifest, RANKS, SEED, epoch, PLAN):
            virtual_step(model, optimizer, *batch_tensors(images[step.reshape(-1)], labels[step.reshape(-1)]))
    virtual = {k.replace(".layer.", "."): v for k, v in model.state_dict().items()}
    assert virtual.keys() == real.keys()
    for name, value in real.items():
        torch.testing.assert_close(virtual[name], value, rtol=1e-4, atol=1e-5, msg=name)
    # the statistics of rank 0 alone: a job whose ranks all normalised together would differ
    assert not torch.allclose(real["1.running_mean"], torch.zeros(6))


def test_each_rank_is_normalised_by_its_own_batch() -> None:
    """Rank r's outputs are what a BatchNorm layer of its own gives its batch alone; the running
    statistics are those a layer that saw only rank 0's batches would keep."""
    torch.manual_seed(0)
    per_rank = PerRankBatchNorm(nn.BatchNorm2d(3), world_size=3)
    alone = nn.BatchNorm2d(3)
    batches = [torch.randn(4, 3, 5, 5) * (r + 1) + r for r in range(3)]
    for _ in range(2):
        out = per_rank(torch.cat(batches))
        for r, batch in enumerate(batches):
            torch.testing.assert_close(out[4 * r : 4 * (r + 1)], nn.BatchNorm2d(3)(batch))
        alone(batches[0])
    torch.testing.assert_close(per_rank.layer.running_mean, alone.running_mean)
    torch.testing.assert_close(per_rank.layer.running_var, alone.running_var)
    per_rank.eval()
    alone.eval()
    torch.testing.assert_close(per_rank(batches[1]), alone(batches[1]))


def test_virtual_batches_are_the_plans_streams() -> None:
    manifest = ddpipe.Manifest("wds", ("cls",), (), tuple(ddpipe.ShardInfo(f"s{i}", 7, 0, "") for i in range(6)))
    steps = list(virtual_batches(manifest, 4, 1, 0, PLAN))
    plan = ddpipe.plan_epoch(manifest, 4, 1, 0, PLAN)
    assert len(steps) == plan.num_batches
    for r in range(4):
        assert np.array_equal(np.concatenate([s[r] for s in steps]), plan.ranks[r].order)
    # batches without padding may be short: no array of equal rows to give, said before any step
    with pytest.raises(ddpipe.OptionError, match="pad=False"):
        next(virtual_batches(manifest, 5, 1, 0, dataclasses.replace(PLAN, pad=False)))
