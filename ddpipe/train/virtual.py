"""Data-parallel SGD for W ranks, carried out exactly in one process.

What a real job of W ranks computes in one step, with PyTorch DDP and unsynchronised batch norm:

- rank ``r`` takes the next batch of the stream its ``Loader`` yields: the epoch plan's
  ``ranks[r].order`` (:func:`virtual_batches` reads the same :func:`ddpipe.plan_epoch`, exchange
  included, that the real loader carries out);
- its forward pass normalises with the statistics of its own local batch;
- the gradients are averaged over the ranks, and every rank takes the same optimizer step;
- batch norm's running statistics are rank 0's (DDP broadcasts rank 0's buffers before each forward).

With every rank's batch the same size, the average of the ranks' mean losses is the mean loss over
their concatenated batches, so one forward and backward over the W local batches stacked gives the
averaged gradient, provided batch norm keeps each rank's statistics apart: :func:`per_rank_batch_norm`
swaps a model's batch-norm layers for :class:`PerRankBatchNorm`, which does. A step then costs what
one process training on the global batch costs, which is what lets one machine study thousands of
ranks (``benchmarks/shuffle_accuracy.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from ..errors import OptionError
from ..manifest import Manifest
from ..plan import PlanOptions, plan_epoch


def virtual_batches(manifest: Manifest, world_size: int, seed: int, epoch: int,
                    options: PlanOptions) -> Iterator[np.ndarray]:
    """Each step's batches, as a ``(world_size, batch)`` array of global sample indices: row ``r`` is
    the batch rank ``r``'s ``Loader`` yields at that step, for this seed, epoch and options."""
    if not options.pad and not options.drop_last:  # its batches may be short: no (world_size, batch) array
        raise OptionError("virtual ranks train on batches of equal size: pad=False (evaluation) leaves some short")
    plan = plan_epoch(manifest, world_size, seed, epoch, options)
    order = np.stack([rank.order for rank in plan.ranks])
    size = options.batch_size
    for step in range(plan.num_batches):
        yield order[:, step * size : (step + 1) * size]


class PerRankBatchNorm(nn.Module):
    """A batch-norm layer of a virtual job: its input is the W ranks' local batches stacked, rank
    after rank; in training each rank's slice is normalised with its own statistics, and the running
    statistics follow rank 0's slice alone. It shares the wrapped layer's parameters and buffers."""

    def __init__(self, layer: nn.modules.batchnorm._BatchNorm, world_size: int) -> None:
        super().__init__()
        self.layer = layer
        self.world_size = world_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bn = self.layer
        if not self.training and bn.track_running_stats:
            return bn(x)  # evaluation: the running statistics, as in the real job
        ranks, channels = self.world_size, x.shape[1]
        if x.shape[0] % ranks:
            raise ValueError(f"a batch of {x.shape[0]} does not split into {ranks} equal local batches")
        grouped = x.reshape(ranks, x.shape[0] // ranks, channels, -1)  # (rank, sample, channel, position)
        mean = grouped.mean(dim=(1, 3), keepdim=True)
        var = grouped.var(dim=(1, 3), unbiased=False, keepdim=True)
        out = (grouped - mean) * torch.rsqrt(var + bn.eps)
        if bn.affine:
            out = out * bn.weight.view(1, 1, channels, 1) + bn.bias.view(1, 1, channels, 1)
        if self.training and bn.track_running_stats:
            self._track(mean[0].flatten(), var[0].flatten(), grouped.shape[1] * grouped.shape[3])
        return out.reshape(x.shape)

    @torch.no_grad()
    def _track(self, mean: torch.Tensor, var: torch.Tensor, count: int) -> None:
        """Rank 0's running statistics, updated as ``nn.BatchNorm`` updates them (unbiased variance)."""
        bn = self.layer
        assert bn.running_mean is not None and bn.running_var is not None and bn.num_batches_tracked is not None
        bn.num_batches_tracked.add_(1)
        momentum = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
        unbiased = var * count / max(count - 1, 1)
        bn.running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
        bn.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)


def per_rank_batch_norm(model: nn.Module, world_size: int) -> nn.Module:
    """``model`` with every batch-norm layer swapped, in place, for a :class:`PerRankBatchNorm` of
    ``world_size`` ranks (its parameters and state dict keys gain a ``.layer``)."""
    for name, child in model.named_children():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            setattr(model, name, PerRankBatchNorm(child, world_size))
        else:
            per_rank_batch_norm(child, world_size)
    return model


def virtual_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
                 labels: torch.Tensor) -> torch.Tensor:
    """One data-parallel step of every virtual rank: ``images`` and ``labels`` hold the ranks' local
    batches stacked, rank after rank, and ``model`` went through :func:`per_rank_batch_norm`. Returns
    the mean of the ranks' losses."""
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(images), labels)  # = the mean of equal-sized ranks' means
    loss.backward()
    optimizer.step()
    return loss.detach()
