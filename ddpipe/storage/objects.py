"""Objects in a bucket or behind an HTTP server, through obstore (Rust's ``object_store``).

Why obstore: ranged reads issued concurrently from Rust without the interpreter lock, retries with
backoff and jitter built in, S3, GCS, Azure and HTTP behind one API, no Python dependencies (LitData
moved to it for the same reasons). Its clients are not fork-safe, so each process makes its own on
first use (:meth:`ObjectStorage._client`), never before a fork.

Every failure becomes one :class:`StorageError` line naming the object (or the bucket) and what went
wrong; a missing object is a :class:`~ddpipe.errors.MissingShardError`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DdpipeError, MissingShardError
from .location import WEB_SCHEMES, Location
from .settings import S3Settings, StorageOptions

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config


class StorageError(DdpipeError, OSError):
    """An object store refused or failed a request (after its retries)."""


class _RangesRefused(StorageError):
    """The server answered a ranged request with the whole object (a plain HTTP server's way)."""


# where a client without credentials asks the cloud for an instance's (the AWS SDKs' last resort)
_INSTANCE_METADATA = "169.254.169.254"


def _first_line(error: BaseException) -> str:
    """``error``'s message on one line. obstore appends its Rust error chain ("Debug source: ..."),
    dozens of lines whose last message is the cause ("Connection refused"): only that is kept."""
    text, _, chain = str(error).partition("Debug source:")
    text = " ".join(text.split())
    causes = re.findall(r'message: "([^"]+)"', chain)
    if causes and causes[-1] not in text:
        text += f" ({causes[-1]})"
    return text if len(text) <= 300 else text[:297] + "..."


class ObjectStorage:
    """The objects under ``location`` (``s3://`` or ``http(s)://``)."""

    def __init__(self, location: Location, options: StorageOptions, s3: S3Settings | None) -> None:
        if not location.remote:
            raise ValueError(f"{location} is not an object store location")
        if location.scheme == "s3" and s3 is None:
            raise ValueError("an s3:// location needs S3Settings")
        self.location = location
        self.options = options
        self.s3 = s3
        # (the process it was made in, obstore's client): one attribute, set in one step, as threads
        # ask for the client at once (two assignments, store then pid, let another thread see the store
        # with no pid yet and take this process for a forked one)
        self._made: tuple[int, Any] | None = None
        self._whole_only = False  # the server answered a ranged read with the whole object

    def at(self, location: Location) -> ObjectStorage:
        """The same store's settings, aimed at another location (a dataset's data prefix)."""
        return ObjectStorage(location, self.options, self.s3)

    def __getstate__(self) -> dict[str, Any]:  # a client never crosses a process boundary
        return {**self.__dict__, "_made": None}

    @property
    def where(self) -> str:
        """The endpoint, for messages."""
        if self.location.scheme == "s3":
            assert self.s3 is not None
            return self.s3.endpoint or f"AWS S3 ({self.s3.region})"
        return f"{self.location.scheme}://{self.location.bucket}"

    def _client(self) -> Any:
        made = self._made
        if made is not None:
            if made[0] != os.getpid():
                # the parent's runtime threads did not survive the fork: any request would hang
                raise StorageError(f"this process was forked from one that had used {self.where}, and obstore's "
                                   "clients cannot cross a fork: open the dataset in this process (or start "
                                   "workers with the 'spawn' method)", path=self.url())
            return made[1]
        # threads that ask at once may each make one: the last kept, the others used for their request
        store = self._new_client()
        self._made = (os.getpid(), store)
        return store

    def _new_client(self) -> Any:
        from obstore.store import HTTPStore, S3Store

        o = self.options
        retry: RetryConfig = {"max_retries": o.max_retries, "retry_timeout": timedelta(seconds=o.retry_seconds),
                              "backoff": {"init_backoff": timedelta(milliseconds=100),
                                          "max_backoff": timedelta(seconds=10), "base": 2}}
        client: ClientConfig = {"timeout": timedelta(seconds=o.timeout_seconds),
                                "connect_timeout": timedelta(seconds=min(10.0, o.timeout_seconds)),
                                "pool_max_idle_per_host": str(max(o.concurrency, 4))}
        if self.location.scheme == "s3":
            s3 = self.s3
            assert s3 is not None
            config: S3Config = {"region": s3.region, "virtual_hosted_style_request": False}
            if s3.endpoint:
                config["endpoint"] = s3.endpoint
            if s3.access_key_id:
                config["access_key_id"] = s3.access_key_id
                config["secret_access_key"] = s3.secret_access_key or ""
                if s3.session_token:
                    config["session_token"] = s3.session_token
            elif s3.anonymous:
                config["skip_signature"] = True
            client["allow_http"] = s3.allow_http
            return S3Store(self.location.bucket, config=config, client_options=client, retry_config=retry)
        client["allow_http"] = self.location.scheme == "http"
        return HTTPStore.from_url(f"{self.location.scheme}://{self.location.bucket}", client_options=client,
                                  retry_config=retry)

    def url(self, name: str = "") -> str:
        return self.location.url(name)

    def _failed(self, error: BaseException, name: str) -> DdpipeError:
        from obstore import exceptions as ox

        url = self.url(name)
        text = _first_line(error)
        if "PROPFIND" in text and self.location.scheme in WEB_SCHEMES:  # the listing of a plain web server
            return StorageError(f"{self.where} does not list its files (it answers no WebDAV PROPFIND), and adopting "
                                "them in place needs their list: name a bucket by its s3:// URL, or index a copy here",
                                path=url)
        if isinstance(error, ox.NotSupportedError) and "RangeNotSupported" in str(error):
            return _RangesRefused(f"{self.where} does not answer ranged requests", path=url)
        if isinstance(error, (ox.NotFoundError, FileNotFoundError)):
            if "NoSuchBucket" in text:
                return StorageError(f"bucket {self.location.bucket!r} does not exist at {self.where}")
            return MissingShardError(f"no such object at {self.where}", path=url)
        if isinstance(error, (ox.PermissionDeniedError, ox.UnauthenticatedError, PermissionError)) \
                or "AccessDenied" in text \
                or "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text:
            return StorageError(f"access refused by {self.where} (check the credentials): {text}", path=url)
        if _INSTANCE_METADATA in text:  # none found, so the cloud's instance metadata was asked, off the cloud
            return StorageError(f"no credentials for {self.where}: none were given (AWS_ACCESS_KEY_ID and "
                                "AWS_SECRET_ACCESS_KEY, a profile, StorageOptions) and the instance metadata service "
                                "gave none; for a public bucket set AWS_EC2_METADATA_DISABLED=true to send unsigned "
                                f"requests: {text}", path=url)
        return StorageError(f"request to {self.where} failed: {text}", path=url)

    def _call(self, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from obstore import exceptions as ox

        try:
            return fn(self._client(), self.location.key(name), *args, **kwargs)
        except (ox.BaseError, OSError, TimeoutError) as e:
            if isinstance(e, DdpipeError):
                raise
            raise self._failed(e, name) from None

    # ---- reading --------------------------------------------------------------------------------

    def size(self, name: str) -> int:
        import obstore

        return int(self._call(name, obstore.head)["size"])

    def get(self, name: str) -> bytes:
        """A small object whole (a manifest, a tar's index)."""
        import obstore

        result = self._call(name, obstore.get)
        try:
            return bytes(result.bytes())
        except Exception as e:  # the body failed after the headers came
            raise self._failed(e, name) from None

    def chunks(self, name: str, size: int | None = None) -> Iterator[memoryview]:
        """The object's bytes in order, ``chunk_bytes`` at a time, as ranged requests ``concurrency``
        at once: per-request latency is hidden behind the others, and at most ``chunk_bytes x
        concurrency`` bytes are held ahead of the caller."""
        import obstore

        total = self.size(name) if size is None else size
        step, wide = self.options.chunk_bytes, self.options.concurrency
        starts = list(range(0, total, step))
        for i in range(0, len(starts), wide):
            window = starts[i : i + wide]
            ends = [min(s + step, total) for s in window]
            if not self._whole_only:
                try:
                    parts = self._call(name, obstore.get_ranges, starts=window, ends=ends, coalesce=0)
                except _RangesRefused:
                    # a plain HTTP server (python -m http.server, a static file host) answers a range
                    # with the whole object: objects are read whole, one request each, from here on
                    self._whole_only = True
            if self._whole_only:
                yield from self._streamed(name, total, skip=window[0])
                return
            for part in parts:
                yield memoryview(part)

    def _streamed(self, name: str, total: int, skip: int) -> Iterator[memoryview]:
        """The object's bytes from ``skip`` on, from one request for the whole (by a server that does
        not answer ranges); an object of another size than ``total`` is said so, as a ranged read of
        it would fail."""
        import obstore
        from obstore import exceptions as ox

        result = self._call(name, obstore.get)
        seen = 0
        try:
            for chunk in result.stream(min_chunk_size=self.options.chunk_bytes):
                view = memoryview(chunk)[max(0, skip - seen) :]
                seen += len(chunk)
                if seen > total:
                    break
                if len(view):
                    yield view
        except (ox.BaseError, OSError, TimeoutError) as e:  # the body failed after the headers came
            raise self._failed(e, name) from None
        if seen != total:
            holds = f"more than the {total:,} bytes" if seen > total else f"{seen:,} bytes, not the {total:,}"
            raise StorageError(f"the object holds {holds} expected", path=self.url(name))

    def download(self, name: str, dest: Path, size: int | None = None) -> int:
        """Write the object to ``dest`` (under a temporary name, renamed once whole); the bytes. Of
        ``size`` bytes: by ranged requests; size unknown (a small object: an index, a manifest): one
        request for the whole, rather than one for its size and then ranges."""
        from ..formats import atomic

        if size is None:
            data = self.get(name)
            atomic.atomic_write_bytes(dest, data)
            return len(data)
        tmp = atomic.partial_path(dest)
        n = 0
        try:
            with open(tmp, "wb") as out:
                for chunk in self.chunks(name, size):
                    out.write(chunk)
                    n += len(chunk)
            atomic.commit(tmp, dest, durable=False)
        except BaseException:
            atomic.discard(tmp)
            raise
        return n

    def list(self, name: str = "") -> dict[str, int]:
        """Object name (relative to the location) -> size, for every object under ``name``."""
        return {rel: int(meta["size"]) for rel, meta in self._listed(name)}

    def tags(self, name: str = "") -> dict[str, str | None]:
        """Object name -> the entity tag the store gave its last upload (None where it gives none),
        for every object under ``name``: what tells two uploads of the same size apart."""
        return {rel: meta.get("e_tag") for rel, meta in self._listed(name)}

    def _listed(self, name: str) -> Iterator[tuple[str, Any]]:
        """(name relative to the location, obstore's metadata) of every object under ``name``."""
        import obstore

        prefix = self.location.key(name)
        try:
            for page in obstore.list(self._client(), prefix + "/" if prefix else None, chunk_size=1000):
                for meta in page:
                    path = str(meta["path"])
                    yield path[len(self.location.prefix) :].lstrip("/") if self.location.prefix else path, meta
        except Exception as e:
            raise self._failed(e, name) from None

    # ---- writing --------------------------------------------------------------------------------

    def put_file(self, name: str, path: Path) -> str | None:
        """Upload a file: one request, or a multipart upload completed only once every part is in, so
        that no partial object is ever visible under ``name``. Returns the upload's entity tag (as
        :meth:`tags` lists it), None where the store gives none."""
        import obstore

        put = self._call(name, obstore.put, path, chunk_size=max(self.options.chunk_bytes, 5 << 20),
                         max_concurrency=self.options.concurrency)
        tag = put.get("e_tag")
        return None if tag is None else str(tag)

    def put_bytes(self, name: str, data: bytes) -> None:
        import obstore

        self._call(name, obstore.put, data)
