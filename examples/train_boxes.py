"""Your own data and your own decoder on ddpipe's encoded stream: a box-regression task to copy.

    python examples/train_boxes.py write DATA [--n 512]       # images with a box each: jpg + json
    python examples/train_boxes.py train DATA                 # one process
    mpiexec -n 8 python examples/train_boxes.py train DATA    # MPI (or srun, or torchrun)

Not every task is classification. ``ddpipe.write_dataset`` stores samples with any fields (here a
JPEG and a JSON target); ``ddpipe.EncodedStream`` gives each rank its share of them, partially
shuffled across the job, as encoded bytes with the plan's decisions; the decoding is yours. The
decoder below flips each image and its box together, and is a pure function of the batch: the
batch's seed and epoch and each sample's global index fix the flip, so a resumed epoch, another
rank count or another machine decodes the same. It runs a batch ahead on a thread (PIL releases
the interpreter lock while it decodes and resizes), so the step trains while the next batch decodes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import ddpipe
import ddpipe.distributed

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 as fractions of the width and height


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="write a dataset of images with a bright box each")
    write.add_argument("data")
    write.add_argument("--n", type=int, default=512)
    write.add_argument("--seed", type=int, default=0)
    train = sub.add_parser("train", help="train a small network to find the box")
    train.add_argument("data")
    train.add_argument("--epochs", type=int, default=10)
    train.add_argument("--batch-size", type=int, default=32, help="per rank")
    train.add_argument("--image-size", type=int, default=64)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def samples_with_boxes(n: int, seed: int) -> Iterator[dict[str, bytes | str]]:
    """Dark noisy images of varied sizes, each with one bright rectangle, and its box as JSON: the
    loop to replace with one over your own files and annotations."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        w, h = (int(v) for v in rng.integers(96, 192, 2))
        pixels = rng.integers(0, 60, (h, w, 3), dtype=np.uint8)
        x0, y0 = rng.uniform(0.0, 0.6, 2)
        x1, y1 = x0 + rng.uniform(0.2, 0.4), y0 + rng.uniform(0.2, 0.4)
        pixels[round(y0 * h):round(y1 * h), round(x0 * w):round(x1 * w)] = 230
        jpeg = io.BytesIO()
        Image.fromarray(pixels).save(jpeg, format="JPEG", quality=90)
        box = [round(float(v), 4) for v in (x0, y0, x1, y1)]
        yield {"__key__": f"box{i:06d}", "jpg": jpeg.getvalue(), "json": json.dumps({"box": box}).encode()}


def decode(batch: ddpipe.SampleBatch, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of encoded samples as images (N x 3 x size x size, floats in [0, 1]) and boxes
    (N x 4), each image and its box flipped together, or neither: a pure function of the batch."""
    images = np.empty((len(batch), size, size, 3), np.uint8)
    boxes = np.empty((len(batch), 4), np.float32)
    for i, (index, sample) in enumerate(zip(batch.indices, batch.samples, strict=True)):
        try:
            image = Image.open(io.BytesIO(sample["jpg"])).convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
            x0, y0, x1, y1 = json.loads(sample["json"])["box"]
        except (OSError, ValueError, KeyError, TypeError) as e:  # not an image with a box: said, naming the sample
            raise ddpipe.SampleError(f"not an image with a box ({type(e).__name__}: {e})",
                                     key=str(sample["__key__"])) from None
        # the same draw for this sample in this epoch wherever it is decoded (not the order it comes in)
        if np.random.default_rng((batch.seed, batch.epoch, int(index))).random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            x0, x1 = 1.0 - x1, 1.0 - x0
        images[i] = np.asarray(image)
        boxes[i] = (x0, y0, x1, y1)
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255), torch.from_numpy(boxes)


def decoded(stream: ddpipe.EncodedStream, size: int,
            pool: concurrent.futures.Executor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The stream's batches decoded, the next one on ``pool`` while the caller uses this one."""
    ahead: concurrent.futures.Future[tuple[torch.Tensor, torch.Tensor]] | None = None
    for batch in stream:
        following = pool.submit(decode, batch, size)
        if ahead is not None:
            yield ahead.result()
        ahead = following
    if ahead is not None:
        yield ahead.result()


def box_finder(size: int) -> torch.nn.Module:
    """A small network from an image to its box (fractions, so a sigmoid at the end)."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(32 * (size // 8) ** 2, 4), torch.nn.Sigmoid())


def train(args: argparse.Namespace, job: ddpipe.distributed.Job) -> None:
    stream = ddpipe.EncodedStream(args.data, args.batch_size, shuffle="partial", seed=args.seed, comm=job.comm)
    torch.manual_seed(args.seed)
    model = ddpipe.distributed.wrap(box_finder(args.image_size).to(job.device), job)  # rank 0's weights everywhere
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    with stream, concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="decode") as pool:
        for epoch in range(args.epochs):
            stream.set_epoch(epoch)
            loss_sum, images = 0.0, 0
            for x, boxes in decoded(stream, args.image_size, pool):
                x, boxes = x.to(job.device), boxes.to(job.device)
                loss = torch.nn.functional.l1_loss(model(x), boxes)
                model.zero_grad()
                model.backward(loss)  # gradients averaged across ranks
                optimizer.step()
                loss_sum, images = loss_sum + loss.item() * len(x), images + len(x)
            ranks = job.comm.allgather((loss_sum, images))
            total = sum(n for _, n in ranks)
            if job.is_main:
                print(f"epoch {epoch}: box error {sum(s for s, _ in ranks) / total:.6f} over {total} images "
                      f"on {job.size} rank(s)", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "write":
        try:
            manifest = ddpipe.write_dataset(args.data, samples_with_boxes(args.n, args.seed), samples_per_shard=128)
        except ddpipe.DdpipeError as e:
            raise SystemExit(f"{Path(sys.argv[0]).name}: error: {e}") from None
        print(f"{args.data}: {manifest.num_samples} samples in {len(manifest.shards)} shards")
        return
    job = ddpipe.distributed.init()
    try:
        train(args, job)
    except ddpipe.DdpipeError as e:  # a bad path or dataset: one line, not a traceback
        if job.is_main or not e.job_wide:
            print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr, flush=True)
        if not e.job_wide:
            job.comm.end_job(1)
        ddpipe.distributed.shutdown(job)
        raise SystemExit(1) from None
    ddpipe.distributed.shutdown(job)


if __name__ == "__main__":
    main()
