"""A classification problem in the regime where local shuffling loses accuracy, small enough to
train dozens of configurations on two cores.

Nguyen et al. (IPDPS 2022) saw the loss when each worker holds a few hundred samples of a
many-class dataset stored in class order: a worker's local batches then hold one or two classes,
and batch normalisation, whose statistics are per worker, normalises the class away. This problem
has that shape: 100 classes of 8x8 grey images, each class two smooth prototypes seen through
random contrast, brightness and heavy pixel noise (so that a global shuffle reaches about 65% top-1,
not 100%), written class after class into shards of half a class, as ImageNet's 1,281 images a class
fill about one of 1,024 shards. 256,000 training images: 250 per worker at W = 1,024.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..convert import write_dataset
from ..manifest import Manifest
from ..sample import Sample

SIDE = 8


@dataclass(frozen=True)
class ProblemOptions:
    classes: int = 100
    per_class: int = 2560
    test_per_class: int = 50
    noise: float = 2.0  # pixel noise against the prototypes' unit contrast: sets how hard the problem is
    samples_per_shard: int = 1280
    seed: int = 0


@dataclass(frozen=True)
class Problem:
    train_images: np.ndarray  # (N, 8, 8) uint8, in class order: sample g is the dataset's global index g
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    options: ProblemOptions


def make_problem(options: ProblemOptions | None = None) -> Problem:
    opt = options or ProblemOptions()
    rng = np.random.default_rng(opt.seed)
    prototypes = rng.normal(size=(opt.classes, 2, SIDE, SIDE))
    for _ in range(2):  # smooth, as natural images are: each pixel mixed with its neighbours
        prototypes = (prototypes + np.roll(prototypes, 1, 2) + np.roll(prototypes, 1, 3)) / 3
    prototypes = ((prototypes - prototypes.mean(axis=(2, 3), keepdims=True))
                  / prototypes.std(axis=(2, 3), keepdims=True))

    def draw(labels: np.ndarray) -> np.ndarray:
        n = len(labels)
        x = prototypes[labels, rng.integers(0, 2, n)]
        x = (x * rng.uniform(0.5, 1.5, (n, 1, 1)) + rng.normal(0, 0.5, (n, 1, 1))
             + rng.normal(0, opt.noise, (n, SIDE, SIDE)))
        pixels: np.ndarray = np.clip(128 + 40 * x, 0, 255).astype(np.uint8)
        return pixels

    train_labels = np.repeat(np.arange(opt.classes), opt.per_class)
    test_labels = np.repeat(np.arange(opt.classes), opt.test_per_class)
    return Problem(draw(train_labels), train_labels, draw(test_labels), test_labels, opt)


def write_problem(problem: Problem, out: Path) -> Manifest:
    """The training set as class-sorted WebDataset shards of 8x8 PNGs."""
    from PIL import Image

    def samples() -> Iterator[Sample]:
        for g, (image, label) in enumerate(zip(problem.train_images, problem.train_labels, strict=True)):
            png = io.BytesIO()
            Image.fromarray(image).save(png, format="PNG")
            yield {"__key__": f"c{label:03d}/{g:07d}", "png": png.getvalue(), "cls": b"%d" % label}

    return write_dataset(out, samples(), samples_per_shard=problem.options.samples_per_shard,
                         classes=[f"class{c:03d}" for c in range(problem.options.classes)])


def as_tensor(images: np.ndarray) -> torch.Tensor:
    """Images as the model takes them: flattened, scaled to [0, 1]."""
    return torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255)


def make_model(classes: int) -> nn.Module:
    """A two-layer perceptron with batch normalisation after each hidden layer."""
    return nn.Sequential(nn.Linear(SIDE * SIDE, 128), nn.BatchNorm1d(128), nn.ReLU(),
                         nn.Linear(128, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, classes))


@dataclass(frozen=True)
class Schedule:
    """SGD's learning rate: linear scaling with the global batch (0.1 per 256), linear warm-up over
    the first fifth of training (at most 5 epochs), then cosine decay to zero, as in large-batch
    ImageNet training."""

    global_batch: int
    steps: int
    steps_per_epoch: int

    @property
    def peak(self) -> float:
        return 0.1 * self.global_batch / 256

    def rate(self, step: int) -> float:
        warm = max(1, min(self.steps // 5, 5 * self.steps_per_epoch))
        if step < warm:
            return self.peak * (step + 1) / warm
        return self.peak * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, self.steps - warm)))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9, weight_decay=5e-5)


def top1(model: nn.Module, images: np.ndarray, labels: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        correct = (model(as_tensor(images)).argmax(1) == torch.from_numpy(labels)).float().mean()
    model.train()
    return float(correct)
