"""``ddpipe train`` for a person watching it: progress lines, a checkpoint when told to stop, skipping
images that do not decode, and a plain answer when a resumed run has nothing left to do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ddpipe

from ..conftest import run_cli
from ..decode.images import fewer_names_than_labels, labelled_samples

TRAIN = ["--model", "smallcnn", "--batch-size", "4", "--image-size", "32", "--decode", "dali-cpu", "--dtype", "uint8"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cmd") / "wds"
    samples = labelled_samples(24, np.random.default_rng(5))
    samples[7]["jpg"] = samples[7]["jpg"][: len(samples[7]["jpg"]) // 2]  # cut in half: does not decode
    ddpipe.write_dataset(root, iter(samples), samples_per_shard=8, classes=[str(c) for c in range(6)])
    return root


def test_progress_lines_and_a_checkpoint_when_stopped(data: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    proc = run_cli("train", data, *TRAIN, "--epochs", "2", "--log-every", "2", "--max-steps", "5",
                   "--on-error", "skip", "--checkpoint", ckpt, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = [ln for ln in proc.stdout.splitlines() if ln.startswith("epoch 0 step ")]
    assert [ln.split()[3] for ln in steps] == ["2/6:", "4/6:"]
    assert all("images/s" in ln and "loss" in ln and "data wait per rank" in ln for ln in steps)
    assert "stopped after step 5 (--max-steps)" in proc.stdout and ckpt.exists()
    rest = run_cli("train", data, *TRAIN, "--epochs", "2", "--on-error", "skip", "--checkpoint", ckpt, "--seed", "3",
                   timeout=300)
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert "resumed from" in rest.stdout and "epoch 1:" in rest.stdout
    # the saved order goes on, as it must; a seed given with it was passed over without a word
    assert "; the samples keep the checkpoint's seed, 0, not 3\n" in rest.stdout, rest.stdout
    again = run_cli("train", data, *TRAIN, "--epochs", "2", "--checkpoint", ckpt, timeout=300)
    assert again.returncode == 0 and "nothing left to do" in again.stdout, again.stdout + again.stderr


def test_a_bad_image_stops_training_naming_it_unless_skipped(data: Path) -> None:
    proc = run_cli("train", data, *TRAIN, timeout=300)
    assert proc.returncode == 1 and "img/0007" in proc.stderr and "Traceback" not in proc.stderr
    skipped = run_cli("train", data, *TRAIN, "--on-error", "skip", timeout=300)
    assert skipped.returncode == 0, skipped.stderr
    assert "skipped 1 samples in the last epoch, e.g. img/0007 in " in skipped.stdout, skipped.stdout
    assert ": does not decode" in skipped.stdout


def test_a_label_the_model_has_no_class_for_stops_training_naming_it_unless_skipped(tmp_path: Path) -> None:
    """Left to the loss, it was a traceback here, and a device-side assert naming no sample on a GPU."""
    root, unnamed = fewer_names_than_labels(tmp_path / "d", 3)
    proc = run_cli("train", root, *TRAIN, timeout=300)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "is outside the dataset's 3 classes" in proc.stderr and any(k in proc.stderr for k in unnamed)
    skipped = run_cli("train", root, *TRAIN, "--on-error", "skip", timeout=300)
    assert skipped.returncode == 0, skipped.stderr
    assert f"skipped {len(unnamed)} samples in the last epoch" in skipped.stdout, skipped.stdout


def test_a_sample_without_a_label_stops_training_naming_it_unless_skipped(tmp_path: Path) -> None:
    """A labelled dataset with some samples lacking cls (adopted tars, partly labelled): each came with
    label -1, and the loss failed at its batch with torch's traceback ("Target -1 is out of bounds")."""
    root = tmp_path / "partly"
    samples = labelled_samples(24, np.random.default_rng(5))
    for i in (5, 17):
        del samples[i]["cls"]
    ddpipe.write_dataset(root, iter(samples), samples_per_shard=8, classes=[str(c) for c in range(6)])
    proc = run_cli("train", root, *TRAIN, timeout=300)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "has no label (no cls field)" in proc.stderr and ("img/0005" in proc.stderr or "img/0017" in proc.stderr)
    skipped = run_cli("train", root, *TRAIN, "--on-error", "skip", timeout=300)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "skipped 2 samples in the last epoch" in skipped.stdout, skipped.stdout


def test_a_corrupt_shard_stops_training_naming_it_unless_skipped(data: Path, tmp_path: Path) -> None:
    import shutil

    from ..helpers import flip_middle_keeping_time, shard_file

    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    flip_middle_keeping_time(shard_file(copy, 2))
    proc = run_cli("train", copy, *TRAIN, timeout=300)
    assert proc.returncode == 1 and "checksum mismatch" in proc.stderr and "Traceback" not in proc.stderr
    assert shard_file(copy, 2).name in proc.stderr
    skipped = run_cli("train", copy, *TRAIN, "--on-error", "skip", timeout=300)
    assert skipped.returncode == 0, skipped.stderr
    assert f"corrupt shard(s) {shard_file(copy, 2).name}" in skipped.stdout


def test_labels_past_the_models_classes_are_refused_before_training(data: Path, tmp_path: Path) -> None:
    """A dataset that names no classes takes its class count from --num-classes (one that names them
    refuses another count); a held-out set that names none is scored against the training set's. A
    recorded label past that count would fail the loss at its first batch (a traceback here, a
    device-side assert naming nothing on a GPU)."""
    numbered = tmp_path / "numbered"
    samples = labelled_samples(12, np.random.default_rng(2))
    for i, sample in enumerate(samples):
        sample["cls"] = b"%d" % (i % 9)  # past the 6 classes the training set `data` names
    ddpipe.write_dataset(numbered, iter(samples), samples_per_shard=6)
    top = 8
    proc = run_cli("train", numbered, *TRAIN, "--num-classes", str(top), timeout=300)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{numbered}: a sample's label is {top}, but the model has --num-classes {top} (the training dataset " \
        f"names no classes): give {top + 1} or more" in proc.stderr and "epoch 0" not in proc.stdout
    fits = run_cli("train", numbered, *TRAIN, "--num-classes", str(top + 1), "--max-steps", "1", "--amp", timeout=300)
    assert fits.returncode == 0, fits.stdout + fits.stderr
    # --amp was passed over on the CPU without a word
    assert "ddpipe: warning: --amp: mixed precision is for CUDA devices; training on cpu in float32\n" in fits.stderr
    named = run_cli("train", data, *TRAIN, "--num-classes", "3", timeout=300)  # was passed over: 6 outputs
    assert named.returncode == 1 and named.stderr.count("\n") == 1, named.stdout + named.stderr
    assert named.stderr == f"ddpipe: error: {data}: --num-classes 3, but the dataset names 6 classes, which set " \
                           "the model's outputs: leave --num-classes out\n" and "epoch 0" not in named.stdout
    held_out = run_cli("train", data, *TRAIN, "--on-error", "skip", "--eval", numbered, timeout=300)
    assert held_out.returncode == 1, held_out.stdout + held_out.stderr
    assert f"{numbered}: a sample's label is {top}, but the model has the training dataset's 6 classes" \
        in held_out.stderr and "Traceback" not in held_out.stderr


def test_a_dataset_without_labels_is_refused_before_training(data: Path, tmp_path: Path) -> None:
    """Samples with no cls field (tars adopted with their labels elsewhere): each came with label -1,
    and the loss failed at the first batch with torch's traceback ("Target -1 is out of bounds")."""
    unlabelled = tmp_path / "unlabelled"
    samples = labelled_samples(12, np.random.default_rng(4))
    for sample in samples:
        del sample["cls"]
    ddpipe.write_dataset(unlabelled, iter(samples), samples_per_shard=6)
    said = f"{unlabelled}: its samples have no labels (no 'cls' field among jpg): ddpipe train learns"
    commands: list[list[str | Path]] = [[unlabelled, "--num-classes", "3"],
                                        [data, "--on-error", "skip", "--eval", unlabelled]]
    for args in commands:
        proc = run_cli("train", *args, *TRAIN, timeout=300)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert said in proc.stderr and "epoch 0" not in proc.stdout, proc.stdout + proc.stderr


def test_a_checkpoint_of_another_model_is_refused_in_one_line(data: Path, tmp_path: Path) -> None:
    """Another --model, or a dataset with other classes: torch's error listed every parameter, in a
    traceback of many lines."""
    ckpt = tmp_path / "ckpt.pt"
    first = run_cli("train", data, *TRAIN, "--on-error", "skip", "--max-steps", "1", "--checkpoint", ckpt, timeout=300)
    assert first.returncode == 0 and ckpt.exists(), first.stdout + first.stderr
    other = [a if a != "smallcnn" else "resnet18" for a in TRAIN]
    proc = run_cli("train", data, *other, "--on-error", "skip", "--checkpoint", ckpt, timeout=300)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{ckpt}: a checkpoint of another model (" in proc.stderr and "e.g. 'conv1.weight'" in proc.stderr
    four = tmp_path / "four"
    samples = labelled_samples(8, np.random.default_rng(3))
    for i, sample in enumerate(samples):
        sample["cls"] = b"%d" % (i % 4)
    ddpipe.write_dataset(four, iter(samples), samples_per_shard=4, classes=["a", "b", "c", "d"])
    proc = run_cli("train", four, *TRAIN, "--checkpoint", ckpt, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "'fc.weight' is 6x64 there, 4x64 here" in proc.stderr
