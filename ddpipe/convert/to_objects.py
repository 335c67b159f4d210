"""``convert`` into a bucket: shards are written to a node-local work directory as for a local output,
and each is uploaded as it is finished, as one object (a multipart upload is completed only once
every part is in, so no half shard is ever visible under its name), then removed there: the node
holds a few shards at a time, not the dataset. ``index.json`` goes last: a reader never finds a
manifest whose shards are not all there.

A conversion stopped part-way is resumed by the same command: the work directory (named after the
output URL, in the temporary directory) keeps the record of each shard finished, and a shard that
is in the bucket with its recorded size (and its sidecars) is neither written nor sent again.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import xxhash

from ..comm import Comm
from ..formats import ShardFormat, get_format
from ..manifest import MANIFEST_NAME, Manifest, manifest_from_text
from ..storage import ObjectStorage
from .shard_job import ShardResult


def work_dir(objects: ObjectStorage) -> Path:
    """Where this node writes the shards of a conversion into ``objects`` before uploading them."""
    return Path(tempfile.gettempdir()) / f"ddpipe-convert-{xxhash.xxh3_64_hexdigest(objects.url().encode())}"


class ShardSender:
    """Sends each shard a conversion into ``objects`` finishes in ``work`` (with its sidecars, such as a
    tar's ``.idx``, the shard last), then removes it there. Sending is a thread's, so that the next
    shard is written meanwhile (one worker, the command's default, would otherwise wait for each
    upload); a shard finished while one is sent waits its turn, and the one after it waits to be
    handed over, so that a few shards are here at most. A failed upload is raised by the next
    ``send`` or by the end of the ``with`` block; the shard stays here, for a rerun to send."""

    QUEUED = 1  # shards finished and waiting while one is sent

    def __init__(self, objects: ObjectStorage, work: Path, fmt: ShardFormat) -> None:
        self.objects, self.work, self.fmt = objects, work, fmt
        self.present = objects.list()  # what an earlier run sent whole: not sent again
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ddpipe-send")
        self._sending: deque[Future[None]] = deque()

    def send(self, result: ShardResult) -> None:
        if result.shard is None:  # every item was skipped: no shard
            return
        while self._sending and (self._sending[0].done() or len(self._sending) > self.QUEUED):
            self._sending.popleft().result()
        self._sending.append(self._thread.submit(self._send, self.work / result.shard.file))

    def _send(self, shard: Path) -> None:
        files = [*self.fmt.sidecar_files(shard), shard]
        for path in files:
            if path.exists() and self.present.get(path.name) != path.stat().st_size:
                self.objects.put_file(path.name, path)
        for path in files:
            path.unlink(missing_ok=True)

    def __enter__(self) -> ShardSender:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        # after an error, the shards not yet sent stay here, for a rerun; else each is waited for
        self._thread.shutdown(wait=True, cancel_futures=kind is not None)
        if kind is None:
            while self._sending:
                self._sending.popleft().result()


def upload(objects: ObjectStorage, work: Path, manifest: Manifest | None, comm: Comm) -> Manifest:
    """Send the shards this rank holds in ``work`` (and their sidecars), then, once every rank has,
    rank 0 sends ``index.json``; every rank returns the manifest (rank 0's, which only it may hold)."""
    text = comm.allgather(manifest.to_json() if manifest is not None and comm.world.rank == 0 else None)[0]
    assert text is not None, "rank 0 finished the conversion"
    manifest = manifest_from_text(text.encode(), objects.url(MANIFEST_NAME))
    fmt = get_format(manifest.format)
    present = objects.list()
    for info in manifest.shards:
        local = work / info.file
        if not local.exists():  # another node's
            continue
        for path in (local, *[p for p in fmt.sidecar_files(local) if p.exists()]):
            name = str(path.relative_to(work))
            if present.get(name) != path.stat().st_size:
                objects.put_file(name, path)
    comm.barrier()
    if comm.world.rank == 0:
        objects.put_bytes(MANIFEST_NAME, manifest.to_json().encode())
    comm.barrier()
    shutil.rmtree(work, ignore_errors=True)
    return manifest
