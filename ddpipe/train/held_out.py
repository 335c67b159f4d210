"""A held-out dataset's labels as the training dataset's class numbers, matched by class name: a
validation set converted on its own (its classes sorted another way, or only some of them) is scored
against the classes the model learnt. A class the training dataset does not name is refused: its
images could only be scored wrong."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..dataset import Dataset
from ..errors import DdpipeError


def held_out_labels(trained: Sequence[str], held_out: Dataset) -> np.ndarray | None:
    """For each of ``held_out``'s class numbers, the number the training dataset (naming ``trained``)
    gives that class; None where they name the same classes in the same order, or either names none
    (its numbers are then taken as they are). A :class:`DdpipeError` where ``held_out`` names a class
    ``trained`` does not (every rank reads the same manifests: each raises it alike)."""
    theirs = held_out.classes
    if not trained or not theirs or tuple(theirs) == tuple(trained):
        return None
    number = {name: i for i, name in enumerate(trained)}
    unknown = [name for name in theirs if name not in number]
    if unknown:
        some = ", ".join(repr(name) for name in unknown[:3]) + (", ..." if len(unknown) > 3 else "")
        raise DdpipeError(f"the held-out dataset names {len(unknown)} class(es) the training dataset does not "
                          f"({some}): its images of them could only be scored wrong", path=held_out.where).everywhere()
    return np.array([number[name] for name in theirs], dtype=np.int64)


def as_trained(labels: torch.Tensor, numbers: torch.Tensor | None) -> torch.Tensor:
    """A held-out batch's labels as the training dataset's numbers (:func:`held_out_labels`, as a
    tensor, on the labels' device already where the caller can: ``to`` is then no copy); a label below 0
    (an unlabelled sample) stays as it is."""
    if numbers is None:
        return labels
    numbers = numbers.to(labels.device)
    return torch.where(labels >= 0, numbers[labels.clamp(min=0)], labels)
