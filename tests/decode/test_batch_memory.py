"""The memory batches are decoded into: never written again while the caller holds a batch or a copy
to the device reads it, shared memory without room, one clear error for a batch too big, and the
PIL workers through a signal to the process group."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from ddpipe.decode import DecodeOptions
from ddpipe.errors import DdpipeError

from ..helpers import alive, descendants
from .images import (
    COLORS,
    DECODERS,
    loader,
    needs_cuda,
)


@pytest.mark.parametrize("decode", DECODERS)
@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_batches_the_caller_holds_are_never_written_again(natural: Path, decode: str, dtype: str) -> None:
    ld = loader(natural, decode, dtype=dtype)
    held = [x for x, _ in ld]  # every batch kept: the decoder's reused buffers must not be among them
    ld.set_epoch(0)  # the same epoch again, on purpose: the same batches
    copied = [x.clone() for x, _ in ld]
    assert len({x.data_ptr() for x in held}) == len(held)
    assert all(torch.equal(x, y) for x, y in zip(held, copied, strict=True))


def test_pil_without_room_in_shared_memory_pickles_images_back(labelled: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpipe.decode.pil import PilPool

    monkeypatch.setattr(PilPool, "_rows_bytes", lambda self: 1 << 60)  # more than any /dev/shm holds
    seen = 0
    for images, labels in loader(labelled, "pil"):
        means = images.float().mean(dim=(2, 3))
        assert torch.equal(torch.cdist(means, torch.tensor(COLORS, dtype=torch.float32)).argmin(dim=1), labels)
        seen += len(labels)
    assert seen == 40


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_to_the_process_group_leaves_the_pil_workers_decoding(labelled: Path, sig: int) -> None:
    """A terminal's Ctrl-C, or a launcher's, reaches a rank's decoding workers too, and only the rank
    may decide what it means: workers that took it as their own died mid-batch or mid-reply, and under
    mpiexec, under load, some runs had left the rank waiting for ever on a batch no worker would send.
    So does a scheduler's stop (Slurm signals every process of a job step), which the rank answers
    after its step (ddpipe.distributed.stop_on_signals): workers it had killed broke the rank's pool."""
    before = set(descendants(os.getpid()))
    batches = iter(loader(labelled, "pil"))
    seen = len(next(batches)[1])
    workers = [pid for pid in set(descendants(os.getpid())) - before if "spawn_main" in _cmdline(pid)]
    assert workers  # this loader's pool
    for pid in workers:
        os.kill(pid, sig)
    for images, labels in batches:
        means = images.float().mean(dim=(2, 3))
        assert torch.equal(torch.cdist(means, torch.tensor(COLORS, dtype=torch.float32)).argmin(dim=1), labels)
        seen += len(labels)
    assert seen == 40
    assert all(map(alive, workers))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_shorter_batch_is_written_into_a_released_full_ones_memory(channels_last: bool) -> None:
    from ddpipe.decode.ring import BatchRing

    ring = BatchRing(DecodeOptions(size=8, channels_last=channels_last))
    full = ring.take(16).detach()
    where = full.data_ptr()
    held = ring.take(16).detach()  # the first is still held: a second batch of its own
    assert held.data_ptr() != where
    del full
    last = ring.take(5).detach()  # an epoch's shorter last batch: the front of the released one
    assert last.data_ptr() == where and last.shape[0] == 5
    assert last.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert ring.take(16).data_ptr() not in (where, held.data_ptr())  # both still held: fresh memory


def test_a_batch_that_does_not_fit_in_memory_is_one_clear_error() -> None:
    """Torch's own was a RuntimeError naming its allocator's source file, a traceback from ddpipe train;
    with PIL it came from a worker. 194 TB of float32 is more than a 47-bit address space, even where
    the kernel would promise any amount (vm.overcommit_memory=1)."""
    from ddpipe.decode.ring import BatchRing

    ring = BatchRing(DecodeOptions(size=9000, resize_shorter=9000, dtype="float32"))
    with pytest.raises(DdpipeError, match=r"^a batch of 200000 images of 9000 x 9000 pixels \(194,400.0 GB of "
                                          r"float32\) does not fit in this machine's memory: use a smaller batch or "
                                          r"image size$"):
        ring.take(200_000)


@needs_cuda
def test_a_pinned_batch_is_not_written_again_while_its_copy_to_the_device_may_read_it() -> None:
    from ddpipe.decode.ring import BatchRing

    ring = BatchRing(DecodeOptions(size=8, dtype="uint8"), torch.device("cuda"))
    first = ring.take(16)
    assert first.is_pinned()
    first.fill_(7)
    where = first.data_ptr()
    torch.cuda._sleep(1_000_000_000)  # type: ignore[no-untyped-call]  # the stream is busy for a while: the copy after it is pending
    on_device = ring.handed_out(first)
    del first  # let go while its copy is pending
    pending = ring.take(16)
    assert pending.data_ptr() != where  # its copy may still be reading it
    torch.cuda.synchronize()
    assert bool((on_device == 7).all())
    cached = {where, pending.data_ptr()}
    del pending
    assert ring.take(16).data_ptr() in cached  # copied: its memory is reused, none more is locked
