"""``ddpipe index DIR``: adopt a directory of shards another tool wrote, whatever it holds: tar shards,
HDF5 files, or an LMDB environment (plain images, msgpack records, Caffe datums, pickles)."""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

from ..cli import arguments as arg
from ..decode.spec import IMAGE_FIELDS
from ..errors import DdpipeError
from ..manifest import Manifest
from ..storage import is_remote
from ..storage.location import is_web
from .adopt import index_tars, refuse_unwritable_out
from .adopt_hdf5 import HDF5_SUFFIXES, index_hdf5
from .adopt_lmdb import index_lmdb

# what an ImageFolder's class directories hold: the names a sample's image field goes by
_IMAGE_SUFFIXES = tuple(f".{name}" for name in IMAGE_FIELDS)


def what_is_in(path: Path) -> str | None:
    """``"tar"``, ``"hdf5"`` or ``"lmdb"``: what adoptable data a directory (or file) holds, if any;
    ``"images"`` for class directories of images (an ImageFolder, to convert)."""
    if path.is_file():
        path = path.parent
    if not path.is_dir():
        return None
    try:  # first: a directory whose mode refuses a look inside is named as such, not by a file in it
        names = [p.name for p in path.iterdir() if not p.name.startswith(".")]
    except PermissionError as e:
        raise DdpipeError(f"cannot list: {e.strerror}", path=path) from None
    if "data.mdb" in names and (path / "data.mdb").is_file():
        return "lmdb"
    if any(n.endswith(".tar") for n in names):
        return "tar"
    if any(n.lower().endswith(HDF5_SUFFIXES) for n in names):
        return "hdf5"
    # a few of its first entries: a README or a labels file before the class directories is no matter
    if any(_holds_images(path / n) for n in sorted(names)[:8]):
        return "images"
    return None


def _holds_images(directory: Path) -> bool:
    """Whether one of a directory's first entries is an image file (a look, not a walk: a class
    directory may hold a million)."""
    try:
        with os.scandir(directory) as entries:
            return any(e.name.lower().endswith(_IMAGE_SUFFIXES) for e in itertools.islice(entries, 100))
    except OSError:  # not a directory, or one whose mode refuses a look
        return False


def _stage_root(path: Path) -> Path | None:
    """The stage directory ``path`` is (it holds a dataset's copies, each ``ddpipe-HASH`` with the
    staging's lock file) or is one dataset's copies in; None where it is neither."""
    from ..staging.job_lock import LOCK_NAME

    if (path / LOCK_NAME).is_file() and path.name.startswith("ddpipe-"):
        return path.parent
    if path.is_dir() and any((d / LOCK_NAME).is_file() for d in path.glob("ddpipe-*")):
        return path
    return None


def hint(path: Path) -> str | None:
    """The command that adopts what ``path`` holds, for errors of commands that cannot read it."""
    staged = _stage_root(path)
    if staged is not None:  # its tar copies would pass for shards to adopt: a manifest written into the copies
        return f"it is a staging directory (node-local copies of a dataset's shards): check them with " \
               f"`ddpipe verify DATASET --stage-dir {staged}`"
    kind = what_is_in(path)
    if kind is None:
        return None
    where = path if path.is_dir() else path.parent
    if kind == "images":
        return f"it holds images in class directories: make shards of them with `ddpipe convert {where} OUT`"
    extra = {"hdf5": " (name the datasets with --images/--labels if asked)",
             "lmdb": " (--values caffe|msgpack|image|pickle if it cannot tell)", "tar": ""}[kind]
    what = "tar shards" if kind == "tar" else kind.upper()
    return f"it holds {what}: adopt it in place with `ddpipe index {where}`{extra}"


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
