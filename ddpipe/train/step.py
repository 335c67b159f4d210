"""One data-parallel training step, the same whichever way gradients are averaged."""

from __future__ import annotations

import torch
from torch import nn

from .distributed import DataParallel


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor,
               scaler: torch.amp.GradScaler | None = None, amp_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Forward, backward (gradients averaged across ranks when ``model`` is a :class:`DataParallel`),
    optimizer step. Returns the loss on this rank's batch, detached."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(images.device.type, dtype=amp_dtype or torch.float16, enabled=amp_dtype is not None):
        loss = nn.functional.cross_entropy(model(images), labels)
    if isinstance(model, DataParallel):
        model.backward(loss, scaler)
    else:
        (scaler.scale(loss) if scaler is not None else loss).backward()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return loss.detach()
