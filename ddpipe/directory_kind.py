"""What a directory holds that ddpipe could make a dataset of, when it holds no ``index.json``: shards
another tool wrote (to adopt in place with ``ddpipe index``), class directories of images (to convert),
or a stage directory's node-local copies; and the command that makes a dataset of it, for the errors
of commands and loaders pointed at such a directory."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from .errors import DdpipeError
from .sample import IMAGE_FIELDS

HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")
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
    from .staging.job_lock import LOCK_NAME  # staging's package builds on the manifest, which builds on this


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
