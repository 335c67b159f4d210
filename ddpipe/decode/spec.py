"""What decoding produces: the transform, the output type, and how images are seeded."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import simplejpeg

from ..errors import OptionError
from ..fields import is_real, number_option, refuse_non_boolean_flags, whole_option
from ..sample import IMAGE_FIELDS, field_names
from .jpeg_header import jpeg_size

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DTYPES = ("float32", "float16", "uint8")
# PIL's default limit (Image.MAX_IMAGE_PIXELS): a 631-byte JPEG may say it is 30,000 x 30,000
MAX_PIXELS = 89_478_485
DECODERS = ("auto", "dali-gpu", "dali-cpu", "pil")
ON_ERROR = ("fail", "skip")
READ_IN = ("auto", "thread", "process")
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device(device: object) -> str:
    """``device`` if it is one that batches can be delivered to ("auto", "cpu", "cuda", "cuda:N"); an
    OptionError saying which ones otherwise (torch's own error for "tpu" is a RuntimeError naming twenty
    device types ddpipe does not deliver to)."""
    if not isinstance(device, str) or not DEVICE.fullmatch(device):
        raise OptionError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N' (a GPU's index), not {device!r}")
    return device


@dataclass(frozen=True)
class DecodeOptions:
    """How a loader turns encoded samples into batches.

    ``decoder``: ``"dali-gpu"`` (DALI's ``mixed`` decoder), ``"dali-cpu"``, ``"pil"``, or ``"auto"``
    (the GPU where CUDA and DALI are present, else DALI on the CPU, else PIL), onto ``device``
    (``"auto"``: this rank's GPU, else the CPU). Batches of encoded samples, undecoded, are what
    :class:`ddpipe.EncodedStream` yields.
    ``on_error``: ``"fail"`` stops at an image that does not decode, naming it; ``"skip"`` drops
    it, counts it, and refills its place in the batch.

    The transform: the training one (random-resized crop, flip, normalise) or the evaluation one
    (resize the shorter side, centre crop). ``uint8`` output skips normalisation, to be done on
    the device with :func:`ddpipe.decode.normalize`; float outputs are normalised with ``mean`` and
    ``std`` (given for pixels in [0, 1])."""

    decoder: str = "auto"
    device: str = "auto"
    on_error: str = "fail"
    train: bool = True
    size: int = 224
    resize_shorter: int = 256
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    dtype: str = "float32"
    channels_last: bool = False
    # Antialiased resizing, as torchvision and PIL do, costs ~3-5% of CPU decoding throughput
    # (benchmarks/loader.py); switching it off trades aliasing in strong downscales for speed.
    antialias: bool = True
    # an image whose header says more pixels than this is a bad sample, refused before decoding
    max_pixels: int = MAX_PIXELS
    # decoding threads (DALI) or processes (pil); 0: the Loader gives the node's cores over its ranks
    threads: int = 0
    # decode servers (``ddpipe serve``) to decode on, e.g. ("tcp://cpu-node-1:5555",): batches are
    # the same as decoding here with the CPU decoder ("dali-cpu", else "pil"), which also takes over
    # while no server answers; a server silent this many seconds with batches outstanding is dropped
    service: tuple[str, ...] = ()
    service_timeout: float = 10.0
    # where the batches are read and prepared for a DALI decoder (their JPEG headers read, crop windows
    # chosen): "thread", threads of this process; "process", a process of its own, off the training
    # process's interpreter lock (ddpipe/read_process.py: where it applies, and why); "auto", a process
    # for "dali-gpu", where it was measured faster (benchmarks/results/gpu.json), else threads
    read_in: str = "auto"
    # a sample with no label (no cls field) is a bad sample, as for a loss that needs one for every
    # sample (ddpipe train's); otherwise it comes with label -1, for a loss's ignore_index
    require_labels: bool = False

    def __post_init__(self) -> None:
        refuse_non_boolean_flags(self)
        if isinstance(self.service, str) or not all(isinstance(s, str) for s in self.service):
            raise OptionError(f"service must be a list of addresses such as 'tcp://host:5555', not {self.service!r}")
        object.__setattr__(self, "service", tuple(self.service))  # a list given is kept as a tuple
        if self.service:  # refused now, not at the first batch
            from ..service.transport import endpoint

            for address in self.service:
                endpoint(address)
        check_device(self.device)
        self._check_choices()
        self._check_sizes()
        self._check_transform()

    def _check_choices(self) -> None:
        """The options that name one of a few things, and the service's: its timeout, its decoder."""
        if self.read_in not in READ_IN:
            raise OptionError(f"read_in must be 'auto', 'thread' or 'process', not {self.read_in!r}")
        if not number_option(self.service_timeout, "service_timeout") > 0:  # NaN too
            raise OptionError(f"service_timeout must be positive, not {self.service_timeout}")
        if self.service and self.decoder == "dali-gpu":
            raise OptionError("a decode service decodes on the CPU: decoder 'auto', 'dali-cpu' or 'pil' with service")
        if self.decoder == "none":
            raise OptionError("decoder must be one of " + ", ".join(DECODERS) + ", not 'none': for batches of "
                              "encoded samples, undecoded, iterate a ddpipe.EncodedStream")
        if self.decoder not in DECODERS:
            raise OptionError(f"decoder must be one of {', '.join(DECODERS)}, not {self.decoder!r}")
        if self.on_error not in ON_ERROR:
            raise OptionError(f"on_error must be 'fail' or 'skip', not {self.on_error!r}")
        if self.dtype not in DTYPES:
            raise OptionError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")

    def _check_sizes(self) -> None:
        """The images' sizes, within ``max_pixels``, and the threads' count."""
        whole_option(self.max_pixels, "max_pixels", least=1)
        whole_option(self.size, "size", 1)
        whole_option(self.resize_shorter, "resize_shorter", self.size)  # the crop is taken from the resized image
        whole_option(self.threads, "threads")
        side, name = (self.size, "size") if self.train else (self.resize_shorter, "resize_shorter")
        if side ** 2 > self.max_pixels:  # no image made is larger than any image read may be
            raise OptionError(f"{name} {side} makes images of at least {side ** 2:,} pixels, more than max_pixels "
                              f"({self.max_pixels:,}) allows any image")
        if self.threads < 0:
            raise OptionError(f"threads must be at least 0 (0: the node's cores over its ranks), not {self.threads}")

    def reads_apart(self, decoder: str) -> bool:
        """Whether batches for ``decoder`` (resolved, not "auto") are read in a process of their own. "auto"
        picks one for "dali-gpu" alone: on an H200 the Loader read apart ran faster than read by threads
        in every format and ResNet-50 fed by it stalled less than half as long; on the host, where ranks
        share few cores, threads kept the higher rate (benchmarks/results/feed-read-in.json). A decode
        service's batches are prepared by its servers, so they stay in threads."""
        if self.read_in == "auto":
            return decoder == "dali-gpu" and not self.service
        return self.read_in == "process"

    def _check_transform(self) -> None:
        """The random-resized crop's ranges, the flip's odds and the normalisation, as torchvision takes them."""
        scale, ratio = _numbers(self.scale, 2), _numbers(self.ratio, 2)
        if scale is None or not 0 < scale[0] <= scale[1] <= 1:
            raise OptionError(f"scale must be (low, high) with 0 < low <= high <= 1, not {self.scale!r}")
        if ratio is None or not 0 < ratio[0] <= ratio[1] < math.inf:
            raise OptionError(f"ratio must be (low, high) with 0 < low <= high, finite, not {self.ratio!r}")
        flip = _numbers((self.flip,), 1)
        if flip is None or not 0 <= flip[0] <= 1:
            raise OptionError(f"flip is a probability, in [0, 1], not {self.flip!r}")
        mean, std = _numbers(self.mean, 3), _numbers(self.std, 3)
        if mean is None or std is None or not all(0 < s < math.inf for s in std) \
                or not all(math.isfinite(m) for m in mean):
            raise OptionError(f"mean and std must be three finite numbers each (R, G, B), std positive, not "
                              f"{self.mean!r} and {self.std!r}")

    @property
    def workers(self) -> int:
        return max(1, self.threads)


def _numbers(value: object, count: int) -> tuple[float, ...] | None:
    """``value`` as ``count`` real numbers (not booleans), or None where it is not that (a bare
    number, a string: unpacked or compared deep inside, TypeError's or ValueError's traceback)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return None
    items = tuple(value)
    if len(items) != count or not all(is_real(v) for v in items):
        return None
    return tuple(float(v) for v in items)


class PixelLimitError(ValueError):
    """An image whose header says more pixels than the limit: refused before it is decoded."""


def check_pixels(width: int, height: int, max_pixels: int = MAX_PIXELS) -> None:
    """PixelLimitError for an image whose header says more than ``max_pixels`` pixels."""
    if width * height > max_pixels:
        raise PixelLimitError(f"{width} x {height} pixels, over the limit of {max_pixels:,} "
                              "(DecodeOptions.max_pixels): refused before decoding")


# what PIL's "cannot identify image file <_io.BytesIO object at 0x7f...>" says, without the buffer's
# address, which differs from run to run (a manifest's skipped entries and two identical runs' records)
NOT_AN_IMAGE = "not an image: no image format recognises it"


def open_image(data: bytes) -> Any:
    """``PIL.Image.open`` of ``data``, with PIL's decompression-bomb error as a PixelLimitError, and
    data no format recognises said so (:data:`NOT_AN_IMAGE`)."""
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise PixelLimitError(str(e)) from None
    except UnidentifiedImageError:
        raise UnidentifiedImageError(NOT_AN_IMAGE) from None


def decode_check(data: bytes, draft: bool = False, max_pixels: int = MAX_PIXELS) -> None:
    """Decode an image whole; raise ``OSError``/``ValueError`` if it is corrupt or truncated, or over
    ``max_pixels`` (from its header, before decoding). ``draft``: a JPEG at 1/8 scale (libjpeg's
    scaled IDCT), which still reads every byte of its entropy-coded data, so a file cut short is
    caught as surely, at ~0.7 of the cost.

    The verdict is PIL's. A JPEG is first decoded by libjpeg-turbo through simplejpeg, strictly (any
    warning of libjpeg's is an error): one that passes would pass PIL, whose decode is libjpeg's too
    and refuses only on libjpeg's errors or on data that ends early (a warning to libjpeg), and it
    costs 0.7 of PIL's time; one that does not, PIL decodes, as a stray byte PIL lets pass fails it."""
    size = jpeg_size(data)
    if size is not None:
        check_pixels(*size, max_pixels)
        scale = 8 if draft else 1
        try:
            simplejpeg.decode_jpeg(data, fastdct=True, fastupsample=True, strict=True,
                                   min_width=max(1, size[0] // scale), min_height=max(1, size[1] // scale))
            return
        except ValueError:
            pass  # PIL's verdict, below
    with open_image(data) as img:
        width, height = img.size
        check_pixels(width, height, max_pixels)
        if draft and img.format == "JPEG":
            img.draft("RGB", (max(1, img.width // 8), max(1, img.height // 8)))
        img.load()


def image_field(sample: dict[str, bytes]) -> str | None:
    """The field holding the sample's image, if any: one named for an image format in any case (a plain
    tar of ImageNet's own files has 'JPEG' fields), as the webdataset library takes them."""
    found = next((f for f in IMAGE_FIELDS if f in sample), None)
    if found is None:  # the usual lower-case names first: this runs for every sample
        found = next((f for f in sample if is_image_field(f)), None)
    return found


def no_image(sample: dict[str, bytes]) -> str:
    """What is wrong with a sample that has no image field."""
    return f"no image field among {field_names(sample)}"


def is_image_field(name: str) -> bool:
    """Whether a field is named for an image format (in any case)."""
    return name.lower() in IMAGE_FIELDS


def random_resized_crop(width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float],
                        rng: np.random.Generator) -> tuple[int, int, int, int]:
    """(left, top, crop width, crop height): torchvision's RandomResizedCrop choice."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h
