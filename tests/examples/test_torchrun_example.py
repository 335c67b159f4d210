"""examples/torchrun.sh as its comment says to run it elsewhere: its settings overridden, on two CPU
processes of one node (an example nothing runs is one that stops working unnoticed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ddpipe

from ..conftest import BIN, REPO, launch

pytestmark = pytest.mark.mpi


def test_the_torchrun_example_stages_then_trains(raw_images: Path, tmp_path: Path) -> None:
    data = tmp_path / "wds"
    ddpipe.convert(raw_images, data, ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    settings = {"NPROC": "2", "MODEL": "smallcnn", "EPOCHS": "1", "BATCH": "4", "LOCAL": str(tmp_path / "local"),
                "TRAIN_FLAGS": "--image-size 32 --decode dali-cpu", "OMP_NUM_THREADS": "1"}
    env = {**os.environ, **settings, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = launch(["bash", str(REPO / "examples" / "torchrun.sh"), str(data)], 300, env, cwd=tmp_path)  # a hang bound
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shards = len(ddpipe.load_manifest(data).shards)
    assert f"staged {shards} shards" in proc.stdout and "on 2 rank(s)" in proc.stdout, proc.stdout
    assert f"epoch 0: {len(ddpipe.open_dataset(data))} images" in proc.stdout, proc.stdout
    assert len(list((tmp_path / "local").rglob("*.tar"))) == shards
