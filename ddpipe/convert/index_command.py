"""``ddpipe index DIR``: adopt a directory of shards another tool wrote, whatever it holds: tar shards,
HDF5 files, or an LMDB environment (plain images, msgpack records, Caffe datums, pickles)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..cli import arguments as arg
from ..directory_kind import hint, what_is_in
from ..errors import DdpipeError
from ..manifest import Manifest
from ..storage import is_remote
from ..storage.location import is_web
from .adopt import index_tars, refuse_a_dataset_ddpipe_wrote, refuse_unwritable_out
from .adopt_hdf5 import index_hdf5
from .adopt_lmdb import index_lmdb


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=arg.path,
                   help="a directory (or s3:// or http(s):// prefix) of tar shards, of HDF5 files, or an "
                        "LMDB environment")
    p.add_argument("--classes", type=arg.local, help="file of class names, one per line, in label order")
    p.add_argument("--out", type=arg.local, default=None,
                   help="write index.json here instead of beside the data (when the data is read-only)")
    g = p.add_argument_group("HDF5")
    g.add_argument("--images", help="the dataset of images, one per row, encoded or uint8 pixels (asked for when "
                   "several)")
    g.add_argument("--labels", help="the dataset of labels: class numbers or names, or one-hot rows")
    g.add_argument("--label-attr", help="an array attribute holding the labels instead (class numbers or names)")
    g = p.add_argument_group("LMDB")
    g.add_argument("--values", choices=["image", "msgpack", "caffe", "pickle"], default=None,
                   help="what each value holds (guessed from the first when not given)")
    g.add_argument("--label-regex", help="for plain images: a pattern with a group (?P<label>...) found in the key")
    g.add_argument("--labels-file", type=arg.local,
                   help="for plain images: a file of 'key label' lines beside data.mdb")
    g.add_argument("--allow-pickle", action="store_true",
                   help="read values that are Python pickles (unpickling runs code: only data you trust)")


def run(args: argparse.Namespace) -> Manifest:
    classes = Path(args.classes).read_text().split() if args.classes else None
    if is_remote(args.dir):
        from .adopt_objects import index_objects

        if args.out is None and is_web(args.dir):  # before any object is listed or fetched
            raise DdpipeError("a web server is read-only to ddpipe, so index.json cannot go beside its files: give "
                              "--out DIR for it (the manifest there names their URL)", path=args.dir)
        if args.out is not None:  # before any object is fetched
            refuse_unwritable_out(Path(args.out))
        return index_objects(args, run, classes)
    root = Path(args.dir)
    if not root.exists():
        raise DdpipeError("no such directory", path=root)
    if not root.is_dir():
        raise DdpipeError("not a directory: give the directory that holds the shards", path=root)
    kind = what_is_in(root)
    out = None if args.out is None else Path(args.out)
    refuse_a_dataset_ddpipe_wrote(root, out)  # before its files are taken for another tool's
    if kind == "tar":
        return index_tars(root, classes=classes, out=out)
    if kind == "hdf5":
        return index_hdf5(root, out=out, images=args.images, labels=args.labels, label_attr=args.label_attr,
                          classes=classes)
    if kind == "lmdb":
        return index_lmdb(root, out=out, values=args.values, label_regex=args.label_regex,
                          labels_file=args.labels_file, allow_pickle=args.allow_pickle, classes=classes)
    if kind == "images":  # not shards to adopt, but what a conversion makes shards of
        raise DdpipeError(f"nothing to adopt: {hint(root)}", path=root)
    found = sorted(p.name for p in root.iterdir())[:8]
    raise DdpipeError(f"nothing to adopt: no .tar shards, HDF5 files or LMDB data.mdb; found "
                      f"{', '.join(found) or 'an empty directory'}", path=root)


def main(args: argparse.Namespace) -> int:
    """The command: adopt, then say what was adopted."""
    m = run(args)
    what = {"wds": "tar shards", "hdf5-foreign": "HDF5 file(s)", "lmdb-foreign": "LMDB environment"}[m.format]
    where = "" if args.out is None else f" (its index.json in {args.out})"
    print(f"{args.dir}: indexed {len(m.shards)} {what}, {m.num_samples} samples, in place{where}; "
          f"fields {', '.join(m.fields)}")
    if "cls" not in m.fields:  # found out now, not when training refuses the dataset
        how = {"hdf5-foreign": "; name them with --labels or --label-attr (class numbers or names, one per image, "
                               "or one-hot rows)",
               "wds": " (each sample's .cls file)"}.get(m.format, "")
        print(f"ddpipe: warning: {args.dir}: no labels found, which training needs{how}", file=sys.stderr)
    return 0
