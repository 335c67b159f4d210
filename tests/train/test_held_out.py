"""A held-out dataset scored against the classes the model learnt, matched by name
(``ddpipe/train/held_out.py``): a validation set converted on its own names them in another order, or
only some of them. ``ddpipe train --eval`` refused both; one naming a class the training dataset does
not is still refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import ddpipe
import ddpipe.distributed
from ddpipe.decode import DecodeOptions
from ddpipe.sample import Sample
from ddpipe.train.loop import Trainer, TrainOptions

from ..decode.images import labelled_samples

# which of R, G, B is above ImageNet's mean in each class's solid colour (tests/decode/images.COLORS)
HIGH = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 1, 1], [1, 0, 1]], dtype=torch.float32)
NAMES = [f"n{c:02d}" for c in range(6)]


class ColourOracle(nn.Module):
    """Knows each image's class (numbered as the training dataset numbers it) from its colour: top-1
    is 1 exactly where the held-out labels are scored against the right classes."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))  # a model to wrap has parameters

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        high = (x.float().mean(dim=(2, 3)) > 0).float()  # normalised: above the mean, per channel
        return -(high[:, None, :] - HIGH[None]).abs().sum(-1)


def write(root: Path, classes: list[str], samples: list[Sample]) -> Path:
    """``samples`` (labelled by NAMES' numbers) with ``classes``' numbers for the same names."""
    number = {name: i for i, name in enumerate(classes)}
    relabelled = [{**s, "cls": b"%d" % number[NAMES[int(s["cls"])]]} for s in samples]
    ddpipe.write_dataset(root, iter(relabelled), samples_per_shard=12, classes=classes)
    return root


def loader(root: Path) -> ddpipe.Loader:
    return ddpipe.Loader(root, 8, decoder="dali-cpu", device="cpu", shuffle="none", pad=False,
                         decode=DecodeOptions(size=32, resize_shorter=36, dtype="uint8", threads=1, train=False))


def top1(train: Path, held_out: Path) -> tuple[float, int]:
    evaluate = loader(held_out)
    trainer = Trainer(ColourOracle(), loader(train), ddpipe.distributed.init("cpu", comm=ddpipe.comm.Comm()),
                      TrainOptions(epochs=1), evaluate, log=lambda line: None)
    try:
        return trainer._top1()
    finally:
        trainer.loader.close()
        evaluate.close()


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    return labelled_samples(24, np.random.default_rng(8))


def test_held_out_classes_in_another_order_or_some_of_them_are_scored_by_name(
        samples: list[Sample], tmp_path: Path) -> None:
    train = write(tmp_path / "train", NAMES, samples)
    assert top1(train, train) == (1.0, 24)
    reordered = write(tmp_path / "reordered", NAMES[::-1], samples)  # scored by number: 0 right of 24
    assert top1(train, reordered) == (1.0, 24)
    some = [s for s in samples if int(s["cls"]) in (2, 5)]
    subset = write(tmp_path / "subset", ["n05", "n02"], some)  # scored by number: class 0 and 1's logits
    assert top1(train, subset) == (1.0, len(some))


def test_a_held_out_class_the_training_dataset_does_not_name_is_refused_in_one_line(
        samples: list[Sample], tmp_path: Path) -> None:
    from ..conftest import run_cli

    train = write(tmp_path / "train", NAMES, samples)
    other = write(tmp_path / "other", [*NAMES[:5], "zebra"], [s for s in samples if s["cls"] != b"5"])
    proc = run_cli("train", train, "--model", "smallcnn", "--batch-size", "4", "--image-size", "32", "--decode",
                   "dali-cpu", "--dtype", "uint8", "--eval", other, timeout=300)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (f"{other}: the held-out dataset names 1 class(es) the training dataset does not ('zebra'): its images "
            "of them could only be scored wrong") in proc.stderr and "epoch 0" not in proc.stdout
