"""Class names for a conversion's or an adoption's integer labels: those given, or each label's number."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..errors import DdpipeError
from ..manifest import numbered_class_limit


def numbered_classes(max_label: int, samples: int, where: str | os.PathLike[str]) -> tuple[str, ...]:
    """One class per number from 0 to ``max_label``, named by its number; refused past
    :func:`~ddpipe.manifest.numbered_class_limit` (a label of 3,000,000,000 ran a conversion out of memory)."""
    if max_label >= numbered_class_limit(samples):
        raise DdpipeError(f"a label is {max_label}: as a class index, that makes {max_label + 1:,} classes for "
                          f"{samples:,} samples; labels should count classes from 0 (map them, or name the classes)",
                          path=where)
    return tuple(str(i) for i in range(max_label + 1))


def named_classes(max_label: int, samples: int, classes: list[str] | None,
                  where: str | os.PathLike[str]) -> tuple[str, ...]:
    """``classes`` if every label up to ``max_label`` has a name among them (else refused: a training
    loss would fail on the rest); with none given, the numbered classes."""
    if classes is None:
        return numbered_classes(max_label, samples, where)
    if max_label >= len(classes):
        raise DdpipeError(f"a label is {max_label}, but there are {len(classes)} class names (given, or recorded "
                          "by the manifest already there)", path=where)
    return tuple(classes)


def refuse_negative(labels: Sequence[int], where: str | os.PathLike[str]) -> None:
    """Refuse a negative class number, naming the first sample that has one (-1 is the usual mark of an
    unlabelled image): a training loss fails on it, on a GPU as a device-side assert."""
    i = next((i for i, label in enumerate(labels) if label < 0), None)
    if i is not None:
        raise DdpipeError(f"sample {i} has the label {labels[i]}: class numbers count from 0 (a negative label "
                          "usually marks an unlabelled image, which training cannot use)", path=where)


def class_order(names: set[str], classes: list[str] | None, given: list[str] | None,
                where: str | os.PathLike[str]) -> list[str]:
    """The classes of labels stored as names: in the order of ``classes`` (given, or recorded by the
    manifest already there) where it names them all, else sorted; refused where class names given
    lack some."""
    if "" in names or any(not name.strip() for name in names):  # an unlabelled image, most likely
        raise DdpipeError("a label is an empty or blank class name: every image needs its class", path=where)
    missing = sorted(names - set(classes or ()))
    if missing and given is not None:
        raise DdpipeError(f"the labels name classes the class names given lack: {', '.join(missing[:5])}"
                          f"{' ...' if len(missing) > 5 else ''}", path=where)
    return list(classes) if classes and not missing else sorted(names)
