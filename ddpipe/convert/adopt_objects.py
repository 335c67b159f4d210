"""``ddpipe index`` for data already in a bucket or behind an HTTP server: tars, HDF5 files or an LMDB
environment adopted where they are. Indexing reads every byte (checksums, sample digests, a tar's
member offsets), so the objects are fetched into a temporary directory and indexed there as local
files would be; what indexing made is then written back: ``index.json`` (and a tar's ``.idx``)
beside the objects, or with ``--out`` a manifest in a local directory that names the objects' URL.

Tar shards are fetched one at a time, the next while one is read, and each is removed once read: a
bucket of ImageNet's tars is 140 GB, more than a node's temporary directory holds. HDF5 files are
fetched one at a time too (twice each where their labels are class names, which are found across
them all before any file's samples are numbered); an LMDB environment (one file) is fetched whole."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..errors import ChangedShardsWarning, DdpipeError, ManifestError
from ..manifest import MANIFEST_NAME, Manifest, manifest_from_text, save_manifest
from ..storage import ObjectStorage, open_storage
from ..units import size_text
from .adopt import (
    AdoptedTar,
    adopt_tar,
    indexes_named_at_the_end,
    recorded_classes,
    recorded_manifest,
    refuse_if_converted,
    tar_names,
    tars_manifest,
    warn_of_changed_shards,
)
from .adopt_hdf5 import hdf5_names, index_hdf5


def index_objects(args: argparse.Namespace, index_local: Callable[[argparse.Namespace], Manifest],
                  classes: list[str] | None) -> Manifest:
    objects = open_storage(args.dir)
    everything = objects.list()
    listing = {n: s for n, s in everything.items() if n != MANIFEST_NAME}
    if not listing:
        raise DdpipeError("no objects here to adopt", path=objects.url())
    top = {n for n in listing if "/" not in n}
    beside = objects.get(MANIFEST_NAME) if MANIFEST_NAME in everything else None  # fetched once, for both uses
    replaced = _manifest_replaced(args.out, beside, objects)
    with tempfile.TemporaryDirectory(prefix="ddpipe-index-") as tmp:
        root = Path(tmp)
        with _named_by_url(root, objects), warnings.catch_warnings():
            warnings.simplefilter("ignore", ChangedShardsWarning)  # said below, naming the objects, not their copies
            # as a directory of them is told apart
            tars = tar_names(top) if "data.mdb" not in top else []
            h5 = hdf5_names(top) if "data.mdb" not in top and not tars else []
            largest = sorted((listing[n] for n in tars or h5), reverse=True)
            # a tar shard read while the next is fetched, an HDF5 file on its own; an LMDB whole
            _room_for(sum(largest[:2 if tars else 1]) if largest else sum(listing.values()), root, objects)
            _bring_recorded_manifest(args.out, beside, root)
            fetched: set[str] = set()  # each tar or HDF5 file removed once read: what is left is made here
            if tars:
                if classes is None:
                    classes = recorded_classes(root)
                with indexes_named_at_the_end() as adopted:
                    _adopt_tars(objects, tars, listing, root, adopted)
                    manifest = tars_manifest(adopted, classes, objects.url())
                save_manifest(root, manifest)
            elif h5:
                with _OneAtATime(objects, listing, root) as one:
                    manifest = index_hdf5(root, images=args.images, labels=args.labels, label_attr=args.label_attr,
                                          classes=classes, fetched=(h5, one.fetched))
            else:
                fetched = set(listing)
                for name, size in listing.items():
                    (root / name).parent.mkdir(parents=True, exist_ok=True)
                    objects.download(name, root / name, size)
                manifest = index_local(argparse.Namespace(**{**vars(args), "dir": str(root), "out": None}))
        warn_of_changed_shards(replaced, manifest, str(Path(args.out) / MANIFEST_NAME) if args.out is not None
                               else objects.url(MANIFEST_NAME))
        if args.out is not None:  # a manifest kept elsewhere, naming where the objects are
            manifest = dataclasses.replace(manifest, data_dir=objects.url())
            Path(args.out).mkdir(parents=True, exist_ok=True)
            save_manifest(args.out, manifest)
            return manifest
        made = [p for p in root.rglob("*") if p.is_file() and str(p.relative_to(root)) not in fetched]
        for path in sorted(made, key=lambda p: p.name == MANIFEST_NAME):  # index.json last
            objects.put_file(str(path.relative_to(root)), path)
    return manifest


def _adopt_tars(objects: ObjectStorage, names: list[str], listing: dict[str, int], root: Path,
                adopted: list[AdoptedTar]) -> None:
    """Each tar shard ``names`` lists fetched into ``root`` (the next while one is read), adopted into
    ``adopted``, and removed: its ``.idx`` stays, to be written beside it once every shard is adopted."""
    with ThreadPoolExecutor(1, thread_name_prefix="ddpipe-index-fetch") as fetcher:
        def fetch(name: str) -> Future[int]:
            return fetcher.submit(objects.download, name, root / name, listing[name])

        coming = fetch(names[0])
        try:
            for i, name in enumerate(names):
                coming.result()
                if i + 1 < len(names):
                    coming = fetch(names[i + 1])
                adopted.append(adopt_tar(root / name))
                (root / name).unlink()
        finally:
            coming.cancel()  # an error: the next shard is not fetched for nothing, if not begun


class _OneAtATime:
    """Objects fetched into ``root`` as indexing asks for each, one kept at a time (asked for again
    while kept, it is not fetched again); the last removed at the end."""

    def __init__(self, objects: ObjectStorage, listing: dict[str, int], root: Path) -> None:
        self.objects, self.listing, self.root = objects, listing, root
        self.held: Path | None = None

    @contextlib.contextmanager
    def fetched(self, path: Path) -> Iterator[None]:
        if path != self.held:
            self._drop()
            name = path.relative_to(self.root).as_posix()
            self.objects.download(name, path, self.listing[name])
            self.held = path
        yield

    def _drop(self) -> None:
        if self.held is not None:
            self.held.unlink(missing_ok=True)
            self.held = None

    def __enter__(self) -> _OneAtATime:
        return self

    def __exit__(self, *exc: object) -> None:
        self._drop()


def _manifest_replaced(out: str | None, beside: bytes | None, objects: ObjectStorage) -> Manifest | None:
    """The manifest that indexing the objects would replace (in ``out``, else the one among the
    ``objects``, whose bytes are ``beside``, where they hold one). Either written by a conversion is
    refused, before any object is fetched."""
    recorded = None
    if beside is not None:
        with contextlib.suppress(ManifestError):  # not ddpipe's: refused in its own words where classes are read
            recorded = manifest_from_text(beside, objects.url(MANIFEST_NAME))
        if recorded is not None:
            refuse_if_converted(recorded, objects.url())
    if out is not None:
        recorded = recorded_manifest(Path(out))
        if recorded is not None:
            refuse_if_converted(recorded, str(Path(out)))
    return recorded


def _bring_recorded_manifest(out: str | None, beside: bytes | None, root: Path) -> None:
    """The manifest already where this one goes (in ``out``, else the one among the objects, whose
    bytes are ``beside``) beside the objects indexed in ``root``, as in a directory: indexing again
    keeps its class names."""
    if out is not None:
        if recorded_classes(Path(out)) is not None:  # checked there, named by its path there
            shutil.copyfile(Path(out) / MANIFEST_NAME, root / MANIFEST_NAME)
    elif beside is not None:
        (root / MANIFEST_NAME).write_bytes(beside)


def _room_for(needed: int, root: Path, objects: ObjectStorage) -> None:
    """Refuse, before fetching, what the temporary directory has no room for: the disk filled part-way,
    in an error naming a file in a directory the user never gave."""
    free = shutil.disk_usage(root).free
    if needed > free:
        raise DdpipeError(f"adopting fetches the objects into {root.parent} first, {size_text(needed)} at once, but "
                          f"it has {size_text(free)} free: set TMPDIR to a directory with room", path=objects.url())


@contextlib.contextmanager
def _named_by_url(root: Path, objects: ObjectStorage) -> Iterator[None]:
    """Errors named by the object, not by its copy in a directory about to go."""
    try:
        yield
    except DdpipeError as e:
        if e.path is not None and Path(e.path).is_relative_to(root):
            e.path = objects.url(Path(e.path).relative_to(root).as_posix())
        raise
