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


def checked_headers(batch: EncodedBatch, options: DecodeOptions,
                    on_bad: OnBad | None) -> tuple[EncodedBatch, list[tuple[int, int]]]:
    """The batch less the samples whose header cannot be read or says more pixels than
    ``options.max_pixels`` (each reported: nothing is decoded from them), and the others' sizes."""
    sizes: list[tuple[int, int]] = []
    bad: set[int] = set()
    for g, sample, data in zip(batch.indices, batch.samples, batch.datas, strict=True):
        try:
            size = image_size(data)
            check_pixels(*size, options.max_pixels)
            sizes.append(size)
        except ValueError as e:
            if on_bad is not None:
                on_bad(g, sample, f"does not decode: {e}")
            bad.add(g)
            sizes.append((0, 0))
    if bad:
        sizes = [s for g, s in zip(batch.indices, sizes, strict=True) if g not in bad]
        batch = batch.without(bad)
    return batch, sizes


def with_crops(batch: EncodedBatch, seed: int, epoch: int, options: DecodeOptions,
               on_bad: OnBad | None) -> EncodedBatch:
    """The batch with each sample's crop window and flip; samples without a readable header, or
    over the pixel limit, are reported and left out."""
    batch, sizes = checked_headers(batch, options, on_bad)
    wh = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    batch.crops = random_crops(seed, epoch, np.asarray(batch.indices, dtype=np.int64), wh[:, 0], wh[:, 1], options)
    return batch
