"""Samples: a key plus named byte fields, in WebDataset's naming; and a batch of them, as the
encoded stream yields it.

``{"__key__": "n01440764/n01440764_10026", "jpg": b"...", "cls": b"0"}``

Keys and field names are restricted to what every format and every peer reader can carry
unchanged: WebDataset splits a tar member name at the first dot of its last path component, and
DALI's index files are space-separated, so keys hold no dots or whitespace.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import SampleError

#: A sample: ``"__key__"`` maps to a ``str``; every other entry is a field of bytes: ``bytes`` of its
#: own, or a ``memoryview`` where the consumer takes views (``EncodedStream.views``, which the decode
#: stage sets for DALI and for a decode service's client): of its shard's mapping, or of the exchange
#: round's receive buffer, handed on without a copy (``bytes(field)`` makes one where a ``bytes`` is
#: needed).
Sample = dict[str, Any]

KEY = "__key__"

#: Marks a placeholder for a sample that could not be read (its shard failed its checksum under
#: ``on_error="skip"``); its value is the reason, as bytes. The encoded stream drops and counts such
#: samples, so they never reach a decoder.
BAD = "__bad__"

#: The fields named for an image format: a sample's image is one of them (in any case), and so are the
#: suffixes of the image files a class directory holds.
IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp", "bmp", "tiff", "tif", "ppm", "gif")



def owned(sample: Sample) -> Sample:
    """``sample`` with every field in ``bytes`` of its own: a field that is a view of a shard being
    read (:meth:`ddpipe.formats.base.ShardReader.scan_views`) is copied out, so that holding the
    sample does not hold the shard. ``bytes`` of a ``bytes`` is that same object: no copy."""
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()}


_KEY_PART = re.compile(r"[A-Za-z0-9_\-+=,@~%]+")
_FIELD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.]*")


def check_key(key: object) -> str:
    """Return ``key`` if it can be stored by every format, else raise :class:`SampleError`."""
    if not isinstance(key, str) or not key:
        raise SampleError("the key must be a non-empty string", key=repr(key))
    parts = key.split("/")
    if not all(_KEY_PART.fullmatch(p) for p in parts):
        raise SampleError(
            "keys are '/'-separated parts of letters, digits and _-+=,@~% (no dots, spaces or empty parts)",
            key=key,
        )
    return key


def check_field(name: object) -> str:
    """Return ``name`` if it is a valid field name (a file extension such as ``jpg`` or ``seg.png``)."""
    if not isinstance(name, str) or not _FIELD.fullmatch(name) or name.endswith("."):
        raise SampleError(f"invalid field name {name!r}: use an extension such as 'jpg', 'cls' or 'seg.png'")
    return name


def check_sample(sample: Sample) -> Sample:
    """Validate a sample's key, field names and field types; return it unchanged."""
    if KEY not in sample:
        raise SampleError("the sample has no '__key__'")
    key = check_key(sample[KEY])
    if len(sample) < 2:
        raise SampleError("the sample has no fields", key=key)
    for name, value in sample.items():
        if name == KEY:
            continue
        check_field(name)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise SampleError(f"field {name!r} is {type(value).__name__}, not bytes", key=key)
    return sample


def field_names(sample: Sample) -> list[str]:
    """The sample's field names, sorted (the order every writer stores them in)."""
    return sorted(k for k in sample if k != KEY)


def sanitize_key(text: str) -> str:
    """Turn a relative path without its suffix into a valid key, keeping its '/' separators."""
    parts = [re.sub(r"[^A-Za-z0-9_\-+=,@~%]", "_", p) for p in text.replace("\\", "/").split("/") if p]
    if not parts:
        raise SampleError(f"cannot derive a key from {text!r}")
    return "/".join(parts)


def unlabelled(fields: tuple[str, ...]) -> str | None:
    """What is wrong with a dataset of these fields for a use that needs labels (none of its samples has
    a ``cls`` field), or None."""
    if "cls" in fields:
        return None
    return f"its samples have no labels (no 'cls' field among {', '.join(fields) or 'none'})"


def label_of(sample: dict[str, bytes]) -> int:
    """The sample's integer class from its ``cls`` field, or -1 when it has none."""
    value = sample.get("cls")
    if value is None:
        return -1
    return int(bytes(value).decode().strip())


def class_of(sample: dict[str, bytes], classes: int, *, required: bool = False) -> int:
    """The sample's class, which must be one of the ``classes`` a dataset names (where it names any:
    a training loss fails on any other, on a GPU without saying which sample), or -1 for no label
    unless one is ``required``; a ValueError saying what is wrong otherwise."""
    try:
        label = label_of(sample)
    except ValueError:
        raise ValueError(f"cls {sample.get('cls')!r} is not an integer") from None
    if label == -1 and required:
        why = "cls -1" if "cls" in sample else "no cls field"
        raise ValueError(f"has no label ({why}), which training needs")
    if label < -1:
        raise ValueError(f"cls {label} is not a class (0 or more; -1 is no label)")
    if classes and label >= classes:
        raise ValueError(f"cls {label} is outside the dataset's {classes} classes (0 to {classes - 1})")
    return label


@dataclass(frozen=True)
class SampleBatch:
    """One batch of the stream: its encoded samples and the plan's decisions about them. ``indices``:
    each sample's global index, which with ``seed`` and ``epoch`` fixes its crop and flip
    (:mod:`ddpipe.decode.augment`), so decoding is a pure function of the batch, here or elsewhere.
    Iterates as its samples. Under ``on_error="skip"`` a batch may be short by the samples dropped."""

    epoch: int
    seed: int
    number: int  # its place in the epoch (0, 1, ...); a resumed epoch counts afresh
    indices: np.ndarray
    samples: list[Sample]

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)
