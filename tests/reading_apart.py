"""What the tests of reading in a process of its own (``read_in="process"``) share: rendered images,
a loader on the dali-gpu path's decoder run on DALI's CPU operators, an epoch's batches and their
comparison, and the reading processes and mappings this process has."""

from __future__ import annotations

import os
from pathlib import Path

import torch

import ddpipe
from ddpipe.synth import encode_jpeg, render_image

BATCH = 8


def natural_samples(n: int, bad: dict[int, bytes] | None = None) -> list[dict[str, object]]:
    bad = bad or {}
    return [{"__key__": f"n/{i:03d}", "jpg": bad.get(i) or encode_jpeg(render_image(i, seed=7, long_side=96)),
             "cls": b"%d" % (i % 3)} for i in range(n)]


def gpu_path(loader: ddpipe.Loader) -> ddpipe.Loader:
    """The loader with the dali-gpu path's decoder (its transform in DALI, its batches prepared on the
    feed's thread), run on DALI's CPU operators."""
    from ddpipe.decode.dali import DaliDecoder

    options = loader.decoding.options
    loader.decoding._decoder = DaliDecoder(options, BATCH, torch.device("cpu"), gpu_decode=False,
                                           transform_in_dali=True)
    return loader


def make(root: Path, read_in: str, gpu: bool = True, **kw: object) -> ddpipe.Loader:
    options: dict[str, object] = {"decoder": "dali-cpu", "device": "cpu", "shuffle": "local", "size": 32,
                                  "resize_shorter": 40, "dtype": "uint8", "threads": 1, "seed": 5, **kw}
    loader = ddpipe.Loader(root, BATCH, read_in=read_in, **options)  # type: ignore[arg-type]
    return gpu_path(loader) if gpu else loader


Batches = list[tuple[torch.Tensor, torch.Tensor]]


def epoch_of(loader: ddpipe.Loader, epoch: int, stop_after: int | None = None) -> Batches:
    loader.set_epoch(epoch)
    out = []
    for x, y in loader:
        out.append((x.clone(), y.clone()))
        if stop_after is not None and len(out) == stop_after:
            break
    return out


def same(a: Batches, b: Batches) -> bool:
    pairs = zip(a, b, strict=False)
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in pairs)


def reading_process(loader: ddpipe.Loader) -> int:
    reader = loader.decoding._reader
    assert reader is not None and reader._proc is not None
    return reader._proc.pid


def mapped_here(root: Path) -> set[str]:
    """The files under ``root`` this process maps."""
    with open("/proc/self/maps") as maps:
        return {line.split(maxsplit=5)[5].strip() for line in maps
                if len(line.split(maxsplit=5)) == 6 and line.split(maxsplit=5)[5].startswith(str(root))}


def reading_processes() -> list[int]:
    """This process's reading processes still running."""
    mine = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields.get("PPid", "0")) == os.getpid() and b"ddpipe.read_server" in cmdline:
            mine.append(int(status.parent.name))
    return mine


def write_images(root: Path) -> Path:
    """60 rendered images of 3 classes, 16 a shard."""
    ddpipe.write_dataset(root, iter(natural_samples(60)), samples_per_shard=16, classes=["a", "b", "c"])
    return root
