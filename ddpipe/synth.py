"""``ddpipe synth``: an ImageNet-like ImageFolder of real JPEGs, generated from a seed.

Each image is about 500x375 (aspect ratios as in photo collections), built like a photograph:
a 1/f (pink-noise) luminance field, the spectrum of natural scenes, coloured by a per-class
palette; a few objects with hard edges and their own texture; film-like grain. Saved at JPEG
quality 90 this lands near ImageNet's ~110 KB per image, so decoding costs what ImageNet's does.
Image ``i`` depends only on ``(seed, i)``: any subset regenerates identically, in any order.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from .errors import DdpipeError, OptionError
from .fields import seed_option
from .formats.atomic import atomic_write_bytes
from .seeding import derive_rng
from .workers import bind_to_parent, end_if_importing_parents_script, ended_as_they_started, worker_context

# (width / height, weight): landscape 4:3 dominates photo collections, then portrait and others
_ASPECTS = ((4 / 3, 0.55), (3 / 4, 0.15), (3 / 2, 0.1), (1.0, 0.1), (16 / 9, 0.05), (2 / 3, 0.05))


@dataclass(frozen=True)
class SynthOptions:
    n: int = 1000
    classes: int = 10
    seed: int = 0
    quality: int = 90
    long_side: int = 500
    workers: int = 1
    progress: bool = True


def class_name(c: int) -> str:
    return f"class_{c:04d}"


def class_of(index: int, classes: int) -> int:
    """Images are dealt to classes in turn, so every class gets n / classes of them."""
    return index % classes


def _pink(rng: np.random.Generator, h: int, w: int, beta: float) -> np.ndarray:
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    spectrum = (rng.standard_normal((h, w // 2 + 1)) + 1j * rng.standard_normal((h, w // 2 + 1))) / f ** (beta / 2)
    spectrum[0, 0] = 0
    field = np.fft.irfft2(spectrum, s=(h, w))
    field /= field.std() + 1e-9
    return field.astype(np.float32)


def _palette(c: int) -> np.ndarray:
    # a distinct, stable base colour per class (golden-angle hues)
    hue = (c * 0.618033988749895) % 1.0
    angles = 2 * np.pi * (hue + np.array([0.0, 1 / 3, 2 / 3]))
    return (0.5 + 0.35 * np.cos(angles)).astype(np.float32)


def render_image(index: int, *, seed: int = 0, classes: int = 10, long_side: int = 500) -> np.ndarray:
    """The RGB pixels (uint8, HxWx3) of image ``index``."""
    rng = derive_rng(seed, index)
    ratios, weights = zip(*_ASPECTS, strict=True)
    ratio = ratios[rng.choice(len(ratios), p=np.array(weights) / sum(weights))]
    side = int(long_side * rng.uniform(0.85, 1.15))
    w, h = (side, int(side / ratio)) if ratio >= 1 else (int(side * ratio), side)
    base = _palette(class_of(index, classes))
    lum = _pink(rng, h, w, beta=rng.uniform(1.6, 2.0))
    chroma = np.stack([_pink(rng, h // 4 + 1, w // 4 + 1, 2.4) for _ in range(3)], axis=-1)
    chroma = np.repeat(np.repeat(chroma, 4, axis=0), 4, axis=1)[:h, :w]
    img = base + 0.16 * lum[..., None] + 0.06 * chroma
    # objects: hard-edged shapes with their own colour and texture
    canvas = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(canvas)
    for k in range(int(rng.integers(2, 6))):
        x0, y0 = rng.uniform(0, w), rng.uniform(0, h)
        rx, ry = rng.uniform(0.05, 0.3) * w, rng.uniform(0.05, 0.3) * h
        box = (x0 - rx, y0 - ry, x0 + rx, y0 + ry)
        if rng.random() < 0.5:
            draw.ellipse(box, fill=k + 1)
        else:
            pts = [(x0 + rx * np.cos(a), y0 + ry * np.sin(a)) for a in np.sort(rng.uniform(0, 2 * np.pi, 6))]
            draw.polygon(pts, fill=k + 1)
    mask = np.asarray(canvas)
    for k in range(1, int(mask.max()) + 1):
        sel = mask == k
        colour = rng.uniform(0.1, 0.9, 3).astype(np.float32)
        texture = _pink(rng, h, w, beta=1.2)
        img[sel] = colour + 0.12 * texture[sel][:, None]
    img += rng.normal(0, 0.032, size=img.shape).astype(np.float32)  # grain
    return np.clip(img * 255, 0, 255).astype(np.uint8)


def encode_jpeg(pixels: np.ndarray, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _write_one(args: tuple[str, int, SynthOptions]) -> int:
    out, index, opt = args
    c = class_of(index, opt.classes)
    data = encode_jpeg(render_image(index, seed=opt.seed, classes=opt.classes, long_side=opt.long_side), opt.quality)
    atomic_write_bytes(Path(out) / class_name(c) / f"{class_name(c)}_{index:07d}.jpg", data)
    return len(data)


_RECORD = ".ddpipe-synth.json"  # the options that made a directory's images, written before them


def _claim(root: Path, opt: SynthOptions) -> None:
    """Refuse a directory that holds anything but this synth's own images (an earlier or interrupted
    run with the same options, as its record says): new images would mix with others, or overwrite
    those of another seed under the same names, and the tree would be neither."""
    made_by = {f.name: getattr(opt, f.name) for f in dataclasses.fields(opt) if f.name not in ("workers", "progress")}
    if root.exists() and not root.is_dir():
        raise DdpipeError("is a file, not a directory: give a new or empty directory", path=root)
    if root.is_dir() and any(root.iterdir()):
        try:
            found = json.loads((root / _RECORD).read_text())
        except (OSError, ValueError):
            found = None
        if found != made_by:
            what = "images synth made with other options" if isinstance(found, dict) else "files synth did not write"
            raise DdpipeError(f"holds {what}: give a new or empty directory", path=root)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(root / _RECORD, json.dumps(made_by).encode())


def synth(out: str | os.PathLike[str], options: SynthOptions | None = None) -> int:
    """Write ``options.n`` JPEGs as ``out/class_XXXX/class_XXXX_NNNNNNN.jpg``; return total bytes."""
    end_if_importing_parents_script()  # a worker spawned by an earlier synth() of an unguarded script
    opt = options or SynthOptions()
    if opt.n < 1 or opt.classes < 1:
        raise OptionError("n and classes must be at least 1")
    if opt.classes > opt.n:  # the classes past n were said, but never made: a tree of n classes
        raise OptionError(f"classes={opt.classes} needs n={opt.classes} at least (an image a class), not n={opt.n}")
    seed_option(opt.seed)
    root = Path(out)
    _claim(root, opt)
    for c in range(opt.classes):
        (root / class_name(c)).mkdir(parents=True, exist_ok=True)
    jobs = [(str(root), i, opt) for i in range(opt.n)]
    total = 0
    with tqdm(total=opt.n, unit="img", desc="synth", disable=not opt.progress, dynamic_ncols=True) as bar:
        if opt.workers <= 1:
            for job in jobs:
                total += _write_one(job)
                bar.update(1)
        else:
            # fresh interpreters, as convert's: a fork of a caller holding threads (a DALI pipeline, MPI)
            # inherits their objects, and a garbage collection there that finalises one hangs the worker
            with ProcessPoolExecutor(opt.workers, mp_context=worker_context(), initializer=bind_to_parent) as pool:
                try:
                    for size in pool.map(_write_one, jobs, chunksize=8):
                        total += size
                        bar.update(1)
                except BrokenProcessPool:
                    if total:
                        raise
                    raise ended_as_they_started("synth's worker processes") from None
    return total
