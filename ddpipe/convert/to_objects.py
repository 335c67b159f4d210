"""``convert`` into a bucket: shards are written to a node-local work directory as for a local output,
and each is uploaded as it is finished, as one object (a multipart upload is completed only once
every part is in, so no half shard is ever visible under its name), then removed there: the node
holds a few shards at a time, not the dataset. ``index.json`` goes last: a reader never finds a
manifest whose shards are not all there.

A conversion stopped part-way is resumed by the same command: the work directory (named after the
output URL, in the temporary directory) keeps the record of each shard finished and of each sent,
with the entity tag the bucket gave each of its objects; a shard whose objects the bucket still
holds under those tags is neither written nor sent again. Size alone would not do: an object left
by an earlier conversion of other input can have a new shard's size to the byte (tar counts in
512-byte blocks), and the dataset would hold the old bytes under the new manifest.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import xxhash

from ..comm import Comm
from ..errors import DdpipeError
from ..formats import ShardFormat, get_format
from ..formats.atomic import atomic_write_bytes
from ..manifest import MANIFEST_NAME, Manifest, ShardInfo, manifest_from_text
from ..storage import ObjectStorage
from .shard_job import ShardJob, ShardResult, read_record


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

    def __init__(self, objects: ObjectStorage, work: Path, fmt: ShardFormat, marks: Path) -> None:
        self.objects, self.work, self.fmt, self.marks = objects, work, fmt, marks
        marks.mkdir(parents=True, exist_ok=True)
        self.tags = objects.tags()  # what the bucket holds now, by the tag of each object's upload
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ddpipe-send")
        self._sending: deque[Future[None]] = deque()

    def _mark(self, shard: str) -> Path:
        return self.marks / f"{shard}.json"

    def sent_before(self, job: ShardJob) -> ShardResult | None:
        """An earlier run's result for ``job`` if this work directory sent its shard whole and the
        bucket still holds each of its objects as that upload left it (or the job made no shard)."""
        done = read_record(job)
        if done is None or done.shard is None:
            return done
        try:
            mark = json.loads(self._mark(done.shard.file).read_text())
        except (OSError, ValueError):
            return None
        sent: dict[str, str | None] = mark.get("objects") or {}
        whole = mark.get("checksum") == done.shard.checksum and Path(job.shard_path).name in sent
        return done if whole and all(tag is not None and self.tags.get(name) == tag for name, tag in sent.items()) \
            else None

    def send(self, result: ShardResult) -> None:
        if result.shard is None:  # every item was skipped: no shard
            return
        while self._sending and (self._sending[0].done() or len(self._sending) > self.QUEUED):
            self._sending.popleft().result()
        self._sending.append(self._thread.submit(self._send, result.shard))

    def _send(self, info: ShardInfo) -> None:
        shard = self.work / info.file
        files = [p for p in (*self.fmt.sidecar_files(shard), shard) if p.exists()]
        tags = {path.name: self.objects.put_file(path.name, path) for path in files}
        atomic_write_bytes(self._mark(info.file), json.dumps({"checksum": info.checksum, "objects": tags}).encode())
        for path in files:
            path.unlink()

    def __enter__(self) -> ShardSender:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        # after an error, the shards not yet sent stay here, for a rerun; else each is waited for
        self._thread.shutdown(wait=True, cancel_futures=kind is not None)
        if kind is None:
            while self._sending:
                self._sending.popleft().result()


def agreed_manifest(objects: ObjectStorage, manifest: Manifest | None, comm: Comm) -> tuple[Manifest, str]:
    """The conversion's manifest (which rank 0 wrote, on its node: a rank of another node may hold it
    where a rerun placed the ranks otherwise) on every rank, with a name for this run of the upload
    that every rank shares."""
    offered = comm.allgather((manifest.to_json() if manifest is not None else None, uuid.uuid4().hex))
    text = next((text for text, _ in offered if text is not None), None)
    if text is None:  # every rank alike, so each raises it
        raise DdpipeError("no rank of this job holds the conversion's index.json", path=objects.url(MANIFEST_NAME))
    return manifest_from_text(text.encode(), objects.url(MANIFEST_NAME)), offered[0][1]


def send_leftovers(objects: ObjectStorage, work: Path, manifest: Manifest, run: str) -> None:
    """Send the shards (and their sidecars) still in ``work``: each by the first of the ranks sharing
    this node's work directory to claim it in this ``run`` (each of them would otherwise send all)."""
    fmt = get_format(manifest.format)
    claims = work / f".sending-{run}"
    claims.mkdir(parents=True, exist_ok=True)
    for info in manifest.shards:
        local = work / info.file
        if not local.exists() or not _claimed(claims / info.file):  # sent and removed, another node's, or taken
            continue
        for path in (local, *[p for p in fmt.sidecar_files(local) if p.exists()]):
            objects.put_file(str(path.relative_to(work)), path)


def _claimed(mark: Path) -> bool:
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def publish_manifest(objects: ObjectStorage, manifest: Manifest, work: Path) -> None:
    """Send ``index.json``, once the bucket holds every shard it names whole (at its size): a reader
    never finds a manifest whose shards are not all there. A shard missing (removed from the bucket
    since it was sent, or left unsent in the work directory of a node not in this job) is named."""
    held = objects.list()
    for info in manifest.shards:
        if held.get(info.file) != info.bytes:
            found = "missing" if info.file not in held else f"{held[info.file]:,} bytes, not {info.bytes:,}"
            raise DdpipeError(f"{found}: index.json not sent, as the dataset would not be whole (a node of an "
                              f"earlier run may hold the shard in {work}: convert again with that node in the job, "
                              f"or remove {work} on every node to start over)", path=objects.url(info.file))
    objects.put_bytes(MANIFEST_NAME, manifest.to_json().encode())
