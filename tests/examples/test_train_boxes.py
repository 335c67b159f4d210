"""examples/train_boxes.py as users run it: its own fields written with write_dataset, its own
decoder on the encoded stream, under mpiexec and torchrun alike; and what its decoder promises
(each box on its rectangle, flipped or not; the same tensors for the same batch)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import ddpipe

from ..conftest import REPO, mpiexec, torchrun

pytestmark = pytest.mark.mpi
SCRIPT = REPO / "examples" / "train_boxes.py"
N = 48
ARGS = ["--epochs", "2", "--batch-size", "8", "--image-size", "32"]


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_boxes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("boxes") / "data"
    proc = subprocess.run([sys.executable, SCRIPT, "write", root, "--n", str(N)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def errors(stdout: str) -> list[float]:
    return [float(x) for x in re.findall(rf"epoch \d: box error ([\d.]+) over {N} images on 2 rank", stdout)]


def test_each_decoded_box_lies_on_its_rectangle_and_some_are_flipped(data: Path) -> None:
    boxes_example = example()
    stored = {s["__key__"]: json.loads(s["json"])["box"] for s in ddpipe.open_dataset(data)}
    size, flipped, seen = 32, 0, 0
    with ddpipe.EncodedStream(data, 8, shuffle="local", seed=5) as stream:
        for epoch in (0, 1):
            stream.set_epoch(epoch)
            for batch in stream:
                images, boxes = boxes_example.decode(batch, size)
                again, _ = boxes_example.decode(batch, size)
                assert bool((images == again).all())  # a function of the batch alone
                for sample, image, box in zip(batch.samples, images.numpy(), boxes.numpy(), strict=True):
                    x0, y0, x1, y1 = np.round(box * size).astype(int)
                    inside = np.zeros((size, size), bool)
                    inside[y0 + 1 : y1 - 1, x0 + 1 : x1 - 1] = True
                    brightness = image.mean(axis=0)
                    assert brightness[inside].mean() > 0.7 and brightness[~inside].mean() < 0.4, sample["__key__"]
                    flipped += not np.allclose(box, stored[sample["__key__"]], atol=1e-6)
                    seen += 1
    assert seen == 2 * N and 0 < flipped < seen


def test_trains_alike_under_mpiexec_and_torchrun(data: Path) -> None:
    # two ranks exchange part of their samples: a decoder of the user's own takes them as bytes
    under_mpi = mpiexec(2, SCRIPT, "train", data, *ARGS, timeout=300)
    assert under_mpi.returncode == 0, under_mpi.stdout + under_mpi.stderr
    assert len(errors(under_mpi.stdout)) == 2
    under_torchrun = torchrun(2, SCRIPT, "train", data, *ARGS, timeout=300)
    assert under_torchrun.returncode == 0, under_torchrun.stdout + under_torchrun.stderr
    assert errors(under_torchrun.stdout) == pytest.approx(errors(under_mpi.stdout), abs=1e-5)


def test_a_dataset_without_boxes_is_one_line_naming_a_sample(raw_images: Path, tmp_path: Path) -> None:
    ddpipe.convert(raw_images, tmp_path / "classes", ddpipe.ConvertOptions(progress=False))  # images and classes
    proc = subprocess.run([sys.executable, SCRIPT, "train", tmp_path / "classes", *ARGS], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert re.fullmatch(r"train_boxes\.py: error: sample '[^']+': not an image with a box \(KeyError: 'json'\)\n",
                        proc.stderr), proc.stderr
