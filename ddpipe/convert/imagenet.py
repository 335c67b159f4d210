"""ImageNet's validation set as it ships: one flat directory of JPEGs and a ground-truth file, in
either of its two forms, labelled with the class indices of the training tree (one directory per
synset, sorted: what an ImageFolder gives).

- ``LOC_val_solution.csv`` (the Kaggle/ILSVRC localisation release): ``ImageId,PredictionString``
  rows whose first token is the synset (``n01751748 ...boxes``).
- ``ILSVRC2012_validation_ground_truth.txt`` (the 2012 devkit): one ILSVRC2012_ID (1-1000) per line,
  line k for ``ILSVRC2012_val_%08d.JPEG % k``. IDs follow the devkit's own order, not the sorted
  synsets, so a synset list must say which is which: ``map_clsloc.txt`` lines (``wnid id name``) or
  a list whose line i is the synset of ID i.

Either way a sample's label is the index of its synset among the sorted synsets (every synset of
``synsets`` when given, else those in the ground truth), as the training tree's class directories.
"""

from __future__ import annotations

import csv
import io
import os
import re
from pathlib import Path

from ..errors import SourceError
from .sources import Source, SourceItem, check_unique, key_of

SYNSET = re.compile(r"^n\d{8}$")
VAL_NAME = "ILSVRC2012_val_{:08d}"


def read_synsets(path: Path) -> dict[int, str]:
    """ILSVRC2012_ID -> synset, from ``wnid id ...`` lines or a plain list (line i is ID i)."""
    ids: dict[int, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.replace(",", " ").split()
        if not parts:
            continue
        if not SYNSET.match(parts[0]):
            raise SourceError(f"line {n}: expected a synset id such as n01440764, found {parts[0]!r}", path=path)
        ids[int(parts[1]) if len(parts) > 1 and parts[1].isdecimal() else n] = parts[0]
    return ids


def ground_truth(path: Path, synsets: Path | None) -> dict[str, str]:
    """Image name without suffix -> synset, from either ground-truth form."""
    text = path.read_text(encoding="utf-8")
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    if "," in first:  # the CSV form
        rows = list(csv.reader(io.StringIO(text)))
        if rows and rows[0] and rows[0][0].strip().lower() == "imageid":
            rows = rows[1:]
        truth = {}
        for n, row in enumerate(rows, 2):
            if len(row) < 2 or not row[1].split() or not SYNSET.match(row[1].split()[0]):
                raise SourceError(f"row {n}: expected 'ImageId,n01440764 ...', found {','.join(row)!r}", path=path)
            truth[row[0].strip()] = row[1].split()[0]
        return truth
    if synsets is None:
        raise SourceError("this ground truth gives ILSVRC2012 class ids: name the synset list that maps them "
                          "(--synsets map_clsloc.txt)", path=path)
    by_id = read_synsets(synsets)
    truth = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if not line.strip().isdecimal() or int(line) not in by_id:
            raise SourceError(f"line {n}: {line.strip()!r} is not a class id of the synset list", path=path)
        truth[VAL_NAME.format(n)] = by_id[int(line)]
    return truth


def imagenet_val_source(root: Path, labels: Path, synsets: Path | None) -> Source:
    if not root.is_dir():
        raise SourceError("not a directory: --val-labels goes with the flat validation directory", path=root)
    truth = ground_truth(labels, synsets)
    names = sorted(set(read_synsets(synsets).values())) if synsets is not None else sorted(set(truth.values()))
    index = {s: i for i, s in enumerate(names)}
    items = []
    for name in sorted(os.listdir(root)):
        full = root / name
        if name.startswith(".") or not full.is_file():
            continue
        stem = os.path.splitext(name)[0]
        if stem not in truth:
            raise SourceError(f"{name} has no entry in the ground truth", path=labels)
        if truth[stem] not in index:
            raise SourceError(f"{name}: synset {truth[stem]} is not in the synset list", path=synsets or labels)
        items.append(SourceItem(path=str(full), size=full.stat().st_size, key=key_of(stem), label=index[truth[stem]]))
    if not items:
        raise SourceError("no images in the validation directory", path=root)
    check_unique(items)
    identity = "\n".join(f"{Path(i.path).name}\t{i.size}\t{i.label}" for i in items)
    return Source("imagenet-val", str(root), tuple(items), tuple(names), identity)
