"""``ddpipe index`` for data already in a bucket or behind an HTTP server: tars, HDF5 files or an LMDB
environment adopted where they are. Indexing reads every byte (checksums, sample digests, a tar's
member offsets), so the objects are fetched into a temporary directory and indexed there as local
files would be; what indexing made is then written back: ``index.json`` (and a tar's ``.idx``)
beside the objects, or with ``--out`` a manifest in a local directory that names the objects' URL."""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..errors import DdpipeError
from ..manifest import MANIFEST_NAME, Manifest, save_manifest
from ..storage import open_storage


def index_objects(args: argparse.Namespace, index_local: Callable[[argparse.Namespace], Manifest]) -> Manifest:
    objects = open_storage(args.dir)
    listing = {n: s for n, s in objects.list().items() if n != MANIFEST_NAME}
    if not listing:
        raise DdpipeError("no objects here to adopt", path=objects.url())
    with tempfile.TemporaryDirectory(prefix="ddpipe-index-") as tmp:
        root = Path(tmp)
        for name, size in listing.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            objects.download(name, root / name, size)
        try:
            manifest = index_local(argparse.Namespace(**{**vars(args), "dir": str(root), "out": None}))
        except DdpipeError as e:  # named by the object, not by its copy in a directory about to go
            if e.path is not None and Path(e.path).is_relative_to(root):
                e.path = objects.url(Path(e.path).relative_to(root).as_posix())
            raise
        if args.out is not None:  # a manifest kept elsewhere, naming where the objects are
            manifest = dataclasses.replace(manifest, data_dir=objects.url())
            Path(args.out).mkdir(parents=True, exist_ok=True)
            save_manifest(args.out, manifest)
            return manifest
        made = [p for p in root.rglob("*") if p.is_file() and str(p.relative_to(root)) not in listing]
        for path in sorted(made, key=lambda p: p.name == MANIFEST_NAME):  # index.json last
            objects.put_file(str(path.relative_to(root)), path)
    return manifest
