"""The training runs of benchmarks/gpu.py: ResNet-50 (AMP, channels-last, batch 256) on one GPU.

- **ddpipe's own training loop** (``Trainer``) fed by the ``Loader`` (``dali-gpu``, float16
  channels-last batches), then the same step on one batch held on the GPU: the model alone, the
  most any loader could let it do.
- **A plain loop** (a few lines: take a batch, train on it), fed in turn by the Loader, by the
  Loader reading in a process of its own (``read_in="process"``), and by DALI's own webdataset
  pipeline (its reader, ``image_random_crop`` on the GPU, the same float16 channels-last batches; its labels are
  not decoded, so a fixed label batch stands in). The loop is the same for every feed, so their
  stalls compare like with like: how much of ResNet-50's time each feed costs on this GPU, DALI's
  own being what a GPU pipeline with no Python between its stages reaches.

A stall is the share of an epoch's time spent waiting for the next batch; each run's figures are the
medians of its epochs after the first (cuDNN's choices, DALI's buffers). The plain loops also say
where their waits fall: each epoch's first batch, and the median and 99th percentile of the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpu_timing import BATCH, CORES, SIZE

from ddpipe.bench.harness import median


def run_trainer(root: Path, epochs: int, classes: int) -> dict[str, Any]:
    """ResNet-50 with AMP and channels-last fed by the Loader through ddpipe's Trainer, then the model
    alone on one batch."""
    import torch

    import ddpipe
    import ddpipe.distributed
    from ddpipe.train.loop import Trainer, TrainOptions
    from ddpipe.train.models import build_model
    from ddpipe.train.step import train_step

    torch.backends.cudnn.benchmark = True
    loader = ddpipe.Loader(root, BATCH, decoder="dali-gpu", device="cuda", shuffle="local", dtype="float16",
                           channels_last=True)
    options = TrainOptions(epochs=epochs, amp=True, channels_last=True)
    job = ddpipe.distributed.init("cuda", comm=loader.comm)
    trainer = Trainer(build_model("resnet50", classes), loader, job, options, log=lambda line: None)
    logs = trainer.fit()[1:]  # the first epoch warms up cuDNN's choices and DALI's buffers
    fed = median([log.images_per_s for log in logs])
    stall = median([log.stall for log in logs])
    # the model alone: the same step on one batch that never leaves the GPU
    images, labels = next(iter(loader))
    images = images.contiguous(memory_format=torch.channels_last)
    steps = max(len(loader), 20)
    for _ in range(5):
        train_step(trainer.trained, trainer.optimizer, images, labels, trainer.scaler, trainer.amp_dtype)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step(trainer.trained, trainer.optimizer, images, labels, trainer.scaler, trainer.amp_dtype)
    torch.cuda.synchronize()
    alone = steps * len(labels) / (time.perf_counter() - t0)
    return {"fed_img_s": fed, "alone_img_s": alone, "stall": stall,
            "epochs": [{"images_per_s": log.images_per_s, "stall": log.stall} for log in logs]}


def plain_loop(batches_of_epoch: Callable[[], Iterable[tuple[Any, Any]]], epochs: int, classes: int) -> dict[str, Any]:
    """ResNet-50 trained on each batch as it comes, for ``epochs`` epochs: images/s and stall, and
    where the waits fall: each epoch's first batch's wait, the stall without it (``stall_steady``),
    and the median and 99th percentile of the waits for the others. A benchmark's epoch is a few
    dozen batches, a training epoch thousands: a stall spent at each epoch's start weighs a hundred
    times more here than there, one spread over its batches as much."""
    import numpy as np
    import torch

    from ddpipe.train.models import build_model
    from ddpipe.train.step import train_step

    torch.backends.cudnn.benchmark = True
    model = build_model("resnet50", classes).cuda().to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    logs = []
    for _ in range(epochs):
        n, waits = 0, []
        t0 = t_wait = time.perf_counter()
        for images, labels in batches_of_epoch():
            waits.append(time.perf_counter() - t_wait)
            train_step(model, optimizer, images, labels, scaler, torch.float16)
            n += len(labels)
            t_wait = time.perf_counter()
        torch.cuda.synchronize()  # the epoch ends when its last step does
        seconds = time.perf_counter() - t0
        later = np.array(waits[1:] or [0.0]) * 1000
        logs.append({"images_per_s": n / seconds, "stall": sum(waits) / seconds,
                     "stall_steady": sum(waits[1:]) / (seconds - waits[0]), "first_wait_ms": 1000 * waits[0],
                     "wait_p50_ms": float(np.percentile(later, 50)), "wait_p99_ms": float(np.percentile(later, 99))})
    later_epochs = logs[1:]
    out: dict[str, Any] = {key: median([e[key] for e in later_epochs]) for key in logs[0]}
    out["fed_img_s"] = out.pop("images_per_s")
    return {**out, "epochs": later_epochs}


def loader_batches(root: Path, read_in: str = "thread") -> Callable[[], Iterable[tuple[Any, Any]]]:
    """The Loader's epochs, one after another (float16 channels-last batches, as the Trainer takes)."""
    import ddpipe

    loader = ddpipe.Loader(root, BATCH, decoder="dali-gpu", device="cuda", shuffle="local", dtype="float16",
                           channels_last=True, read_in=read_in)
    epoch = [0]

    def batches() -> Iterable[tuple[Any, Any]]:
        loader.set_epoch(epoch[0])
        epoch[0] += 1
        return iter(loader)

    return batches


def dali_batches(shards: Path, classes: int) -> Callable[[], Iterable[tuple[Any, Any]]]:
    """DALI's own webdataset pipeline's epochs (float16 NHWC, viewed as channels-last NCHW), each batch
    with a fixed batch of labels on the GPU (DALI's reader leaves the labels undecoded)."""
    import torch

    from ddpipe.bench.peers import PeerInputs, PeerOptions, make_peer

    inputs = PeerInputs(shards, sorted(shards.glob("*.tar")))
    options = PeerOptions(batch_size=BATCH, size=SIZE, dtype="float16", workers=CORES, device="cuda",
                          channels_last=True)
    epoch = make_peer("dali-wds", inputs, options)
    labels = torch.randint(classes, (BATCH,), device="cuda")

    def batches() -> Iterable[tuple[Any, Any]]:
        return ((x.permute(0, 3, 1, 2), labels[: len(x)]) for x in epoch())

    return batches


def run_plain(feed: str, shards: Path, epochs: int, classes: int) -> dict[str, Any]:
    """``feed``: one of :data:`PLAIN_FEEDS`, into :func:`plain_loop`."""
    if feed == "dali-wds":
        return plain_loop(dali_batches(shards, classes), epochs, classes)
    if feed == "loader-process-inline":
        from ddpipe.decode.dali import DaliDecoder

        DaliDecoder.RUN_AHEAD = False  # in this process only (gpu.py runs each feed in one of its own)
    read_in = "process" if feed.startswith("loader-process") else "thread"
    return plain_loop(loader_batches(shards, read_in), epochs, classes)


# measured in turn in each run. A feed of the Loader with a tenth of the default interpreter switch interval
# was measured at 401073e (results/gpu-train.json, with 7e49f82's benchmark) and dropped: a faster rate, the
# same stall
PLAIN_FEEDS = {"loader": "fed by the Loader (dali-gpu), plain loop",
               "loader-process": "fed by the Loader (dali-gpu, read in a process), plain loop",
               "dali-wds": "fed by DALI's webdataset pipeline, plain loop",
               # last: the run a time limit would cut first. DALI run on the training thread, as before 53639df
               "loader-process-inline": "fed by the Loader (dali-gpu, read in a process, DALI on the training "
                                        "thread), plain loop"}
