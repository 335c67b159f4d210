"""Encoded batches on their way to a decoder, and what a decoder hands back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..sample import KEY, Sample, label_of
from .spec import image_field

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

    @classmethod
    def of(cls, indices: np.ndarray, samples: list[Sample], on_bad: OnBad) -> EncodedBatch:
        batch = cls([], [])
        for g, sample in zip(indices.tolist(), samples, strict=True):
            name = image_field(sample)
            if name is None:
                on_bad(g, sample, f"no image field among {sorted(k for k in sample if k != KEY)}")
                continue
            try:
                label = label_of(sample)
            except ValueError:
                on_bad(g, sample, f"cls {sample.get('cls')!r} is not an integer")
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
