"""A manifest's counts never size anything beyond what its files can hold (invariant 9): a shard that
claims more samples than its bytes allow is refused, in one line, before anything is allocated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ddpipe

from .conftest import run_cli
from .helpers import make_dataset


def inflate(root: Path, samples: int, keep_bytes: bool) -> None:
    """Shard 0 claims ``samples`` samples, its label runs and the total made consistent with it (its
    sample digests, which would no longer match the count, taken out)."""
    doc = json.loads((root / "index.json").read_text())
    shard = doc["shards"][0]
    doc["num_samples"] += samples - shard["samples"]
    shard["samples"] = samples
    shard.pop("digests", None)
    if shard.get("labels"):
        shard["labels"] = [[0, samples]]
    if not keep_bytes:
        shard["bytes"] = samples * 10
    (root / "index.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("fmt", ["wds", "hdf5", "lmdb"])
@pytest.mark.parametrize("samples", [300_000_000, 10**18])
def test_a_count_the_shard_cannot_hold_is_refused_before_use(tmp_path: Path, fmt: str, samples: int) -> None:
    root = make_dataset(tmp_path / fmt, fmt, [20, 20])
    inflate(root, samples, keep_bytes=True)
    with pytest.raises(ddpipe.ManifestError, match=f"{samples} samples in"):
        ddpipe.open_dataset(root)
    for args in (("plan", root, "--world-size", "4"), ("inspect", root), ("verify", root)):
        proc = run_cli(*args, timeout=120)  # a hang bound: the refusal comes at once
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert f"{samples} samples in" in proc.stderr and proc.stderr.count("\n") == 1, (args, proc.stderr)


def test_bytes_raised_to_match_are_caught_against_the_file(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "wds", "wds", [20, 20])
    inflate(root, 300_000_000, keep_bytes=False)  # 3 GB claimed: the manifest alone cannot tell
    with pytest.raises(ddpipe.CorruptShardError, match=r"index\.json says 3000000000 bytes"):
        ddpipe.open_dataset(root)
    proc = run_cli("plan", root, "--world-size", "4", timeout=120)
    assert proc.returncode == 1 and "index.json says 3000000000 bytes" in proc.stderr, proc.stderr


def test_a_count_past_the_formats_smallest_sample_is_refused(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "wds", "wds", [20, 20])
    doc = json.loads((root / "index.json").read_text())
    size = doc["shards"][0]["bytes"]
    inflate(root, size // 100, keep_bytes=True)  # fewer than its bytes, more than 512-byte tar members allow
    with pytest.raises(ddpipe.CorruptShardError, match="at least 512 bytes each"):
        ddpipe.open_dataset(root)
