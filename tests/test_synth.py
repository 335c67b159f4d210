from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from ddpipe.synth import SynthOptions, class_name, encode_jpeg, render_image, synth

from .conftest import dir_bytes


def test_imagenet_like_images() -> None:
    sizes, shapes = [], []
    for i in range(12):
        px = render_image(i, seed=1)
        shapes.append(px.shape)
        sizes.append(len(encode_jpeg(px)))
        # natural-image structure: neither flat nor white noise (neighbouring pixels correlate)
        g = px.mean(axis=2)
        corr = np.corrcoef(g[:, :-1].ravel(), g[:, 1:].ravel())[0, 1]
        assert px.std() > 20 and 0.5 < corr < 0.999
    assert 80_000 < np.mean(sizes) < 140_000
    assert all(300 <= max(h, w) <= 600 for h, w, _ in shapes) and len({h / w for h, w, _ in shapes}) > 2


def test_deterministic_and_independent_of_order(tmp_path: Path) -> None:
    synth(tmp_path / "a", SynthOptions(n=6, classes=2, seed=3, long_side=96, progress=False))
    synth(tmp_path / "b", SynthOptions(n=6, classes=2, seed=3, long_side=96, workers=2, progress=False))
    assert dir_bytes(tmp_path / "a") == dir_bytes(tmp_path / "b")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [".ddpipe-synth.json", class_name(0), class_name(1)]
    one = next((tmp_path / "a" / class_name(1)).iterdir())
    assert Image.open(io.BytesIO(one.read_bytes())).format == "JPEG"
    assert not np.array_equal(render_image(0, seed=3), render_image(0, seed=4))


def test_workers_are_fresh_interpreters_not_forks_of_the_caller(tmp_path: Path) -> None:
    """A caller holding threads (DALI's pipelines, MPI) is never forked: a worker forked from it once
    hung, finalising an inherited DALI pipeline. Here a fork of the caller would end at once."""
    script = ("import os, sys; from ddpipe.synth import SynthOptions, synth\n"
              "os.register_at_fork(after_in_child=lambda: os._exit(3))\n"
              "synth(sys.argv[1], SynthOptions(n=4, classes=2, long_side=48, workers=2, progress=False))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list((tmp_path / "out").rglob("*.jpg"))) == 4


def test_a_directory_of_other_images_is_refused_and_the_same_synth_is_made_again(tmp_path: Path) -> None:
    """Into a directory of other files, or of another seed's images, synth wrote its images beside
    them and over those of the same names: a tree that was neither. The same options again (an
    interrupted run) make the same tree. More classes than images were said but never made."""
    import pytest

    from ddpipe.errors import DdpipeError, OptionError

    options = SynthOptions(n=4, classes=2, seed=3, long_side=48, progress=False)
    synth(tmp_path / "a", options)
    made = dir_bytes(tmp_path / "a")
    next((tmp_path / "a" / class_name(0)).iterdir()).unlink()  # interrupted: an image missing
    synth(tmp_path / "a", options)
    assert dir_bytes(tmp_path / "a") == made
    with pytest.raises(DdpipeError, match="holds images synth made with other options: give a new or empty"):
        synth(tmp_path / "a", SynthOptions(n=4, classes=2, seed=4, long_side=48, progress=False))
    assert dir_bytes(tmp_path / "a") == made
    (tmp_path / "theirs" / "cat").mkdir(parents=True)
    (tmp_path / "theirs" / "cat" / "1.jpg").write_bytes(b"theirs")
    with pytest.raises(DdpipeError, match="holds files synth did not write"):
        synth(tmp_path / "theirs", options)
    assert [p.name for p in (tmp_path / "theirs").rglob("*")] == ["cat", "1.jpg"]
    with pytest.raises(OptionError, match=r"classes=3 needs n=3 at least \(an image a class\), not n=2"):
        synth(tmp_path / "few", SynthOptions(n=2, classes=3, progress=False))
    assert not (tmp_path / "few").exists()

