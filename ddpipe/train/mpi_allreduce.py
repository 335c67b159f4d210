"""Data-parallel gradient averaging over MPI, in the manner of Horovod.

Gradients are grouped into buckets of about ``bucket_bytes`` (a fusion buffer), in the reverse order
of the parameters (roughly the order backward produces them). On the CPU each gradient is a view into
its bucket's buffer (as DDP's ``gradient_as_bucket_view``), so backward accumulates straight into the
buffer and nothing is packed or copied back: packing and unpacking cost 0.5 of a raw Allreduce of
ResNet-50's gradients (benchmarks/allreduce.py). A hook on each parameter notes when its gradient is
ready; when a bucket is complete its ``Iallreduce`` is posted at once, so communication overlaps the
rest of the backward pass. :meth:`synchronize` waits for every bucket before the optimizer step. The
loss is multiplied by :attr:`loss_scale` (1 / world size) before backward, as Horovod's prescaling
does, so the sum over ranks is already the average: no division pass over the gradients.
:meth:`zero_grad` zeroes the buffers in place (setting gradients to None would detach the views).
:meth:`broadcast_parameters` makes every rank start from rank 0's weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..comm import GradientChannel

# Horovod's fusion threshold: fewer, larger collectives than DDP's 25 MB buckets (on ResNet-50's
# gradients here: 1.22 -> 1.11 of a raw Allreduce), still several buckets to overlap backward
DEFAULT_BUCKET_BYTES = 64 << 20


class MPIGradientAverager:
    """``channel``: a communicator of its own (``comm.gradient_channel()``), since the loader
    exchanges samples on another, in another thread, at the same time."""

    def __init__(self, model: nn.Module, channel: GradientChannel, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self.channel = channel
        self.size = channel.size
        self.loss_scale = 1.0 / self.size  # backward on loss * loss_scale: the allreduced sum is the average
        self.model = model
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets: list[list[nn.Parameter]] = []
        current: list[nn.Parameter] = []
        nbytes = 0
        for p in reversed(params):
            current.append(p)
            nbytes += p.numel() * p.element_size()
            if nbytes >= bucket_bytes:
                self.buckets.append(current)
                current, nbytes = [], 0
        if current:
            self.buckets.append(current)
        self._bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self._flat = [torch.zeros(sum(p.numel() for p in bucket), dtype=torch.float32) for bucket in self.buckets]
        self._buffers = [f.numpy() for f in self._flat]  # the same memory, as MPI buffers
        self._views = all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params)
        self.zero_grad()
        self._ready = [0] * len(self.buckets)
        self._requests: list[Any] = [None] * len(self.buckets)
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    def _on_grad(self, param: torch.Tensor) -> None:
        b = self._bucket_of[id(param)]
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            self._post(b)

    def zero_grad(self) -> None:
        """Zero every gradient, keeping CPU gradients as views into the fusion buffers."""
        for b, bucket in enumerate(self.buckets):
            self._flat[b].zero_()
            at = 0
            for p in bucket:
                n = p.numel()
                if self._views:
                    p.grad = self._flat[b][at : at + n].view_as(p)
                elif p.grad is not None:
                    p.grad.zero_()
                at += n

    def _is_view(self, b: int) -> bool:
        flat = self._flat[b]
        lo, hi = flat.data_ptr(), flat.data_ptr() + flat.numel() * 4
        return self._views and all(p.grad is not None and lo <= p.grad.data_ptr() < hi for p in self.buckets[b])

    def _post(self, b: int) -> None:
        buf = self._buffers[b]
        if not self._is_view(b):  # GPU gradients, or views lost: pack into the fusion buffer
            at = 0
            for p in self.buckets[b]:
                n = p.numel()
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                buf[at : at + n] = grad.detach().reshape(-1).float().cpu().numpy()
                at += n
        self._requests[b] = self.channel.iallreduce_sum(buf)

    def synchronize(self) -> None:
        """Wait for every bucket (posting any whose gradients never arrived) and write the averages back
        where gradients are not views. Gradients must come from ``loss * loss_scale``."""
        for b in range(len(self.buckets)):
            if self._requests[b] is None:
                self._post(b)
        for b, bucket in enumerate(self.buckets):
            self._requests[b].Wait()
            self._requests[b] = None
            self._ready[b] = 0
            if self._is_view(b):
                continue  # the gradients are the buffer: nothing to copy back
            buf = self._buffers[b]
            at = 0
            for p in bucket:
                n = p.numel()
                avg = torch.from_numpy(buf[at : at + n]).view_as(p).to(device=p.device, dtype=p.dtype)
                if p.grad is None:
                    p.grad = avg.clone()
                else:
                    p.grad.copy_(avg)
                at += n

    def broadcast_parameters(self) -> None:
        """Every rank takes rank 0's parameters and buffers (batch-norm statistics included)."""
        with torch.no_grad():
            for t in list(self.model.parameters()) + list(self.model.buffers()):
                host = t.detach().cpu().numpy().copy()
                self.channel.broadcast(host)
                t.copy_(torch.from_numpy(host))

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self.channel.free()
