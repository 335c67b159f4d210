"""Shard formats behind one interface, found by name through a small lazy registry.

``wds`` (WebDataset tar), ``hdf5`` and ``lmdb``. Modules load on first use, so reading tar shards
never imports h5py, and a missing library is reported with the package to install.
"""

from __future__ import annotations

import importlib

from ..errors import DdpipeError
from .base import ShardFormat, ShardReader, ShardWriter

# name -> (module, class, pip package that provides its library)
_REGISTRY: dict[str, tuple[str, str, str]] = {
    "wds": ("ddpipe.formats.tar", "TarFormat", "webdataset"),
    "hdf5": ("ddpipe.formats.hdf5", "HDF5Format", "h5py"),
    "lmdb": ("ddpipe.formats.lmdb", "LMDBFormat", "lmdb msgpack"),
}
# read in place, never written: files other tools wrote, adopted by ``ddpipe index``
_ADOPTED: dict[str, tuple[str, str, str]] = {
    "hdf5-foreign": ("ddpipe.formats.foreign_hdf5", "ForeignHDF5Format", "h5py"),
    "lmdb-foreign": ("ddpipe.formats.foreign_lmdb", "ForeignLMDBFormat", "lmdb msgpack"),
}

FORMAT_NAMES: tuple[str, ...] = tuple(_REGISTRY)  # the formats ddpipe writes


def get_format(name: str) -> ShardFormat:
    """The format called ``name`` (one of :data:`FORMAT_NAMES`)."""
    try:
        module_name, class_name, package = {**_REGISTRY, **_ADOPTED}[name]
    except KeyError:
        raise DdpipeError(f"unknown format {name!r}; choose one of {', '.join(FORMAT_NAMES)}") from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise DdpipeError(f"format {name!r} needs {e.name or package}: pip install {package}") from e
    fmt: ShardFormat = getattr(module, class_name)()
    return fmt


__all__ = ["FORMAT_NAMES", "ShardFormat", "ShardReader", "ShardWriter", "get_format"]
