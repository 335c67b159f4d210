"""What the staging tests share: a small source dataset, its keys, and where a stage directory
puts its copies."""

from __future__ import annotations

from pathlib import Path

import ddpipe
from ddpipe.staging.options import dataset_stage_dir

from ..helpers import make_dataset

ALL = {f"s/{i:06d}" for i in range(60)}


def source(tmp_path: Path) -> Path:
    """Five tar shards of 12 samples (``ALL``) under ``tmp_path``."""
    return make_dataset(tmp_path / "src", "wds", [12] * 5, payload=2048)


def keys(loader: ddpipe.EncodedStream) -> list[str]:
    return [s["__key__"] for batch in loader for s in batch]


def staged(root: Path, data: Path) -> Path:
    return dataset_stage_dir(root, ddpipe.open_dataset(data))
