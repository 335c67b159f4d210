"""The pipelines users would otherwise run, on the same data and transform: ``ddpipe bench --compare``.

- ``torch``: the PyTorch DataLoader over an ImageFolder of the images, PIL, ``workers`` processes;
- ``webdataset``: the webdataset library's pipeline over tar shards, PIL, ``workers`` processes;
- ``dali-file`` and ``dali-wds``: DALI's own file and webdataset readers with region-of-interest
  decoding, where DALI is installed: its CPU decoder, or its ``mixed`` (GPU) one when ``device`` is
  ``"cuda"``;
- ``torchvision``: torchvision's GPU JPEG decoder (``decode_jpeg(..., device="cuda")``, one batched
  call per batch) and its v2 transforms on the GPU, fed the tars' bytes by the webdataset library.

Every peer does the training transform of ``ddpipe.decode`` (random-resized crop, flip; uint8, or
ImageNet-normalised float32) into batches of ``batch_size``, on this rank's 1/world of the data.
The inputs come from the dataset itself: its images written out once as an ImageFolder, and its
own tars when it is a webdataset (else tars written once beside the images).
"""

from __future__ import annotations

import io
import itertools
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..dataset import Dataset
from ..decode.spec import IMAGENET_MEAN, IMAGENET_STD, image_field, random_resized_crop
from ..sample import label_of

PEERS = ("torch", "webdataset", "dali-file", "dali-wds", "torchvision")
PEER_NAMES = {"torch": "PyTorch DataLoader + PIL (image files)", "webdataset": "webdataset library + PIL (tars)",
              "dali-file": "DALI file reader", "dali-wds": "DALI webdataset reader",
              "torchvision": "torchvision decode_jpeg on the GPU (tars)"}
GPU_PEERS = ("dali-file", "dali-wds", "torchvision")  # peers that decode on the GPU when device is "cuda"


@dataclass(frozen=True)
class PeerOptions:
    batch_size: int = 256
    size: int = 224
    dtype: str = "uint8"  # or "float32", ImageNet-normalised ("float16" too, for DALI's readers)
    workers: int = 1  # processes (PIL peers) or threads (DALI)
    rank: int = 0
    world: int = 1
    cold: bool = False  # evict the inputs before the timed epoch, instead of a warm-up epoch
    seed: int = 0
    device: str = "cpu"  # "cuda": DALI decodes with its mixed (GPU) decoder, outputs on the GPU
    channels_last: bool = False  # DALI's readers only: HWC batches (NHWC memory), as a channels-last model takes


@dataclass(frozen=True)
class PeerInputs:
    images: Path  # an ImageFolder: <class>/<key>.<ext>
    tars: list[Path]  # webdataset shards, each with DALI's .idx beside it


def peer_inputs(dataset: Dataset, scratch: Path) -> PeerInputs:
    """Write the dataset's images as an ImageFolder under ``scratch`` once (and tars, unless the
    dataset is a webdataset); later calls reuse them."""
    images = scratch / "images"
    wds_root = dataset.root if dataset.manifest.format == "wds" else scratch / "wds"
    done = scratch / ".complete"
    if not done.exists():
        from ..convert.writer import write_dataset

        scratch.mkdir(parents=True, exist_ok=True)
        for sample in dataset:
            field = image_field(sample)
            if field is None:
                continue
            folder = images / f"{max(label_of(sample), 0):05d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', str(sample['__key__']))}.{field}").write_bytes(sample[field])
        if wds_root != dataset.root:
            import shutil

            shutil.rmtree(wds_root, ignore_errors=True)
            write_dataset(wds_root, iter(dataset), format="wds", samples_per_shard=1000)
        done.write_text("ok\n")
    return PeerInputs(images, sorted(wds_root.glob("*.tar")))


def input_files(inputs: PeerInputs) -> list[Path]:
    return [*inputs.images.rglob("*.*"), *inputs.tars]


# ---- the PIL peers' transform: torchvision's RandomResizedCrop + flip (+ ToTensor, Normalize) ---------

def pil_transform(img: Any, size: int, dtype: str) -> np.ndarray:
    """torchvision's training transform in plain PIL and numpy (torchvision has no CPU build here)."""
    from PIL import Image

    rng = np.random.default_rng(random.getrandbits(32))
    img = img.convert("RGB")
    left, top, w, h = random_resized_crop(img.size[0], img.size[1], (0.08, 1.0), (3 / 4, 4 / 3), rng)
    img = img.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    x = np.asarray(img)
    if dtype == "uint8":
        return np.ascontiguousarray(x.transpose(2, 0, 1))
    mean, std = np.array(IMAGENET_MEAN, np.float32) * 255, np.array(IMAGENET_STD, np.float32) * 255
    return ((x.astype(np.float32) - mean) / std).transpose(2, 0, 1)


class ImageFolderDataset:
    """A map-style dataset of image files, as torchvision's ImageFolder."""

    def __init__(self, root: Path, size: int, dtype: str) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.items = [(p, i) for i, c in enumerate(classes) for p in sorted((root / c).iterdir())]
        self.size, self.dtype = size, dtype

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as img:
            return pil_transform(img, self.size, self.dtype), label


class _WdsSample:
    """webdataset's map function (a class, so that worker processes can pickle it)."""

    def __init__(self, size: int, dtype: str) -> None:
        self.size, self.dtype = size, dtype

    def __call__(self, s: dict[str, Any]) -> tuple[np.ndarray, int]:
        from PIL import Image

        field = next(f for f in ("jpg", "jpeg", "png", "webp") if f in s)
        with Image.open(io.BytesIO(s[field])) as img:
            return pil_transform(img, self.size, self.dtype), int(s.get("cls", b"0"))


class _EveryNth:
    def __init__(self, first: int, step: int) -> None:
        self.first, self.step = first, step

    def __call__(self, samples: Iterable[Any]) -> Iterable[Any]:
        return itertools.islice(samples, self.first, None, self.step)


def _torch_loader(inputs: PeerInputs, o: PeerOptions) -> Callable[[], Iterable[Any]]:
    import torch

    data = ImageFolderDataset(inputs.images, o.size, o.dtype)
    mine = list(range(o.rank, len(data), o.world))
    loader: Any = torch.utils.data.DataLoader(cast(Any, data), batch_size=o.batch_size, num_workers=o.workers,
                                         sampler=torch.utils.data.SubsetRandomSampler(mine),
                                         persistent_workers=o.workers > 0)
    return lambda: (x for x, _ in loader)


def _webdataset_loader(inputs: PeerInputs, o: PeerOptions) -> Callable[[], Iterable[Any]]:
    import webdataset as wds

    if len(inputs.tars) >= o.world:  # whole shards per rank, as webdataset's split_by_node
        urls, every = [str(p) for p in inputs.tars[o.rank :: o.world]], None
    else:  # fewer shards than ranks: each reads them all and keeps every world-th sample
        urls, every = [str(p) for p in inputs.tars], o
    workers = max(0, min(o.workers, len(urls)))
    pipeline = wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=lambda src: src,
                              workersplitter=wds.split_by_worker, empty_check=False)
    if every is not None:
        pipeline = pipeline.compose(_EveryNth(every.rank, every.world))
    pipeline = pipeline.shuffle(1000).map(_WdsSample(o.size, o.dtype)).batched(o.batch_size)
    loader = wds.WebLoader(pipeline, batch_size=None, num_workers=workers, persistent_workers=workers > 0)
    return lambda: (x for x, _ in loader)


def _dali_loader(kind: str, inputs: PeerInputs, o: PeerOptions) -> Callable[[], Iterable[Any]]:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    gpu = o.device == "cuda"

    @pipeline_def(batch_size=o.batch_size, num_threads=o.workers, device_id=0 if gpu else None, seed=o.seed + 1,
                  prefetch_queue_depth=2)
    def pipe():  # type: ignore[no-untyped-def]
        shard: dict[str, Any] = {"shard_id": o.rank, "num_shards": o.world, "random_shuffle": True, "name": "r"}
        read: Any
        if kind == "dali-file":
            read = fn.readers.file(file_root=str(inputs.images), **shard)
        else:
            urls = [str(p) for p in inputs.tars]
            read = fn.readers.webdataset(paths=urls, index_paths=[u[:-4] + ".idx" for u in urls], ext=["jpg", "cls"],
                                         **shard)
        img: Any = fn.decoders.image_random_crop(read[0], device="mixed" if gpu else "cpu", output_type=types.RGB,
                                                 random_area=[0.08, 1.0], random_aspect_ratio=[0.75, 4 / 3],
                                                 num_attempts=10)
        img = fn.resize(img, resize_x=o.size, resize_y=o.size)
        norm: dict[str, Any] = {} if o.dtype == "uint8" else {"mean": [m * 255 for m in IMAGENET_MEAN],
                                                              "std": [s * 255 for s in IMAGENET_STD]}
        out_type = {"uint8": types.UINT8, "float16": types.FLOAT16}.get(o.dtype, types.FLOAT)
        img = fn.crop_mirror_normalize(img, dtype=out_type, output_layout="HWC" if o.channels_last else "CHW",
                                       mirror=fn.random.coin_flip(), **norm)
        return img  # the webdataset reader's cls bytes are variable-length: they cannot leave as a tensor

    p = pipe()
    p.build()
    # not a batch decoded before the caller asks: a cold epoch's clock would miss it
    it = DALIGenericIterator(p, ["images"], reader_name="r", last_batch_policy=LastBatchPolicy.PARTIAL,
                             auto_reset=True, prepare_first_batch=False)
    return lambda: (b[0]["images"] for b in it)


class _RawSample:
    """(jpeg bytes, label) of a webdataset sample, undecoded (a class, so that workers can pickle it)."""

    def __call__(self, s: dict[str, Any]) -> tuple[bytes, int]:
        field = next(f for f in ("jpg", "jpeg") if f in s)
        return s[field], int(s.get("cls", b"0"))


def _collate_raw(batch: list[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
    return batch


def _torchvision_loader(inputs: PeerInputs, o: PeerOptions) -> Callable[[], Iterable[Any]]:
    """torchvision on the GPU as its documentation shows it: batched ``decode_jpeg`` on the device,
    then ``RandomResizedCrop`` and the flip per image, then normalisation of the stacked batch."""
    import torch
    import torchvision
    import webdataset as wds
    from torchvision.transforms import v2

    device = torch.device(o.device if o.device != "cpu" else "cuda")
    urls = [str(p) for p in inputs.tars[o.rank :: o.world]] or [str(p) for p in inputs.tars]
    workers = max(0, min(o.workers, len(urls), 4))  # the workers only read bytes: a few suffice
    pipeline = wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=lambda src: src,
                              workersplitter=wds.split_by_worker, empty_check=False).shuffle(1000).map(_RawSample())
    loader: Any = torch.utils.data.DataLoader(pipeline, batch_size=o.batch_size, num_workers=workers,
                                              collate_fn=_collate_raw, persistent_workers=workers > 0)
    crop = v2.Compose([v2.RandomResizedCrop(o.size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), antialias=True),
                       v2.RandomHorizontalFlip()])
    mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255

    def batches() -> Iterable[Any]:
        for batch in loader:
            encoded = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data, _ in batch]
            decoded = torchvision.io.decode_jpeg(encoded, mode=torchvision.io.ImageReadMode.RGB, device=device)
            images = torch.stack([crop(img) for img in decoded])
            yield images if o.dtype == "uint8" else (images.float() - mean) / std

    return batches


def make_peer(name: str, inputs: PeerInputs, options: PeerOptions) -> Callable[[], Iterable[Any]]:
    """A function that runs one epoch of the peer, yielding its image batches."""
    if name == "torch":
        return _torch_loader(inputs, options)
    if name == "webdataset":
        return _webdataset_loader(inputs, options)
    if name in ("dali-file", "dali-wds"):
        return _dali_loader(name, inputs, options)
    if name == "torchvision":
        return _torchvision_loader(inputs, options)
    raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PEERS)}")


def available_peers() -> list[str]:
    from ..optional import installed as have

    out = ["torch"] if have("torch") else []
    out += ["webdataset"] if have("webdataset") else []
    out += ["dali-file", "dali-wds"] if have("nvidia.dali") else []
    if have("torchvision") and have("webdataset"):
        import torch

        out += ["torchvision"] if torch.cuda.is_available() else []
    return out
