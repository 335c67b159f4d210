"""A dataset on disk: a directory of shards described by ``index.json``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from .errors import CorruptShardError, MissingShardError
from .formats import ShardFormat, ShardReader, get_format
from .manifest import Manifest, ShardInfo, load_manifest
from .sample import Sample


class Dataset:
    """A dataset opened by :func:`open_dataset`: its manifest, its length, its samples shard by shard."""

    def __init__(self, root: str | os.PathLike[str], manifest: Manifest) -> None:
        self.root = Path(root)
        self.manifest = manifest
        self.format: ShardFormat = get_format(manifest.format)

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __repr__(self) -> str:
        m = self.manifest
        return f"Dataset({str(self.root)!r}, format={m.format!r}, shards={len(m.shards)}, samples={len(self)})"

    @property
    def classes(self) -> tuple[str, ...]:
        return self.manifest.classes

    def shard_path(self, shard: int) -> Path:
        return self.root / self.manifest.shards[shard].file

    def check_files(self) -> None:
        """Cheap checks without reading data: every shard exists and has its recorded size."""
        for info in self.manifest.shards:
            self._check_file(info)

    def check_files_of(self, shard: int) -> None:
        """:meth:`check_files` for one shard."""
        self._check_file(self.manifest.shards[shard])

    def _check_file(self, info: ShardInfo) -> None:
        path = self.root / info.file
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise MissingShardError("shard listed in index.json is missing", path=path) from None
        if size != info.bytes:
            what = "truncated" if size < info.bytes else "larger than recorded"
            raise CorruptShardError(f"{what}: index.json says {info.bytes} bytes, file has {size}", path=path)

    def open_shard(self, shard: int) -> ShardReader:
        """A reader over one shard, checked against its manifest entry."""
        info = self.manifest.shards[shard]
        self._check_file(info)
        reader = self.format.reader(self.root / info.file)
        if len(reader) != info.samples:
            reader.close()
            raise CorruptShardError(
                f"holds {len(reader)} samples, index.json says {info.samples}", path=self.root / info.file
            )
        return reader

    def iter_shard(self, shard: int, start: int = 0) -> Iterator[Sample]:
        """The samples of one shard from position ``start``, read sequentially."""
        with self.open_shard(shard) as reader:
            yield from reader.scan(start)

    def __iter__(self) -> Iterator[Sample]:
        for shard in range(len(self.manifest.shards)):
            yield from self.iter_shard(shard)


def open_dataset(path: str | os.PathLike[str]) -> Dataset:
    """Open the dataset in directory ``path``; check its manifest and that every shard is present."""
    dataset = Dataset(path, load_manifest(path))
    dataset.check_files()
    return dataset
