"""Encoded batches on their way to a decoder, and what a decoder hands back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..sample import Sample, class_of
from .augment import image_size, random_crops
from .spec import DecodeOptions, check_pixels, image_field, no_image

if TYPE_CHECKING:
    from .augment import Crops

# on_bad(global index, sample, reason): raises under on_error="fail", counts under "skip"
OnBad = Callable[[int, Sample, str], None]


@dataclass
class EncodedBatch:
    """A batch's images (encoded bytes) and labels, with the global index of each sample."""

    indices: list[int]
    samples: list[Sample]
    datas: list[bytes] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    crops: Crops | None = None  # each sample's crop window and flip, once chosen (augment.py)
    # arrays a decoder handed to a library that reads them in place (DALI, no_copy): they live as long
    # as the batch, which the decoder keeps until the library is done with it
    fed: object = None
    # its headers read and crops chosen already (by a reading process: read_process.py), its
    # unreadable samples left out
    checked: bool = False
    # called once the decoder is done with the batch's bytes (a reading process's buffer reuses them)
    release: Callable[[], None] | None = None

    @classmethod
    def of(cls, indices: np.ndarray, samples: list[Sample], on_bad: OnBad, classes: int = 0, *,
           labels_required: bool = False) -> EncodedBatch:
        """The batch of ``samples``, less those without an image, or whose ``cls`` is not a class of the
        ``classes`` the dataset names, or who have none where ``labels_required``
        (:func:`~ddpipe.sample.class_of`), each reported."""
        batch = cls([], [])
        for g, sample in zip(indices.tolist(), samples, strict=True):
            name = image_field(sample)
            if name is None:
                on_bad(g, sample, no_image(sample))
                continue
            try:
                label = class_of(sample, classes, required=labels_required)
            except ValueError as e:
                on_bad(g, sample, str(e))
                continue
            batch.indices.append(g)
            batch.samples.append(sample)
            batch.datas.append(sample[name])
            batch.labels.append(label)
        return batch

    def without(self, bad: set[int]) -> EncodedBatch:
        keep = [i for i, g in enumerate(self.indices) if g not in bad]
        return EncodedBatch([self.indices[i] for i in keep], [self.samples[i] for i in keep],
                            [self.datas[i] for i in keep], [self.labels[i] for i in keep])


class KnownSizes:
    """Each sample's image size as its header gave it, by global index, so that an image read again in a
    later epoch is not parsed again: its header walk was a seventh of a reading process's held
    interpreter lock (py-spy, the dali-gpu path's feed), the process that feeds the GPU. Kept with the
    image's encoded length (modulo 2**32, 0 where unknown: no image's header is empty): an image whose
    length changed under the same index, in an unchecked shard rewritten between epochs, is read again.
    12 bytes a sample (15 MB for ImageNet's 1.28 million), grown to the largest index seen; only images
    whose header read and passed the pixel limit are kept, so a bad one is reported every epoch."""

    def __init__(self) -> None:
        self._lengths = np.zeros(0, dtype=np.uint32)
        self._sizes = np.zeros((0, 2), dtype=np.int32)

    def lookup(self, indices: np.ndarray, datas: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Per sample, whether its size is known, and the (width, height) rows known (zeros where not)."""
        known, sizes = np.zeros(len(indices), dtype=bool), np.zeros((len(indices), 2), dtype=np.int64)
        n = len(self._lengths)
        if n:
            lengths = _lengths_of(datas)
            at = np.minimum(indices, n - 1)
            known = (indices < n) & (self._lengths[at] == lengths) & (lengths != 0)
            sizes[known] = self._sizes[at[known]]
        return known, sizes

    def learn(self, indices: np.ndarray, datas: list[bytes], sizes: np.ndarray) -> None:
        """Keep each sample's (width, height) in ``sizes``."""
        if not len(indices):
            return
        top = int(indices.max()) + 1
        if top > len(self._lengths):  # doubled, so that growing costs a copy now and then, not every batch
            grown = max(top, 2 * len(self._lengths))
            self._lengths = np.concatenate([self._lengths, np.zeros(grown - len(self._lengths), dtype=np.uint32)])
            self._sizes = np.concatenate([self._sizes, np.zeros((grown - len(self._sizes), 2), dtype=np.int32)])
        self._lengths[indices] = _lengths_of(datas)
        self._sizes[indices] = sizes


def _lengths_of(datas: list[bytes]) -> np.ndarray:
    return np.fromiter(map(len, datas), dtype=np.int64, count=len(datas)).astype(np.uint32)


def checked_headers(batch: EncodedBatch, options: DecodeOptions, on_bad: OnBad | None,
                    known: KnownSizes | None = None) -> tuple[EncodedBatch, np.ndarray]:
    """The batch less the samples whose header cannot be read or says more pixels than
    ``options.max_pixels`` (each reported: nothing is decoded from them), and the others' sizes
    ((width, height) rows). ``known``: the sizes read in earlier epochs, consulted and added to."""
    indices = np.asarray(batch.indices, dtype=np.int64)
    have, sizes = (known if known is not None else KnownSizes()).lookup(indices, batch.datas)
    if have.all():
        return batch, sizes
    bad: set[int] = set()
    for i in np.flatnonzero(~have).tolist():
        try:
            size = image_size(batch.datas[i])
            check_pixels(*size, options.max_pixels)
            sizes[i] = size
        except ValueError as e:
            if on_bad is not None:
                on_bad(batch.indices[i], batch.samples[i], f"does not decode: {e}")
            bad.add(batch.indices[i])
    dropped = np.isin(indices, list(bad))  # by global index, as batch.without drops them
    if known is not None:
        read = ~have & ~dropped
        known.learn(indices[read], [d for d, r in zip(batch.datas, read.tolist(), strict=True) if r], sizes[read])
    if bad:
        sizes = sizes[~dropped]
        batch = batch.without(bad)
    return batch, sizes


def with_crops(batch: EncodedBatch, seed: int, epoch: int, options: DecodeOptions,
               on_bad: OnBad | None, known: KnownSizes | None = None) -> EncodedBatch:
    """The batch with each sample's crop window and flip; samples without a readable header, or
    over the pixel limit, are reported and left out (``known``: as :func:`checked_headers`)."""
    batch, sizes = checked_headers(batch, options, on_bad, known)
    batch.crops = random_crops(seed, epoch, np.asarray(batch.indices, dtype=np.int64), sizes[:, 0], sizes[:, 1],
                               options)
    return batch
