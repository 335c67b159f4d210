"""Where datasets live: local directories, buckets (``s3://``) and HTTP(S) servers, one layer for all.

:func:`open_storage` turns a location into the client that reads and writes its objects; options and
credentials are resolved once, here at the edge (:mod:`settings`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from .cache import ObjectCache
from .location import Location, is_remote, parse_location
from .objects import ObjectStorage, StorageError
from .settings import StorageOptions, resolve_s3


def open_storage(where: str | os.PathLike[str] | Location, options: StorageOptions | None = None,
                 environ: Mapping[str, str] | None = None, home: Path | None = None) -> ObjectStorage:
    """The objects at a remote location. ``environ`` and ``home`` (default: this process's) are where
    AWS settings are looked up, once, here."""
    location = where if isinstance(where, Location) else parse_location(where)
    options = options or StorageOptions()
    s3 = None
    if location.scheme == "s3":
        s3 = resolve_s3(options, os.environ if environ is None else environ, Path.home() if home is None else home)
    return ObjectStorage(location, options, s3)


__all__ = ["Location", "ObjectCache", "ObjectStorage", "StorageError", "StorageOptions", "is_remote",
           "open_storage", "parse_location"]
