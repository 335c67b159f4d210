"""A dataset: a directory, a bucket prefix or an HTTP(S) prefix of shards described by ``index.json``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from .checksum import digest_mismatch, unpack_digests
from .errors import CorruptShardError, ManifestError, MissingShardError, OptionError
from .formats import ShardFormat, ShardReader, get_format
from .formats.base import LayoutError
from .formats.mapped import HashedFile, advise_willneed
from .manifest import MANIFEST_NAME, Manifest, ShardInfo, load_manifest, load_manifest_from
from .sample import BAD, KEY, Sample
from .shard_check import check_shard_file, open_checked
from .storage import ObjectCache, ObjectStorage, StorageOptions, is_remote, open_storage, parse_location
from .throttle import SourceLimits

# on_corrupt(shard, error): under on_error="skip", hears of a shard whose content is not the manifest's
OnCorrupt = Callable[[int, CorruptShardError], None]

# shards checked whole that random access (global shuffling) keeps open, their mappings paged in whole:
# enough to reuse, few enough for file limits (those read sample by sample: reading._read_random)
OPEN_SHARDS = 16


class ShardStore(Protocol):
    """Where a reader finds a shard instead of the dataset's own file (a node's staged copies,
    :class:`ddpipe.staging.NodeStager`), and what it tells the store when done with one."""

    def path(self, shard: int) -> Path: ...

    def release(self, shard: int) -> None: ...

    def invalidate(self, shard: int) -> None:
        """Its copy of ``shard`` differs from the manifest: drop it (to be staged again)."""

    def ready_path(self, shard: int) -> Path | None:
        """Its copy of ``shard`` if complete now, else None (never waits)."""

    @property
    def keeps_copies(self) -> bool:
        """Whether a complete copy stays while the store lives (none is evicted to make room; one found
        damaged is still removed): a reader may then keep its mapping for the next epoch."""


class Dataset:
    """A dataset opened by :func:`open_dataset`: its manifest, its length, its samples shard by shard.

    Reads take two optional inputs: ``store``, the staged copies to read instead of the dataset's
    own files, and ``limits``, a slow-source model that every shard opened and byte read from the
    dataset's own directory pays (tests and benchmarks). Sequential reads ``verify`` each shard
    first: its bytes must hash to the manifest's checksum (and a tar's index must agree with it), so
    a replaced or damaged shard is an error naming it before any of its samples is used. A staged
    copy that fails is dropped and the source read instead. Given ``on_corrupt``, a shard whose
    source fails too is reported to it instead, and each of its samples read comes out as a
    placeholder marked :data:`~ddpipe.sample.BAD`: the stream keeps the plan's length and order (the
    exchange and every rank's batch count depend on it) while the decoder drops and counts them.

    Where a shard's manifest entry holds sample digests (ddpipe writes them for every shard it
    converts and adopts), random reads may check it sample by sample instead, each sample read
    against its digest before it is used, so a rank hashes what it reads rather than the whole file:
    a global shuffle's rank on many nodes reads its share of each shard, not the dataset
    (:func:`ddpipe.reading.read_samples`). So does a sequential scan of an adopted file (one that
    many ranks may each read a part of; :attr:`~ddpipe.formats.ShardFormat.scans_check_samples`). A
    sample that differs is an error naming the shard and the sample, a staged copy's makes the rest
    of the shard come from the source, and under ``on_corrupt`` only that sample becomes a
    placeholder."""

    def __init__(self, root: str | os.PathLike[str], manifest: Manifest, storage: ObjectStorage | None = None) -> None:
        self.manifest = manifest
        #: the shards' objects, for a dataset in a bucket or behind an HTTP server (else None): each
        #: shard is fetched into ``data_root``, a scratch directory of this process, as it is read
        self.storage: ObjectStorage | None = None
        self._objects: ObjectCache | None = None
        if storage is not None:
            # the shard objects: beside index.json, or where an adopted dataset's manifest says
            # (a URL: a manifest kept apart from its objects, by ddpipe index URL --out DIR)
            data_dir = manifest.data_dir
            data = storage.location if not data_dir else parse_location(data_dir) if is_remote(data_dir) else \
                storage.location.child(data_dir)
            self.storage = storage.at(data)
            self._objects = ObjectCache(self.storage, keep=OPEN_SHARDS + 2)
            self.where = storage.url()
            self._root = self._data_root = Path()  # the cache's directory, this process's own
        else:
            self._root = Path(root)
            self.where = str(self._root)
            # the shard files: beside index.json, or where an adopted dataset's manifest says
            self._data_root = self._root / manifest.data_dir if manifest.data_dir is not None else self._root
        try:
            self.format: ShardFormat = get_format(manifest.format).configured(manifest.layout, self.data_root)
        except LayoutError as e:
            where = storage.url(MANIFEST_NAME) if storage is not None else self._root / MANIFEST_NAME
            raise ManifestError(f"malformed manifest: 'layout': {e}", path=where) from None
        self._digests: dict[int, np.ndarray] = {}  # unpacked on first use

    @property
    def root(self) -> Path:
        """The dataset's directory (for objects, this process's scratch directory of fetched shards)."""
        return self._objects.dir if self._objects is not None else self._root

    @property
    def is_remote(self) -> bool:
        """Its shards are objects in a store, fetched into a scratch directory as they are read."""
        return self._objects is not None

    @property
    def data_root(self) -> Path:
        """Where its shard files are (for objects, the same scratch directory)."""
        return self._objects.dir if self._objects is not None else self._data_root

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __repr__(self) -> str:
        m = self.manifest
        return f"Dataset({self.where!r}, format={m.format!r}, shards={len(m.shards)}, samples={len(self)})"

    @property
    def classes(self) -> tuple[str, ...]:
        return self.manifest.classes

    def shard_path(self, shard: int) -> Path:
        return self.data_root / self.manifest.shards[shard].file

    def check_files(self, corrupt_ok: bool = False) -> None:
        """Cheap checks without reading data: every shard exists and has its recorded size (for
        objects, one listing of the prefix). ``corrupt_ok``: a shard file of another size passes, to
        be found again as it is opened (a reader skipping damaged shards drops it then, its samples
        counted, as one failing its checksum); a missing one, or an object of another size, is refused
        all the same."""
        if self.storage is not None:
            if self.storage.location.scheme != "s3":  # a plain HTTP server lists nothing: each shard's
                return  # size is checked when it is fetched
            sizes = self.storage.list()
            for info in self.manifest.shards:
                url = self.storage.url(info.file)
                if info.file not in sizes:
                    raise MissingShardError("object listed in index.json is missing", path=url)
                if sizes[info.file] != info.bytes:  # its ranged reads would fail, not be found damaged
                    raise CorruptShardError(f"index.json says {info.bytes} bytes, the object has {sizes[info.file]}: "
                                            "changed since it was indexed", path=url)
            return
        for info in self.manifest.shards:
            try:
                check_shard_file(self.format, info, self.data_root / info.file)
            except CorruptShardError:
                if not corrupt_ok:
                    raise

    def source_name(self, path: Path) -> str:
        """What messages call a file of this dataset: for objects, their URL rather than the scratch
        copy's path."""
        if self.storage is not None:
            try:
                return self.storage.url(str(path.relative_to(self.data_root)))
            except ValueError:
                pass
        return str(path)

    def object_names(self, info: ShardInfo) -> tuple[tuple[str, ...], tuple[int | None, ...]]:
        """A shard's object and its sidecars' (a tar's index), relative to the data prefix, and
        their sizes where known."""
        local = self.data_root / info.file
        sidecars = [str(p.relative_to(self.data_root)) for p in self.format.sidecar_files(local)]
        return (info.file, *sidecars), (info.bytes, *[None] * len(sidecars))

    def local_copy(self, shard: int) -> Path:
        """A shard's file: its own, or for an object a copy fetched into ``data_root`` (with its
        sidecars) that stays until a few more have been fetched."""
        info = self.manifest.shards[shard]
        if self._objects is not None:
            self._objects.fetch(*self.object_names(info))
        return self.data_root / info.file

    def open_shard(self, shard: int, store: ShardStore | None = None, *, verify: bool = False,
                   hashed: HashedFile | None = None, keep: bool = False, vouched: Path | None = None) -> ShardReader:
        """A reader over one shard (its copy in ``store``, if given), checked against its manifest
        entry: size and sample count, and with ``verify`` its content (``hashed``: a file hashed ahead,
        used, checksum and mapping, if that file is the one opened). ``keep``: the file stays (see
        :func:`ddpipe.reading.keeps_mappings`), and its reader reads through the mapping kept of it,
        if any, or keeps the one it checks the file through. ``vouched``: a file checked whole earlier
        in the same read, its bytes trusted since (a random access reopening a shard): if it is the
        one opened, its format may open it from what it learnt of those bytes (an HDF5 shard's layout)."""
        info = self.manifest.shards[shard]
        source = self.data_root / info.file
        path = store.path(shard) if store is not None else source
        keep = keep and (store is None or path != source)  # under a store the source is a fallback: read once
        try:
            return self._open(info, path, verify, hashed, keep, vouched)
        except MissingShardError:
            if store is None or path == source:
                raise
            # evicted since the store named it: a node short of room takes back the copy needed latest,
            # which a rank reading ahead of the stager (a copy left from an earlier epoch) may be opening
            return self._open(info, source, verify)
        except CorruptShardError as e:
            if store is None or path == source:
                raise
            print(f"ddpipe: warning: staged copy {e}; reading the source instead", file=sys.stderr, flush=True)
            self._drop_copy(shard, store, path)
            return self._open(info, source, verify)

    def _open(self, info: ShardInfo, path: Path, verify: bool, hashed: HashedFile | None = None,
              keep: bool = False, vouched: Path | None = None) -> ShardReader:
        if self._objects is not None and path == self.data_root / info.file:
            self._objects.fetch(*self.object_names(info))
            # a scratch copy, which its cache lets go and fetches again (the object's bytes as they are then):
            # never kept mapped, and checked at every open, whatever an earlier check vouched for
            try:
                return open_checked(self.format, info, path, verify=verify or vouched is not None, hashed=hashed)
            except CorruptShardError as e:
                if e.path is not None:
                    e.path = self.source_name(Path(e.path))
                raise
        return open_checked(self.format, info, path, verify=verify, hashed=hashed, keep=keep, vouched=vouched)

    def sample_digests(self, shard: int) -> np.ndarray | None:
        """The shard's sample digests from the manifest (see the class), or None if it has none."""
        info = self.manifest.shards[shard]
        if not info.digests:
            return None
        if shard not in self._digests:
            self._digests[shard] = unpack_digests(info.digests, info.samples)  # checked as the manifest loaded
        return self._digests[shard]

    def scan_digests(self, shard: int) -> np.ndarray | None:
        """The digests a sequential scan of the shard checks its samples against, or None where it
        checks the whole file: an adopted file's (see the class)."""
        return self.sample_digests(shard) if self.format.scans_check_samples else None

    def iter_shard(self, shard: int, start: int = 0, *, store: ShardStore | None = None,
                   limits: SourceLimits | None = None, verify: bool = True, on_corrupt: OnCorrupt | None = None,
                   views: bool = False, hashed: HashedFile | None = None) -> Generator[Sample, None, None]:
        """The samples of one shard from position ``start``, read sequentially. ``views``: fields
        may be views of the shard in memory (:meth:`ShardReader.scan_views`). ``hashed``: see
        :meth:`open_shard`."""
        digests = self.scan_digests(shard) if verify else None
        try:
            opened = self.open_shard(shard, store, verify=verify and digests is None, hashed=hashed)
        except CorruptShardError as e:
            if on_corrupt is None:
                raise
            on_corrupt(shard, e)
            yield from (self.placeholder(shard, pos, e) for pos in range(start, self.manifest.shards[shard].samples))
            return
        position = start
        told = False  # on_corrupt hears of a shard once, however many of its samples differ
        while True:
            with opened as reader:
                source = self.source_name(reader.path)  # once a shard, not once a sample
                for sample in self._scan(shard, reader, position, limits, views):
                    error = digest_mismatch(digests, position, sample, source)
                    if error is not None:
                        if self.reads_staged_copy(shard, reader):
                            opened = self.reopen_from_source(shard, store, error, reader.path)
                            break
                        if on_corrupt is None:
                            raise error
                        if not told:
                            on_corrupt(shard, error)
                            told = True
                        sample = self.placeholder(shard, position, error)
                    else:
                        sample = reader.parse(sample)  # checked first, then parsed
                    yield sample
                    position += 1
                else:
                    return

    def reads_staged_copy(self, shard: int, reader: ShardReader) -> bool:
        """The reader reads a staged copy, not the shard's source file."""
        return reader.path != self.data_root / self.manifest.shards[shard].file

    def reopen_from_source(self, shard: int, store: ShardStore | None, error: CorruptShardError,
                           copy: Path) -> ShardReader:
        """A staged copy's sample differs: drop the copy and read the shard's source instead."""
        print(f"ddpipe: warning: staged copy {error}; reading the rest from the source", file=sys.stderr, flush=True)
        if store is not None:
            self._drop_copy(shard, store, copy)
        info = self.manifest.shards[shard]
        return self._open(info, self.data_root / info.file, False)  # checked sample by sample, as the copy was

    def _drop_copy(self, shard: int, store: ShardStore, copy: Path) -> None:
        """Remove the damaged staged ``copy`` of ``shard`` (to be staged again), and let go of a mapping
        of it kept for the next epoch, which would hold its space until then."""
        store.invalidate(shard)
        self.format.kept.let_go(copy)

    def _scan(self, shard: int, reader: ShardReader, start: int, limits: SourceLimits | None,
              views: bool) -> Iterator[Sample]:
        """A sequential scan of an open shard, paying the slow-source model where it reads the source."""
        slow = limits if limits is not None and not self.reads_staged_copy(shard, reader) else None
        if slow is not None:
            slow.on_open()
        info = self.manifest.shards[shard]
        share = info.bytes // max(info.samples, 1)  # a scan reads the whole file: each sample its share
        for sample in (reader.scan_views(start) if views else reader.scan(start)):
            if slow is not None:
                slow.on_read(share)
            yield sample

    def placeholder(self, shard: int, position: int, error: CorruptShardError) -> Sample:
        """What stands in for a sample of a shard dropped as corrupt (see ``on_corrupt``)."""
        return {KEY: f"{self.manifest.shards[shard].file}#{position}", BAD: f"its shard is corrupt: {error}".encode()}

    def __iter__(self) -> Iterator[Sample]:
        for shard in range(len(self.manifest.shards)):
            yield from self.iter_shard(shard)

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global sample indices -> (shard, position within the shard)."""
        starts = np.asarray(self.manifest.shard_starts(), dtype=np.int64)
        shards = np.searchsorted(starts, indices, side="right") - 1
        return shards, indices - starts[shards]

    def prefetch(self, shard: int, store: ShardStore | None, limits: SourceLimits | None) -> None:
        """Ask the kernel to start reading ``shard`` into the page cache while the one before it is
        read: a cold shard's I/O then overlaps the processing of the one before (probes, the epoch
        of benchmarks/exchange.py with cold shards on 2 and 4 ranks: 5-8% shorter). Advice only: a
        shard that cannot be opened is reported when it is read. A staged copy not complete yet is
        left alone (its copying brings it into the cache), and so is a source behind a slow-source
        model (``limits``), which counts every byte read from it."""
        if store is not None:
            staged = store.ready_path(shard)
            if staged is not None:
                advise_willneed(staged)
        elif self._objects is not None:
            self._objects.prefetch(*self.object_names(self.manifest.shards[shard]))
        elif limits is None:
            advise_willneed(self.shard_path(shard))


def open_dataset(path: str | os.PathLike[str], storage: StorageOptions | None = None) -> Dataset:
    """Open the dataset in directory ``path``, or at ``s3://bucket/prefix`` or ``http(s)://host/prefix``
    (reached with ``storage``, else the AWS settings of the environment); check its manifest and that
    every shard is present with its recorded size."""
    dataset = dataset_at(path, storage)
    dataset.check_files()
    return dataset


def dataset_at(path: str | os.PathLike[str], storage: StorageOptions | None = None) -> Dataset:
    """:func:`open_dataset` without looking at the shards (``ddpipe verify`` reports on each)."""
    if not isinstance(path, (str, os.PathLike)):  # pathlib's TypeError said "expected str, bytes or os.PathLike"
        raise OptionError(f"a dataset is a path or a URL, not {type(path).__name__} {path!r}")
    if is_remote(path):
        remote = open_storage(str(path), storage)
        dataset = Dataset(str(path), load_manifest_from(remote), remote)
    else:
        if isinstance(path, str) and not path.strip():  # Path("") is ".": the working directory was taken for it
            raise ManifestError("a dataset's path is empty: name its directory")
        if isinstance(path, str) and "://" in path:  # file:///path; another scheme refused by name, not as a directory
            path = str(parse_location(path).path)
        manifest = load_manifest(path)
        # adopted objects indexed into a local directory (ddpipe index URL --out DIR): read from there
        objects = open_storage(manifest.data_dir, storage) if manifest.data_dir and is_remote(manifest.data_dir) \
            else None
        dataset = Dataset(path, manifest, objects)
    return dataset

