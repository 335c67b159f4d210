"""The accuracy benchmark's problem has the shape the paper's loss needs: class-sorted shards."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from ddpipe.bench.class_problem import ProblemOptions, make_problem, write_problem
from ddpipe.dataset import open_dataset
from ddpipe.sample import label_of

SMALL = ProblemOptions(classes=6, per_class=30, test_per_class=5, samples_per_shard=15)


def test_shards_are_class_sorted_and_hold_the_arrays(tmp_path: Path) -> None:
    problem = make_problem(SMALL)
    manifest = write_problem(problem, tmp_path / "d")
    assert all(len(s.labels) == 1 for s in manifest.shards)  # half a class per shard: one class each
    labels = manifest.sample_labels()
    assert labels is not None and np.array_equal(labels, problem.train_labels)
    assert np.all(np.diff(labels) >= 0)
    data = open_dataset(tmp_path / "d")
    for g, sample in enumerate(data):  # global index g is row g of the arrays the trainer uses
        assert label_of(sample) == problem.train_labels[g]
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(sample["png"]))), problem.train_images[g])


def test_the_same_seed_makes_the_same_problem() -> None:
    a, b = make_problem(SMALL), make_problem(SMALL)
    assert np.array_equal(a.train_images, b.train_images) and np.array_equal(a.test_images, b.test_images)
    c = make_problem(ProblemOptions(**{**SMALL.__dict__, "seed": 1}))
    assert not np.array_equal(a.train_images, c.train_images)
