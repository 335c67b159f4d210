from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import ddpipe

from .servers import S3_ENV, RangeServer, moto_endpoint

_names = itertools.count()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server for the session; the AWS variables every client here (and every process
    the tests start) reads point at it, with explicit keys."""
    saved = {k: os.environ.get(k) for k in [*S3_ENV, "AWS_ENDPOINT_URL"]}
    with moto_endpoint() as url:
        os.environ.update(S3_ENV, AWS_ENDPOINT_URL=url)
        try:
            yield url
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    """A new empty bucket: its name."""
    import boto3  # type: ignore[import-untyped]

    name = f"bkt-{os.getpid()}-{next(_names)}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[RangeServer]:
    """An HTTP server of ``tmp_path / "www"``, with ranges and injectable 503s."""
    root = tmp_path / "www"
    root.mkdir()
    server = RangeServer(root)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def local_sets(raw_images: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The session's images converted to each format locally: what a bucket's copy must equal."""
    out = {}
    for fmt in ("wds", "hdf5", "lmdb"):
        root = tmp_path_factory.mktemp("local") / fmt
        ddpipe.convert(raw_images, root, ddpipe.ConvertOptions(format=fmt, samples_per_shard=5, progress=False))
        out[fmt] = root
    return out
