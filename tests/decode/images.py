"""What the decoding tests share: solid images whose colour is their label, and a Loader of small
batches on the CPU with a decoder named."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import ddpipe
from ddpipe.decode import DecodeOptions
from ddpipe.sample import Sample

COLORS = [(230, 20, 20), (20, 230, 20), (20, 20, 230), (230, 230, 20), (20, 230, 230), (230, 20, 230)]
DECODERS = ["dali-cpu", "pil"]


def solid_jpeg(color: tuple[int, int, int], size: tuple[int, int], mode: str = "RGB", fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    img = Image.new("RGB", size, color)
    if mode != "RGB":
        img = img.convert(mode)
    img.save(buf, format=fmt, quality=95)
    return buf.getvalue()


def labelled_samples(n: int, rng: np.random.Generator) -> list[Sample]:
    """Sample i is a solid image of its class's colour: its label can be read back from its pixels."""
    out = []
    for i in range(n):
        c = int(rng.integers(len(COLORS)))
        size = (int(rng.integers(60, 200)), int(rng.integers(60, 200)))
        out.append({"__key__": f"img/{i:04d}", "jpg": solid_jpeg(COLORS[c], size), "cls": b"%d" % c})
    return out


def loader(root: Path, decode: str, **kw: object) -> ddpipe.Loader:
    opts = DecodeOptions(size=kw.pop("size", 32), resize_shorter=kw.pop("resize_shorter", 40),  # type: ignore[arg-type]
                         dtype=kw.pop("dtype", "uint8"), train=kw.pop("train", True),  # type: ignore[arg-type]
                         channels_last=kw.pop("channels_last", False), threads=2)  # type: ignore[arg-type]
    kw = {"device": "cpu", "shuffle": "local", "seed": 3, **kw}
    return ddpipe.Loader(root, 8, decoder=decode, decode=opts, **kw)  # type: ignore[arg-type]


def corrupt_dataset(root: Path) -> Path:
    samples = labelled_samples(20, np.random.default_rng(1))
    samples[5]["jpg"] = samples[5]["jpg"][: len(samples[5]["jpg"]) // 2]  # truncated
    samples[13]["jpg"] = b"definitely not a jpeg"
    ddpipe.write_dataset(root, iter(samples), samples_per_shard=8)
    return root


def fewer_names_than_labels(root: Path, names: int) -> tuple[Path, set[str]]:
    """20 images of classes 0-5 under a manifest that names only the first ``names`` classes and records
    no label runs (which it would refuse): the keys of the samples whose class has no name."""
    samples = labelled_samples(20, np.random.default_rng(1))
    ddpipe.write_dataset(root, iter(samples), samples_per_shard=8)
    doc = json.loads((root / "index.json").read_text())
    doc["classes"] = [str(c) for c in range(names)]
    for shard in doc["shards"]:
        del shard["labels"]
    (root / "index.json").write_text(json.dumps(doc))
    return root, {str(s["__key__"]) for s in samples if int(s["cls"]) >= names}


def stops_dali(root: Path) -> Path:
    """20 images, of which img/0006's header reads but its data stops right after it."""
    samples = labelled_samples(20, np.random.default_rng(1))
    data = samples[6]["jpg"]
    scan = data.index(b"\xff\xda")
    samples[6]["jpg"] = data[: scan + 2 + int.from_bytes(data[scan + 2 : scan + 4], "big") + 16]
    ddpipe.write_dataset(root, iter(samples), samples_per_shard=8)
    return root


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (CI has none; run on the device machine)")
