"""ImageNet as it ships, in a tiny look-alike: the training tree (a directory per synset) and the
validation set (one flat directory plus its ground truth, in both forms), with the same class indices."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import ddpipe

from ..conftest import run_cli
from ..decode.images import solid_jpeg

# the devkit's ILSVRC2012_ID order is not the sorted order of the synsets: ids 1, 2, 3 below
DEVKIT = ["n02119789", "n01440764", "n09999999"]
SORTED = sorted(DEVKIT)
COLOUR = {"n01440764": (220, 30, 30), "n02119789": (30, 220, 30), "n09999999": (30, 30, 220)}
VAL = ["n09999999", "n01440764", "n02119789", "n01440764", "n02119789", "n09999999", "n01440764"]


@pytest.fixture
def imagenet(tmp_path: Path) -> Path:
    root = tmp_path / "ILSVRC"
    for s in DEVKIT:
        (root / "train" / s).mkdir(parents=True)
        for j in range(3):
            (root / "train" / s / f"{s}_{j}.JPEG").write_bytes(solid_jpeg(COLOUR[s], (20, 16)))
    (root / "val").mkdir()
    for k, s in enumerate(VAL, 1):
        (root / "val" / f"ILSVRC2012_val_{k:08d}.JPEG").write_bytes(solid_jpeg(COLOUR[s], (20, 16)))
    (root / "LOC_val_solution.csv").write_text(
        "ImageId,PredictionString\n"
        + "".join(f"ILSVRC2012_val_{k:08d},{s} 1 2 10 12 \n" for k, s in enumerate(VAL, 1)))
    (root / "LOC_synset_mapping.txt").write_text("".join(f"{s} name of {s}\n" for s in SORTED))
    (root / "ILSVRC2012_validation_ground_truth.txt").write_text("".join(f"{DEVKIT.index(s) + 1}\n" for s in VAL))
    (root / "map_clsloc.txt").write_text("".join(f"{s} {i} name_{i}\n" for i, s in enumerate(DEVKIT, 1)))
    return root


def colour_label(data: bytes) -> str:
    r, g, b = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[4, 4].tolist()
    return min(COLOUR, key=lambda s: sum(abs(x - y) for x, y in zip(COLOUR[s], (r, g, b), strict=True)))


@pytest.mark.parametrize(("truth", "synsets"), [("LOC_val_solution.csv", None),
                                                ("LOC_val_solution.csv", "LOC_synset_mapping.txt"),
                                                ("ILSVRC2012_validation_ground_truth.txt", "map_clsloc.txt")])
def test_train_and_val_share_class_indices(imagenet: Path, tmp_path: Path, truth: str, synsets: str | None) -> None:
    train = run_cli("convert", imagenet / "train", tmp_path / "train", "--format", "wds")
    assert train.returncode == 0, train.stderr
    flags: list[str | Path] = ["--val-labels", imagenet / truth]
    if synsets:
        flags += ["--synsets", imagenet / synsets]
    val = run_cli("convert", imagenet / "val", tmp_path / "val", "--format", "hdf5", *flags)
    assert val.returncode == 0, val.stderr
    t, v = ddpipe.open_dataset(tmp_path / "train"), ddpipe.open_dataset(tmp_path / "val")
    assert t.classes == v.classes == tuple(SORTED)
    for ds in (t, v):
        for sample in ds:  # each image's colour names its synset: its label must index that synset
            assert ds.classes[int(sample["cls"])] == colour_label(sample["jpg"]), sample["__key__"]
    assert len(v) == len(VAL)


def test_the_devkit_form_without_its_synset_list_says_what_is_missing(imagenet: Path, tmp_path: Path) -> None:
    proc = run_cli("convert", imagenet / "val", tmp_path / "val", "--val-labels",
                   imagenet / "ILSVRC2012_validation_ground_truth.txt")
    assert proc.returncode == 1 and "--synsets" in proc.stderr and "Traceback" not in proc.stderr


def test_an_image_missing_from_the_ground_truth_is_named(imagenet: Path, tmp_path: Path) -> None:
    (imagenet / "val" / "ILSVRC2012_val_00000099.JPEG").write_bytes(solid_jpeg((1, 2, 3), (8, 8)))
    proc = run_cli("convert", imagenet / "val", tmp_path / "val", "--val-labels", imagenet / "LOC_val_solution.csv")
    assert proc.returncode == 1 and "ILSVRC2012_val_00000099.JPEG has no entry" in proc.stderr


def test_a_validation_directory_given_as_a_url_is_refused_by_its_url(imagenet: Path, tmp_path: Path) -> None:
    """It was named "s3:/b/val" (a Path had eaten a slash), as a local directory that was not there."""
    proc = run_cli("convert", "s3://b/val", tmp_path / "val", "--val-labels", imagenet / "LOC_val_solution.csv")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "s3://b/val: ImageNet's validation ground truth (--val-labels) goes with its flat validation directory " \
        "on a local disk, not a URL" in proc.stderr
    assert not (tmp_path / "val").exists()
