"""The public API is what the README says it is, and the user guide's loading example and training
script run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ddpipe

from .decode.images import labelled_samples

README = Path(__file__).resolve().parents[1] / "README.md"
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}\n")
    return text[start : text.index("\n## ", start + 1)]


def test_readme_lists_exactly_the_exported_names() -> None:
    import ddpipe.distributed

    groups = {}
    for group in ("runtime", "tools", "errors"):
        bullet = re.search(rf"^- \*\*{group}\*\*:(.*?)(?=^- \*\*|^\S|\Z)", section("Public API"), re.S | re.M)
        assert bullet is not None, group
        text, _, distributed = bullet.group(1).partition("the module `ddpipe.distributed`")
        for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", distributed):
            assert name in ddpipe.distributed.__all__, name
        groups[group] = {n for n in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", text)
                         if hasattr(ddpipe, n) or n[0].isupper()}
        groups[group] -= {"ValueError", "FileNotFoundError", "FileExistsError", "OSError"}  # built-ins, in passing
    listed = set().union(*groups.values())
    assert listed == set(ddpipe.__all__), (listed ^ set(ddpipe.__all__))
    assert sum(len(g) for g in groups.values()) == len(listed)  # each name in one group
    assert all(hasattr(ddpipe, n) for n in ddpipe.__all__)


def test_importing_ddpipe_loads_no_torch() -> None:
    code = "import sys, ddpipe; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_iterating_an_encoded_stream_loads_no_torch(tmp_path: Path) -> None:
    """The seam: which bytes, in which order, needs nothing of decoding's."""
    data = tmp_path / "wds"
    ddpipe.write_dataset(data, iter(labelled_samples(12, np.random.default_rng(0))), samples_per_shard=4)
    code = (f"import sys, ddpipe; n = sum(len(b) for b in ddpipe.EncodedStream({str(data)!r}, 4)); "
            "print(n, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "12 False\n"


def test_the_guides_stream_example_runs(tmp_path: Path) -> None:
    data = tmp_path / "wds"
    ddpipe.write_dataset(data, iter(labelled_samples(12, np.random.default_rng(0))), samples_per_shard=4)
    example = re.search(r"For the bytes alone.*?```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert example is not None
    code = example.group(1).replace('"demo-data/wds"', repr(str(data))).replace(", 256,", ", 4,")
    code += "    seen.extend(s['__key__'] for s in batch.samples)\n"
    scope: dict[str, object] = {"ddpipe": ddpipe}
    exec("seen = []\n" + code, scope)
    assert sorted(scope["seen"]) == sorted(f"img/{i:04d}" for i in range(12))  # type: ignore[call-overload]


def test_the_guides_loading_example_runs(tmp_path: Path) -> None:
    data = tmp_path / "wds"
    ddpipe.write_dataset(data, iter(labelled_samples(24, np.random.default_rng(0))), samples_per_shard=8)
    example = re.search(r"## Loading in a training job\n\n```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert example is not None
    code = (example.group(1).replace('"demo-data/wds"', repr(str(data)))
            .replace('"/local/ssd"', repr(str(tmp_path / "stage"))).replace("range(90)", "range(2)")
            .replace("batch_size=256", "batch_size=8").replace("size=224", "size=32, resize_shorter=32")
            .replace('decoder="auto"', 'decoder="dali-cpu", threads=1'))
    code += "\nassert images.shape == (8, 3, 32, 32) and state['epoch'] == 1\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_guides_training_script_runs(tmp_path: Path) -> None:
    data = tmp_path / "train"
    ddpipe.write_dataset(data, iter(labelled_samples(24, np.random.default_rng(0))), samples_per_shard=8,
                         classes=[str(c) for c in range(6)])
    script = re.search(r"## Your training script\n.*?```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert script is not None
    code = (script.group(1).replace('"data/train"', repr(str(data)))
            .replace('"/local/ssd"', repr(str(tmp_path / "s"))).replace('"resnet50"', '"smallcnn"')
            .replace("range(90)", "range(2)").replace("batch_size=256", "batch_size=8")
            .replace('"ckpt.pt"', repr(str(tmp_path / "ckpt.pt"))))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ckpt.pt").exists()


def test_the_readme_is_a_front_door_not_a_notebook() -> None:
    """Pitch, install, a short example, launchers, features, the headline ratios, links: under 300
    lines, the long story in docs/ (and every figure generated: benchmarks/report.py --check)."""
    text = README.read_text()
    assert len(text.splitlines()) < 300
    headings = re.findall(r"^## (.+)$", text, re.M)
    for wanted in ("Install", "Quick start", "Your training script, under any launcher", "Features", "At a glance"):
        assert wanted in headings, headings
    for page in ("docs/guide.md", "docs/architecture.md", "docs/benchmarks.md", "CONTRIBUTING.md"):
        assert f"({page})" in text and (README.parent / page).exists(), page


def test_every_options_object_refuses_a_bad_value_on_construction_naming_the_field(tmp_path: Path) -> None:
    """One error type for every way of configuring: ``OptionError`` (a ``ValueError``), raised when
    the options object is made, naming the field."""
    bad: dict[type, list[tuple[dict[str, object], str]]] = {
        ddpipe.PlanOptions: [({"shuffle": "zzz"}, "shuffle"), ({"exchange_fraction": 2.0}, "exchange_fraction"),
                             ({"shard_assignment": "x"}, "shard_assignment"), ({"batch_size": 0}, "batch_size")],
        ddpipe.ReadOptions: [({"prefetch": 0}, "prefetch")],
        ddpipe.DecodeOptions: [({"decoder": "x"}, "decode"), ({"size": 0}, "size"), ({"dtype": "int7"}, "dtype"),
                               ({"on_error": "ignore"}, "on_error")],
        ddpipe.StageOptions: [({"stage_dir": tmp_path, "capacity": -1}, "capacity"),
                              ({"stage_dir": tmp_path, "wait_timeout": 0}, "wait_timeout")],
        ddpipe.ConvertOptions: [({"format": "zip"}, "format"), ({"on_error": "maybe"}, "on_error")],
        ddpipe.StorageOptions: [({"endpoint": "minio:9000"}, "endpoint"), ({"concurrency": 0}, "concurrency"),
                                ({"chunk_bytes": 10}, "chunk_bytes"), ({"max_retries": -1}, "max_retries")],
    }
    options_types = {getattr(ddpipe, n) for n in ddpipe.__all__ if n.endswith("Options")}
    assert options_types == set(bad)  # every exported options object is covered
    for cls, cases in bad.items():
        for kwargs, field in cases:
            with pytest.raises(ddpipe.OptionError, match=field):
                cls(**kwargs)
