"""Where a dataset lives: a directory, a bucket prefix (``s3://bucket/prefix``) or an HTTP(S) prefix.

Pure: parsing and joining only; nothing here opens a connection (see ``objects.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

from ..errors import OptionError

REMOTE_SCHEMES = ("s3", "http", "https")
WEB_SCHEMES = ("http", "https")  # read-only, and listed only through WebDAV


@dataclass(frozen=True)
class Location:
    """``scheme`` ``"file"``, ``"s3"``, ``"http"`` or ``"https"``; ``bucket``: the bucket, or the
    host (with its port) of an HTTP server; ``prefix``: the key prefix without slashes at its ends
    (for a file location, the path)."""

    scheme: str
    bucket: str
    prefix: str

    @property
    def remote(self) -> bool:
        return self.scheme in REMOTE_SCHEMES

    @property
    def path(self) -> Path:
        """A file location's directory."""
        if self.remote:
            raise ValueError(f"{self} is not a local path")
        return Path(self.prefix)

    def key(self, name: str = "") -> str:
        """The object key of ``name`` under this prefix."""
        return "/".join(p for p in (self.prefix, name.strip("/")) if p)

    def child(self, name: str) -> Location:
        if not self.remote:
            return Location("file", "", str(Path(self.prefix) / name))
        return Location(self.scheme, self.bucket, self.key(name))

    def url(self, name: str = "") -> str:
        """What error messages and manifests call ``name`` under this location."""
        if not self.remote:
            return str(Path(self.prefix) / name) if name else self.prefix
        return f"{self.scheme}://{self.bucket}/{self.key(name)}"

    def __str__(self) -> str:
        return self.url()


def parse_location(where: str | os.PathLike[str]) -> Location:
    """A location from a path or URL: ``s3://bucket/prefix``, ``http(s)://host[:port]/prefix``,
    ``file:///path`` or a plain path. Anything else is an :class:`OptionError` naming it."""
    if not isinstance(where, str):
        return Location("file", "", os.fspath(where))
    if "://" not in where:
        return Location("file", "", where)
    try:
        parts = split_url(where)
    except ValueError as e:
        raise OptionError(f"{where}: not a URL: {e}") from None
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise OptionError(f"{where}: a file:// URL names a path on this machine (file:///path)")
        return Location("file", "", parts.path)
    if scheme not in REMOTE_SCHEMES:
        raise OptionError(f"{where}: unsupported scheme {parts.scheme!r}; use a path, file://, s3://, http:// or "
                          "https://")
    if not (parts.netloc if scheme == "s3" else parts.hostname):
        raise OptionError(f"{where}: no {'bucket' if scheme == 's3' else 'host'} named")
    if parts.query or parts.fragment:
        raise OptionError(f"{where}: a dataset location takes no query or fragment")
    prefix = parts.path.strip("/")
    if prefix and any(segment in ("", ".", "..") for segment in prefix.split("/")):
        # an object store's keys are names, not paths: it refuses them (obstore raised at the first request)
        raise OptionError(f"{where}: a dataset location's path takes no empty, '.' or '..' segment")
    return Location(scheme, parts.netloc, prefix)


def is_remote(where: str | os.PathLike[str]) -> bool:
    return isinstance(where, str) and where.split("://", 1)[0].lower() in REMOTE_SCHEMES and "://" in where


def is_web(where: str | os.PathLike[str]) -> bool:
    """An ``http(s)://`` location: read-only to ddpipe (a web server takes no uploads it would trust)."""
    return is_remote(where) and str(where).split("://", 1)[0].lower() in WEB_SCHEMES


def split_url(url: str) -> SplitResult:
    """``urlsplit`` with the port parsed as well (urllib parses it only when asked): a ValueError for
    what is no URL ("Invalid IPv6 URL", "Port could not be cast to integer value as 'abc'")."""
    parts = urlsplit(url)
    parts.port  # noqa: B018 (the parse; the value is not needed)
    return parts
