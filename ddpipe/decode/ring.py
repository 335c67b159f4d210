"""Where decoded batches are written on the CPU: a small ring of output batches, each reused only
once nothing needs it any more.

For a CPU training device, the caller gets the ring's batch itself, and a batch is reused once the
caller has let go of it. For a CUDA device, batches are decoded on the CPU (``dali-cpu``, ``pil``, a
decode service) into page-locked (pinned) memory and copied to the device without waiting: a copy
from pageable memory is staged through a driver buffer and holds the calling thread until the
source is read. The caller gets the device's copy; a pinned batch is reused once the event
recorded after its copy has completed, so a batch is never overwritten while its copy may still
be reading it.
"""

from __future__ import annotations

import torch

from .spec import DecodeOptions

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}
RING_SIZE = 4  # batches: two in flight, one the caller trains on, one spare


def _storage_users(t: torch.Tensor) -> int:
    """How many tensors, views and arrays still hold ``t``'s memory (``t`` itself counts one); a
    large number where torch cannot say, so that nothing is reused unsafely."""
    count = getattr(torch._C, "_storage_Use_Count", None)  # private, but the only exact answer
    if count is None:
        return 1 << 30
    return int(count(t.untyped_storage()._cdata)) - 1  # less the temporary storage wrapper


class BatchRing:
    """Output batches (N x 3 x size x size, the options' dtype and layout) for ``device``. A fresh
    150 MB float32 batch costs ~38,000 page faults to fill, ~40 ms on one core per 256 images; a
    pinned one costs more still (the driver locks every page). A shorter batch (an epoch's last) is
    the front of a released larger one rather than a batch of its own."""

    def __init__(self, options: DecodeOptions, device: torch.device | None = None) -> None:
        self.options = options
        self.device = device if device is not None else torch.device("cpu")
        self.pinned = self.device.type == "cuda"
        self._ring: list[torch.Tensor] = []
        self._copied: list[torch.cuda.Event | None] = []  # per batch: the event after its last copy out
        self.mean = (torch.tensor(options.mean, dtype=torch.float32) * 255).view(3, 1, 1)
        self.inv_std = (1.0 / (255.0 * torch.tensor(options.std, dtype=torch.float32))).view(3, 1, 1)

    def clear(self) -> None:
        for event in self._copied:  # pinned memory goes back only once no copy reads it
            if event is not None:
                event.synchronize()
        self._ring.clear()
        self._copied.clear()

    def _free(self, i: int) -> bool:
        event = self._copied[i]
        return _storage_users(self._ring[i]) == 1 and (event is None or event.query())  # type: ignore[no-untyped-call]

    def take(self, n: int) -> torch.Tensor:
        """A batch of ``n`` to fill, then to hand out with :meth:`handed_out`."""
        for i, t in enumerate(self._ring):
            if t.shape[0] >= n and self._free(i):
                return t[:n]
        if self.pinned and len(self._ring) >= RING_SIZE:
            # every pinned batch is being copied: wait for the oldest copy rather than lock more memory
            for i, t in enumerate(self._ring):
                event = self._copied[i]
                if t.shape[0] >= n and event is not None and _storage_users(t) == 1:
                    event.synchronize()
                    return t[:n]
        s, dtype = self.options.size, TORCH_DTYPES[self.options.dtype]
        # not a permuted view: a view also holds its base, and the ring saw a channels-last batch in use forever
        layout = torch.channels_last if self.options.channels_last else torch.contiguous_format
        t = torch.empty((n, 3, s, s), dtype=dtype, memory_format=layout, pin_memory=self.pinned)
        if len(self._ring) >= RING_SIZE:  # the consumer holds on to more than a few: stop caching
            self._drop_oldest()
        self._ring.append(t)
        self._copied.append(None)
        return t

    def _drop_oldest(self) -> None:
        event = self._copied.pop(0)
        if event is not None:
            event.synchronize()
        self._ring.pop(0)

    def handed_out(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` (from :meth:`take`, filled) as the caller gets it. On the CPU: a second tensor on the
        same memory (``detach``), so that the ring sees when the caller lets go. On a CUDA device: a
        copy there, made on the current stream without waiting for it; ``out`` is reused after it."""
        if not self.pinned:
            return out.detach()
        moved = out.to(self.device, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()  # on the current stream, after the copy
        for i, t in enumerate(self._ring):
            if t.data_ptr() == out.data_ptr():
                self._copied[i] = event
        return moved

    def fill(self, out: torch.Tensor, images: torch.Tensor) -> None:
        """``out`` (from :meth:`take`) = uint8 NCHW ``images``, normalised unless the output is uint8."""
        if self.options.dtype == "uint8":
            out.copy_(images)
        elif self.options.dtype == "float32":
            torch.sub(images, self.mean, out=out)
            out.mul_(self.inv_std)
        else:  # float16: normalised in float32, rounded once
            out.copy_((images - self.mean).mul_(self.inv_std))
