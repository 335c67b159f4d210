"""One data-parallel training step, the same for both ways of averaging gradients."""

from __future__ import annotations

import torch
from torch import nn

from .mpi_allreduce import MPIGradientAverager


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor,
               averager: MPIGradientAverager | None = None, scaler: torch.amp.GradScaler | None = None,
               amp_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Forward, backward (gradients averaged across ranks by DDP or ``averager``), optimizer step.
    Returns the loss on this rank's batch, detached."""
    if averager is not None:
        averager.zero_grad()  # in place: its gradients are views into the fusion buffers
    else:
        optimizer.zero_grad(set_to_none=True)
    with torch.autocast(images.device.type, dtype=amp_dtype or torch.float16, enabled=amp_dtype is not None):
        loss = nn.functional.cross_entropy(model(images), labels)
    # prescaled by 1 / world size for the MPI path, so that its allreduced sum is the average
    scaled = loss * averager.loss_scale if averager is not None else loss
    if scaler is not None:
        scaler.scale(scaled).backward()
    else:
        scaled.backward()
    if averager is not None:
        averager.synchronize()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return loss.detach()
