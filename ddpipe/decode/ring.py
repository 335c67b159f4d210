"""Where decoded batches are written on the CPU: output batches reused once nothing needs them.

For a CPU training device, the caller gets the batch itself, from a small ring of batches each
reused once the caller has let go of it. For a CUDA device, batches decoded on the CPU
(``dali-cpu``, ``pil``, a decode service) are written into page-locked (pinned) memory and copied
to the device without waiting: a copy from pageable memory is staged through a driver buffer and
first waits for the stream to drain, the caller's last training step with it. The caller gets the
device's copy. The pinned batch comes from torch's caching host allocator, which records an
event behind each copy out of it and reuses its memory only once that event has completed: a
batch is never written again while its copy may still be reading it.
"""

from __future__ import annotations

import torch

from ..errors import DdpipeError
from .spec import DecodeOptions

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}
RING_SIZE = 4  # CPU batches kept for reuse: two in flight, one the caller trains on, one spare


def _storage_users(t: torch.Tensor) -> int:
    """How many tensors, views and arrays still hold ``t``'s memory (``t`` itself counts one); a
    large number where torch cannot say, so that nothing is reused unsafely."""
    count = getattr(torch._C, "_storage_Use_Count", None)  # private, but the only exact answer
    if count is None:
        return 1 << 30
    return int(count(t.untyped_storage()._cdata)) - 1  # less the temporary storage wrapper


class BatchRing:
    """Output batches (N x 3 x size x size, the options' dtype and layout) bound for ``device``.

    On the CPU: a fresh 150 MB float32 batch costs ~38,000 page faults to fill, ~40 ms on one core
    per 256 images, so batches come from a ring, each reused only once nothing else refers to it;
    a shorter batch (an epoch's last) is the front of a released larger one. For a CUDA device,
    pinned batches from torch's caching host allocator, which reuses them (see the module)."""

    def __init__(self, options: DecodeOptions, device: torch.device | None = None) -> None:
        self.options = options
        self.device = device if device is not None else torch.device("cpu")
        self.pinned = self.device.type == "cuda"
        self._ring: list[torch.Tensor] = []
        self.mean = (torch.tensor(options.mean, dtype=torch.float32) * 255).view(3, 1, 1)
        self.inv_std = (1.0 / (255.0 * torch.tensor(options.std, dtype=torch.float32))).view(3, 1, 1)

    def clear(self) -> None:
        self._ring.clear()

    def _new(self, n: int) -> torch.Tensor:
        s, dtype = self.options.size, TORCH_DTYPES[self.options.dtype]
        # not a permuted view: a view also holds its base, and the ring saw a channels-last batch in use forever
        layout = torch.channels_last if self.options.channels_last else torch.contiguous_format
        try:
            return torch.empty((n, 3, s, s), dtype=dtype, memory_format=layout, pin_memory=self.pinned)
        except RuntimeError as e:  # how torch's allocators say it (OutOfMemoryError is one too)
            if not isinstance(e, torch.OutOfMemoryError) and "allocate" not in str(e):
                raise
            size = n * 3 * s * s * torch.empty((), dtype=dtype).element_size()
            where = "pinned memory" if self.pinned else "this machine's memory"
            raise DdpipeError(f"a batch of {n} images of {s} x {s} pixels ({size / 1e9:,.1f} GB of "
                              f"{self.options.dtype}) does not fit in {where}: use a smaller batch or image "
                              "size") from None

    def take(self, n: int) -> torch.Tensor:
        """A batch of ``n`` to fill, then to give the caller through :meth:`handed_out`."""
        if self.pinned:
            return self._new(n)
        for t in self._ring:
            if t.shape[0] >= n and _storage_users(t) == 1:
                return t[:n]
        t = self._new(n)
        if len(self._ring) >= RING_SIZE:  # the consumer holds on to more than a few: stop caching
            self._ring.pop(0)
        self._ring.append(t)
        return t

    def handed_out(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` (from :meth:`take`, filled) as the caller gets it. On the CPU: a second tensor on the
        same memory (``detach``), so that the ring sees when the caller lets go. On a CUDA device: a
        copy there, made on the current stream without waiting."""
        if not self.pinned:
            return out.detach()
        return out.to(self.device, non_blocking=True)

    def labels_out(self, labels: torch.Tensor) -> torch.Tensor:
        """A batch's labels (int64, on the CPU) as the caller gets them: on a CUDA device, copied from
        pinned memory too (a copy from pageable memory would wait for the stream all the same)."""
        if not self.pinned:
            return labels
        return labels.pin_memory().to(self.device, non_blocking=True)

    def fill(self, out: torch.Tensor, images: torch.Tensor) -> None:
        """``out`` (from :meth:`take`) = uint8 NCHW ``images``, normalised unless the output is uint8."""
        if self.options.dtype == "uint8":
            out.copy_(images)
        elif self.options.dtype == "float32":
            torch.sub(images, self.mean, out=out)
            out.mul_(self.inv_std)
        else:  # float16: normalised in float32, rounded once
            out.copy_((images - self.mean).mul_(self.inv_std))
