"""An adopted file read by several real ranks, each checking the samples it reads: a sample that
differs from the manifest ends the job naming it, or under ``--on-error skip`` is dropped alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import mpiexec
from ..helpers import adopted, flip_inside_sample, image_of, shard_file

pytestmark = pytest.mark.mpi


def train(ranks: int, root: Path, *extra: str) -> tuple[int, str, str]:
    proc = mpiexec(ranks, "-m", "ddpipe", "train", root, "--model", "smallcnn", "--batch-size", "2",
                   "--image-size", "32", "--decode", "dali-cpu", "--device", "cpu", "--shuffle", "partial",
                   "--epochs", "1", *extra, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_changed_sample_of_an_adopted_file_ends_the_job_naming_it(ranks: int, tmp_path: Path) -> None:
    root = adopted("h5-vlen", tmp_path)
    key, image = image_of(root, 20)  # the second file's: not every rank reads it
    flip_inside_sample(shard_file(root, 1), image)
    code, _, err = train(ranks, root)
    assert code != 0
    assert "digest differs" in err and key in err and shard_file(root, 1).name in err
    assert "Traceback" not in err


def test_under_skip_the_job_trains_on_the_other_samples(tmp_path: Path) -> None:
    root = adopted("h5-vlen", tmp_path)
    key, image = image_of(root, 20)
    flip_inside_sample(shard_file(root, 1), image)
    code, out, err = train(2, root, "--on-error", "skip")
    assert code == 0, err
    assert "epoch 0" in out and key in err and "skipping a sample" in err
