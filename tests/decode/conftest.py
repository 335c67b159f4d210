"""Two small datasets for the decoding tests: solid images whose colour is their label, and rendered
ones with texture."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ddpipe

from .images import (
    COLORS,
    labelled_samples,
)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dec") / "wds"
    ddpipe.write_dataset(root, iter(labelled_samples(40, np.random.default_rng(0))), samples_per_shard=16,
                         classes=[str(c) for c in range(len(COLORS))])
    return root


@pytest.fixture(scope="module")
def natural(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ddpipe.synth import encode_jpeg, render_image

    root = tmp_path_factory.mktemp("nat") / "wds"
    samples = ({"__key__": f"n/{i}", "jpg": encode_jpeg(render_image(i, seed=5, long_side=200)), "cls": b"%d" % (i % 3)}
               for i in range(24))
    ddpipe.write_dataset(root, samples, samples_per_shard=12, classes=["a", "b", "c"])
    return root
