"""Without DALI installed (an import hook hides it, as in an environment without the ``dali`` extra),
the default decoder is PIL, said once, in the Loader and in ``ddpipe train`` alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ddpipe

SCRIPT = """
import importlib.abc, sys

class NoNvidia(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "nvidia" or name.startswith("nvidia."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoNvidia())
import ddpipe
from ddpipe.cli import main

root = sys.argv[1]
for _ in range(2):  # two loaders: one line
    loader = ddpipe.Loader(root, 4, decode=ddpipe.DecodeOptions(size=24, resize_shorter=28), shuffle="none")
    images, labels = next(iter(loader))
    print("decoded", loader.decoding.decoder, tuple(images.shape), flush=True)
    loader.close()
code = main(["train", root, "--model", "smallcnn", "--batch-size", "4", "--image-size", "24", "--log-every", "0"])
print("train exit", code, "dali imported:", "nvidia.dali" in sys.modules, flush=True)
"""


def test_auto_decoding_without_dali_is_pil_said_once(raw_images: Path, tmp_path: Path) -> None:
    data = tmp_path / "wds"
    ddpipe.convert(raw_images, data, ddpipe.ConvertOptions(samples_per_shard=8, progress=False))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(data)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("decoded pil (4, 3, 24, 24)") == 2, proc.stdout
    assert "train exit 0 dali imported: False" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.count("NVIDIA DALI is not installed") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
