"""Where the label of a plain encoded image in an adopted LMDB comes from: its key (a pattern with
a group ``label``, the manifest layout's ``"label_regex"``) or a file of ``key label`` lines beside
the LMDB (``"labels_file"``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import DdpipeError
from .learnt import FileVersion, Learnt, LearntOfFile
from .lmdb_values import RecordError


def read_labels_file(path: Path) -> dict[str, int]:
    """``key label`` lines (space, tab or comma separated) -> {key: label}."""
    labels = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:  # said of the labels file, not of the LMDB beside it
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise DdpipeError(f"cannot read the labels file: {why}", path=path) from None
    for n, line in enumerate(text.splitlines(), 1):
        parts = re.split(r"[\s,]+", line.strip())
        if not parts[0]:
            continue
        if len(parts) < 2 or not re.fullmatch(r"-?[0-9]+", parts[-1]):
            raise DdpipeError(f"line {n}: expected 'key label' with an integer label, found {line.strip()!r}",
                              path=path)
        labels[parts[0]] = int(parts[-1])
    return labels


class LabelSource:
    """Where a plain image's label comes from: its key (a pattern) or a side file. A pattern's
    ``label`` group is a class number, or a class name (``n01440764/...``) where the manifest's
    layout lists the names (``label_names``, in class order), as a record's label may be."""

    def __init__(self, layout: dict[str, Any], data_dir: Path) -> None:
        self.pattern = re.compile(layout["label_regex"]) if layout.get("label_regex") else None
        self.table = read_labels_file(data_dir / layout["labels_file"]) if layout.get("labels_file") else None
        self.names = {str(name): i for i, name in enumerate(layout.get("label_names", ()))}

    @classmethod
    def of(cls, layout: dict[str, Any], data_dir: Path,
           known: Learnt[FileVersion, LabelSource] | None = None) -> LabelSource:
        """The label source of ``layout``, its labels file's lines as read before where ``known`` holds
        this version of the file: a reader opens the file every epoch, and an ImageNet's lines took
        4.3 s to read here."""
        file = data_dir / layout["labels_file"] if layout.get("labels_file") else None
        learnt = LearntOfFile.of(known, file) if file is not None and known is not None else None
        source = learnt.known if learnt is not None else None
        if source is None:
            source = cls(layout, data_dir)
            if learnt is not None:
                learnt.learn(source, len(source.table or ()))
        return source

    def label(self, key: str) -> int | None:
        if self.pattern is not None:
            m = self.pattern.search(key)
            if m is None:
                raise RecordError(f"the key does not match the label pattern {self.pattern.pattern!r}")
            return self.named(m.group("label"), "the key's")
        if self.table is not None:
            if key not in self.table:
                raise RecordError("the key is not in the labels file")
            return self.table[key]
        return None

    def named(self, text: str, whose: str = "the record's") -> int:
        """The class number of a label given as text: its place among the manifest's class names,
        or, where the manifest lists none, the number it spells."""
        if self.names:
            if text not in self.names:
                raise RecordError(f"{whose} class {text!r} is not one the manifest lists")
            return self.names[text]
        if not text.isdecimal():
            raise RecordError(f"{whose} label {text!r} is not a number")
        return int(text)
