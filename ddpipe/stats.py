"""``ddpipe inspect``: what a dataset holds, from its manifest and one pass over its samples."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .dataset import open_dataset
from .sample import KEY


@dataclass
class FieldStats:
    count: int = 0
    total: int = 0
    smallest: int = 0
    largest: int = 0

    def add(self, size: int) -> None:
        self.smallest = size if self.count == 0 else min(self.smallest, size)
        self.largest = max(self.largest, size)
        self.count += 1
        self.total += size

    def to_dict(self) -> dict[str, Any]:
        mean = self.total / self.count if self.count else 0.0
        return {"count": self.count, "bytes": self.total, "mean": round(mean, 1), "min": self.smallest,
                "max": self.largest}


@dataclass
class DatasetStats:
    path: str
    format: str
    shards: int
    samples: int
    bytes: int
    classes: list[str]
    skipped: int
    fields: dict[str, FieldStats] = field(default_factory=dict)
    data: str | None = None  # where the shard files are, when not beside index.json (adopted with --out)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "data": self.data, "format": self.format, "shards": self.shards,
                "samples": self.samples, "bytes": self.bytes, "num_classes": len(self.classes), "classes": self.classes,
                "skipped": self.skipped, "fields": {k: v.to_dict() for k, v in sorted(self.fields.items())}}


def inspect_dataset(path: str | os.PathLike[str], *, scan: bool = True) -> DatasetStats:
    """Format, shard, sample and byte counts, classes, and (with ``scan``) per-field sizes."""
    ds = open_dataset(path)
    m = ds.manifest
    stats = DatasetStats(str(path), m.format, len(m.shards), m.num_samples, m.num_bytes, list(m.classes),
                         len(m.skipped))
    if m.data_dir is not None:
        stats.data = ds.storage.url() if ds.storage is not None else os.path.normpath(ds.data_root)
    if scan:
        for sample in ds:
            for name, value in sample.items():
                if name != KEY:
                    stats.fields.setdefault(name, FieldStats()).add(len(value))
    return stats


def _first_classes(classes: list[str]) -> str:
    if not classes:
        return ""
    return f" ({', '.join(classes[:5])}{', ...' if len(classes) > 5 else ''})"


def format_stats(stats: DatasetStats) -> str:
    lines = [
        f"dataset   {stats.path}",
        *([f"data      {stats.data}"] if stats.data is not None else []),
        f"format    {stats.format}",
        f"shards    {stats.shards}",
        f"samples   {stats.samples}",
        f"bytes     {stats.bytes:,} ({stats.bytes / 1e6:.1f} MB)",
        f"classes   {len(stats.classes)}{_first_classes(stats.classes)}",
        f"skipped   {stats.skipped}",
    ]
    if stats.fields:
        lines.append(f"{'field':<10}{'count':>8}{'mean B':>12}{'min B':>10}{'max B':>10}{'total MB':>11}")
        for name, f in sorted(stats.fields.items()):
            d = f.to_dict()
            lines.append(f"{name:<10}{d['count']:>8}{d['mean']:>12.1f}{d['min']:>10}{d['max']:>10}"
                         f"{d['bytes'] / 1e6:>11.1f}")
    return "\n".join(lines)
