"""One shard of a conversion: the job that says what goes in it (a worker process may run it), its
result, and the record that lets a rerun keep it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..checksum import file_checksum
from ..errors import SourceError
from ..formats import get_format
from ..formats.atomic import Finished, atomic_write_bytes, discard, partial_path
from ..manifest import ShardInfo, SkippedItem, label_runs
from ..sample import label_of
from .sources import ItemLoader, SourceItem


@dataclass(frozen=True)
class ShardJob:
    """Everything a (possibly separate) process needs to write one shard."""

    source_kind: str
    source_root: str
    items: tuple[SourceItem, ...]
    shard_path: str
    record_path: str
    format: str
    on_error: str
    fingerprint: str
    decode_check: bool = True


@dataclass
class ShardResult:
    shard: ShardInfo | None  # None when every item was skipped
    fields: list[str] = field(default_factory=list)
    skipped: list[SkippedItem] = field(default_factory=list)
    reused: bool = False
    finished: Finished | None = None  # written, not yet flushed nor named: publish() does it


def read_record(job: ShardJob) -> ShardResult | None:
    """What an earlier run recorded of this job's shard, if it ran the same job; its file unchecked."""
    try:
        doc = json.loads(Path(job.record_path).read_text())
    except (OSError, ValueError):
        return None
    if doc.get("fingerprint") != job.fingerprint:
        return None
    skipped = [SkippedItem(**s) for s in doc["skipped"]]
    shard = None if doc["shard"] is None else ShardInfo.from_dict(doc["shard"])
    return ShardResult(shard, doc["fields"] if shard is not None else [], skipped, reused=True)


def load_record(job: ShardJob) -> ShardResult | None:
    """The result of an earlier run's finished shard, if its record and file (with its sidecars) still agree."""
    done = read_record(job)
    if done is None or done.shard is None:
        return done
    path = Path(job.shard_path)
    if not path.is_file() or path.stat().st_size != done.shard.bytes \
            or any(not p.is_file() for p in get_format(job.format).sidecar_files(path)):
        return None
    return done if file_checksum(path) == done.shard.checksum else None


def write_shard(job: ShardJob, on_item: Callable[[], None] | None = None, *, commit: bool = True) -> ShardResult:
    """Write one shard (or reuse it from an earlier run); top-level so worker processes can run it.
    ``commit=False`` leaves it finished but not yet flushed nor named (``ShardResult.finished``), for
    :func:`publish` in the process that gathers the results: a worker does not wait for the disk."""
    done = load_record(job)
    if done is not None:
        return done
    fmt = get_format(job.format)
    loader = ItemLoader(job.source_kind, job.source_root, job.decode_check)
    fields: set[str] = set()
    skipped: list[SkippedItem] = []
    labels: list[int] = []
    writer = fmt.writer(job.shard_path)
    try:
        for item in job.items:
            try:
                sample = loader.load(item)
            except SourceError as e:
                if job.on_error != "skip":  # a stray notes file in a class directory, often
                    raise SourceError(f"{e.message} (--on-error skip leaves such files out and lists "
                                      "them in index.json)", path=e.path) from None
                skipped.append(SkippedItem(item.path, e.message))
            else:
                writer.write(sample)
                fields.update(k for k in sample if k != "__key__")
                labels.append(label_of(sample))
            if on_item is not None:
                on_item()
        finished = writer.finish()
    except BaseException:
        writer.abort()
        raise
    finally:
        loader.close()
    info: ShardInfo | None = None
    if writer.count:
        checksum, digests = fmt.written_checksums(writer.tmp_path)
        info = ShardInfo(Path(job.shard_path).name, writer.count, writer.tmp_path.stat().st_size, checksum,
                         label_runs(labels), digests)
    else:  # every item was skipped: no shard at all, nor one an earlier run left under its name
        finished.discard()
        for p in [Path(job.shard_path), *fmt.sidecar_files(job.shard_path)]:
            p.unlink(missing_ok=True)
    result = ShardResult(info, sorted(fields), skipped, finished=finished if info else None)
    return publish(job, result) if commit else result


def publish(job: ShardJob, result: ShardResult) -> ShardResult:
    """Make a shard :func:`write_shard` finished durable and name it, then record it for a rerun."""
    if result.reused:
        return result
    if result.finished is not None:
        result.finished.commit()
    record = {"fingerprint": job.fingerprint, "shard": result.shard.to_dict() if result.shard else None,
              "fields": result.fields, "skipped": [asdict(s) for s in result.skipped]}
    atomic_write_bytes(job.record_path, json.dumps(record, sort_keys=True).encode())
    return replace(result, finished=None)


def discard_partial(job: ShardJob) -> None:
    """Remove what a worker stopped while writing ``job`` left under hidden names."""
    for path in [Path(job.shard_path), *get_format(job.format).sidecar_files(job.shard_path)]:
        discard(partial_path(path))
