"""Small datasets written straight through the format writers (no images needed)."""

from __future__ import annotations

from pathlib import Path

from ddpipe.formats import get_format
from ddpipe.manifest import Manifest, ShardInfo, file_checksum, save_manifest


def make_dataset(root: Path, fmt: str, sizes: list[int], classes: int = 4, payload: int = 64) -> Path:
    """Shards of the given sample counts; sample i has key ``s/<i>``, ``cls`` = i % classes, and
    ``bin`` = ``payload`` bytes derived from i. Samples are class-sorted within the dataset."""
    f = get_format(fmt)
    root.mkdir(parents=True, exist_ok=True)
    shards, i = [], 0
    total = sum(sizes)
    per_class = -(-total // classes)
    for k, n in enumerate(sizes):
        path = root / f"shard-{k:06d}{f.suffix}"
        with f.writer(path) as w:
            for _ in range(n):
                w.write({"__key__": f"s/{i:06d}", "cls": str(i // per_class).encode(),
                         "bin": (i.to_bytes(4, "little") * (payload // 4 + 1))[:payload]})
                i += 1
        shards.append(ShardInfo(path.name, n, path.stat().st_size, file_checksum(path)))
    save_manifest(root, Manifest(fmt, ("bin", "cls"), tuple(str(c) for c in range(classes)), tuple(shards)))
    return root
