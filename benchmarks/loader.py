"""Images per second into training, against the tools users would otherwise use, in one run.

    python benchmarks/loader.py [--n 3000] [--repeats 3] [--only NAME ...]

Every pipeline does the same training transform (random-resized crop to 224x224, scale 0.08-1,
ratio 3/4-4/3, horizontal flip, ImageNet normalisation to float32 NCHW; or uint8 where named) in
batches of 256, on the same synth ImageNet-like JPEGs, on the same cores. Each runs in a process
of its own (its peak resident memory, with its workers', is reported) for two epochs; the second
is timed. References in the same run: the raw decode limit (simplejpeg full decode of the images
in memory, per core, times the cores), the PyTorch DataLoader over the ImageFolder with PIL,
the webdataset library's pipeline over the same tars, and DALI's own file and webdataset readers.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _common import DATA, machine, median, save, synth_images, synth_shards, table

BATCH, SIZE = 256, 224
CORES = os.cpu_count() or 1
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255


def peak_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


def timed_epochs(batches_of_epoch) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """Run two epochs, time the second: (images, seconds)."""
    for _ in batches_of_epoch():
        pass
    t0, n = time.perf_counter(), 0
    for b in batches_of_epoch():
        n += len(b)
    return n, time.perf_counter() - t0


# ---- the peers -------------------------------------------------------------------------------

def torch_transform(img):  # type: ignore[no-untyped-def]
    """torchvision's RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize, in plain PIL/numpy
    (torchvision has no CPU build on this machine)."""
    from PIL import Image

    from ddpipe.decode.spec import random_resized_crop

    rng = np.random.default_rng(random.getrandbits(32))
    img = img.convert("RGB")
    left, top, w, h = random_resized_crop(img.size[0], img.size[1], (0.08, 1.0), (3 / 4, 4 / 3), rng)
    img = img.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    x = (np.asarray(img, dtype=np.float32) - MEAN) / STD
    return x.transpose(2, 0, 1)


class ImageFolderDataset:
    def __init__(self, root: Path) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.items = [(p, i) for i, c in enumerate(classes) for p in sorted((root / c).iterdir())]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        from PIL import Image

        path, label = self.items[i]
        with Image.open(path) as img:
            return torch_transform(img), label


def run_torch_dataloader(images: Path) -> tuple[int, float]:
    import torch

    loader = torch.utils.data.DataLoader(ImageFolderDataset(images), batch_size=BATCH, shuffle=True,
                                         num_workers=CORES, persistent_workers=True)
    return timed_epochs(lambda: (x for x, _ in loader))


def run_webdataset(shards: Path) -> tuple[int, float]:
    import webdataset as wds

    urls = [str(p) for p in sorted(shards.glob("*.tar"))]

    def sample(s):  # type: ignore[no-untyped-def]
        from PIL import Image

        with Image.open(io.BytesIO(s["jpg"])) as img:
            return torch_transform(img), int(s["cls"])

    pipeline = wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node,
                              workersplitter=wds.split_by_worker).shuffle(1000).map(sample).batched(BATCH)
    loader = wds.WebLoader(pipeline, batch_size=None, num_workers=CORES, persistent_workers=True)
    return timed_epochs(lambda: (x for x, _ in loader))


def run_dali_reader(kind: str, images: Path, shards: Path, uint8: bool = False) -> tuple[int, float]:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=BATCH, num_threads=CORES, device_id=None, seed=1, prefetch_queue_depth=2)
    def pipe():  # type: ignore[no-untyped-def]
        if kind == "file":
            jpg, _ = fn.readers.file(file_root=str(images), random_shuffle=True, name="r")
        else:
            urls = [str(p) for p in sorted(shards.glob("*.tar"))]
            jpg, _ = fn.readers.webdataset(paths=urls, index_paths=[u[:-4] + ".idx" for u in urls],
                                               ext=["jpg", "cls"], random_shuffle=True, name="r")
        img = fn.decoders.image_random_crop(jpg, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                                            random_aspect_ratio=[0.75, 4 / 3], num_attempts=10)
        img = fn.resize(img, resize_x=SIZE, resize_y=SIZE)
        norm = {} if uint8 else {"mean": MEAN.tolist(), "std": STD.tolist()}
        img = fn.crop_mirror_normalize(img, dtype=types.UINT8 if uint8 else types.FLOAT, output_layout="CHW",
                                       mirror=fn.random.coin_flip(), **norm)
        return img  # the webdataset reader's cls bytes are variable-length: they cannot leave as a tensor

    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    p = pipe()
    p.build()
    it = DALIGenericIterator(p, ["images"], reader_name="r", last_batch_policy=LastBatchPolicy.PARTIAL,
                             auto_reset=True)
    return timed_epochs(lambda: (b[0]["images"] for b in it))


def run_ddpipe(root: Path, shuffle: str, decode: str, dtype: str, antialias: bool = True) -> tuple[int, float]:
    import ddpipe
    from ddpipe.decode import DecodeOptions

    loader = ddpipe.Loader(root, BATCH, decode=decode, device="cpu", shuffle=shuffle, exchange_fraction=0.3,
                           decode_options=DecodeOptions(dtype=dtype, antialias=antialias))
    epoch = [0]

    def batches():  # type: ignore[no-untyped-def]
        loader.set_epoch(epoch[0])
        epoch[0] += 1
        return (x for x, _ in loader)

    n, seconds = timed_epochs(batches)
    seconds = max(loader.comm.allgather(seconds))
    return sum(loader.comm.allgather(n)), seconds


def raw_decode(images: Path) -> tuple[int, float]:
    """simplejpeg full decode of images held in memory, on one core."""
    import simplejpeg

    datas = [p.read_bytes() for p in sorted(images.rglob("*.jpg"))[:400]]
    for d in datas[:20]:
        simplejpeg.decode_jpeg(d)
    t0 = time.perf_counter()
    for d in datas:
        simplejpeg.decode_jpeg(d)
    return len(datas), time.perf_counter() - t0


# ---- the harness ------------------------------------------------------------------------------

def runs(images: Path, data: Path) -> dict[str, tuple[int, list[str]]]:
    """name -> (ranks, arguments of --run)."""
    out: dict[str, tuple[int, list[str]]] = {
        "raw decode limit (simplejpeg, per core x cores)": (1, ["raw"]),
        "PyTorch DataLoader + PIL (ImageFolder)": (1, ["torch"]),
        "webdataset library + PIL (same tars)": (1, ["wds"]),
        "DALI file reader": (1, ["dali-file"]),
        "DALI webdataset reader": (1, ["dali-wds"]),
        "DALI webdataset reader, uint8": (1, ["dali-wds-u8"]),
    }
    for fmt in ("wds", "hdf5", "lmdb"):
        out[f"ddpipe {fmt}, dali-cpu, none"] = (1, ["ddpipe", str(data / fmt), "none", "dali-cpu", "float32"])
    out["ddpipe wds, dali-cpu, none, uint8"] = (1, ["ddpipe", str(data / "wds"), "none", "dali-cpu", "uint8"])
    out["ddpipe wds, dali-cpu, none, uint8, no antialias"] = (1, ["ddpipe", str(data / "wds"), "none", "dali-cpu",
                                                                  "uint8", "noaa"])
    out["ddpipe wds, pil, none"] = (1, ["ddpipe", str(data / "wds"), "none", "pil", "float32"])
    out["ddpipe wds, dali-cpu, partial, 2 ranks"] = (2, ["ddpipe", str(data / "wds"), "partial", "dali-cpu", "float32"])
    out["ddpipe wds, dali-cpu, partial, 2 ranks, uint8"] = (2, ["ddpipe", str(data / "wds"), "partial", "dali-cpu",
                                                                "uint8"])
    return out


def child(args: list[str], images: Path, data: Path, out: Path) -> None:
    kind = args[0]
    if kind == "raw":
        n, s = raw_decode(images)
        n, s = n * CORES, s  # the limit for the cores every pipeline here may use
    elif kind == "torch":
        n, s = run_torch_dataloader(images)
    elif kind == "wds":
        n, s = run_webdataset(data / "wds")
    elif kind.startswith("dali-"):
        n, s = run_dali_reader("file" if kind == "dali-file" else "wds", images, data / "wds", kind.endswith("u8"))
    else:
        n, s = run_ddpipe(Path(args[1]), args[2], args[3], args[4], antialias=args[5:] != ["noaa"])
    if os.environ.get("PMI_RANK", "0") == "0":
        out.write_text(json.dumps({"images": n, "seconds": s, "peak_mb": peak_mb()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--run", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    images = synth_images(args.n)
    data = DATA / f"loader-{args.n}"
    if args.run:
        child(args.run, images, data, Path(args.out))
        return
    for fmt in ("wds", "hdf5", "lmdb"):
        synth_shards(args.n, "loader", fmt, shard_bytes=32_000_000, seed=0)
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    results: dict[str, list[dict[str, float]]] = {}
    todo = runs(images, data)
    # the raw limit is every ratio's reference: always measured
    names = [n for n in todo if args.only is None or n.startswith("raw") or any(o in n for o in args.only)]
    for rep in range(args.repeats):
        for name in names if rep % 2 == 0 else reversed(names):  # alternate the order: drift hits all alike
            ranks, run_args = todo[name]
            out = DATA / "loader-run.json"
            out.unlink(missing_ok=True)
            cmd = [sys.executable, __file__, "--n", str(args.n), "--out", str(out), "--run", *run_args]
            if ranks > 1:
                cmd = [mpiexec, "-n", str(ranks), *cmd]
            subprocess.run(cmd, check=True, timeout=1200, stdout=subprocess.DEVNULL)
            results.setdefault(name, []).append(json.loads(out.read_text()))
            print(f"  {name}: {results[name][-1]['images'] / results[name][-1]['seconds']:.0f} img/s", file=sys.stderr)
    rows = []
    for name in names:
        rate = median([r["images"] / r["seconds"] for r in results[name]])
        rows.append({"pipeline": name, "img_s": rate, "peak_mb": median([r["peak_mb"] for r in results[name]])})
    raw = next(r["img_s"] for r in rows if r["pipeline"].startswith("raw"))
    peers = [r["img_s"] for r in rows if not r["pipeline"].startswith(("raw", "ddpipe"))]
    best = max(peers) if peers else math.nan  # no peer measured (--only): ratios to it are NaN
    for r in rows:
        r["vs_best_peer"], r["vs_raw"] = r["img_s"] / best, r["img_s"] / raw
        if r["pipeline"].startswith("raw"):
            r["peak_mb"] = None
    cols = [("pipeline", "pipeline", "s"), ("img_s", "img/s", ".0f"), ("vs_best_peer", "/ best peer", ".2f"),
            ("vs_raw", "/ raw limit", ".2f"), ("peak_mb", "peak MB", ".0f")]
    text = table(rows, cols)
    command = f"python benchmarks/loader.py --n {args.n} --repeats {args.repeats}"
    path = save("loader", {"benchmark": "loader", "command": command, "machine": machine(), "batch": BATCH,
                           "size": SIZE, "rows": rows, "runs": results, "table": text})
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
