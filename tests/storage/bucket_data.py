"""What the storage tests share: a dataset's samples by key, a local dataset (or its tars) sent into a bucket, and
a watch on the files a download leaves beside it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from ddpipe.storage import StorageOptions, open_storage

WORKER = Path(__file__).with_name("bucket_worker.py")
FAST_FAIL = StorageOptions(max_retries=1, retry_seconds=2, timeout_seconds=3)


def samples(loader: Iterable[Any]) -> dict[str, tuple[bytes, bytes]]:
    return {s["__key__"]: (bytes(s["jpg"]), bytes(s["cls"])) for batch in loader for s in batch}


def files_here_at_each_download(monkeypatch: pytest.MonkeyPatch, pattern: str) -> list[int]:
    """How many files matching ``pattern`` the download's directory holds once each download is in:
    the list fills as the code under test fetches."""
    from ddpipe.storage.objects import ObjectStorage

    counts: list[int] = []
    fetch = ObjectStorage.download

    def download(self: ObjectStorage, name: str, dest: Path, size: int | None = None) -> int:
        got = fetch(self, name, dest, size)
        counts.append(len(list(dest.parent.glob(pattern))))
        return got

    monkeypatch.setattr(ObjectStorage, "download", download)
    return counts


def upload_tars(local: Path, url: str) -> list[Path]:
    """The tar shards of the dataset in ``local`` sent under ``url`` as another tool leaves tars: without
    the conversion's index.json or the .idx files. Returns them, in order."""
    objects = open_storage(url)
    tars = sorted(local.glob("*.tar"))
    for tar in tars:
        objects.put_file(tar.name, tar)
    return tars


def upload_dir(local: Path, url: str) -> None:
    objects = open_storage(url)
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        objects.put_file(str(path.relative_to(local)), path)
