"""``ddpipe index`` for an LMDB environment that another tool wrote: a manifest beside it (or in a
directory the user names), never a copy. Adoption reads every record once: it hashes the file,
records each record's digest, counts the samples, finds the labels (in the values, or in the keys
by a pattern that must fit every key) and records every ``SEEK_EVERY``-th key, where a rank's scan
can start."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

from ..checksum import file_checksum, pack_digests, sample_digest
from ..errors import DdpipeError
from ..manifest import Manifest, ShardInfo, label_runs
from .adopt import given_or_recorded, refuse_read_only, write_adopted
from .classes import class_order, named_classes, refuse_negative

# an adopted LMDB's manifest records every SEEK_EVERY-th key, so that a rank whose share starts at
# sample p seeks near it and walks at most SEEK_EVERY - 1 records, instead of reading every value
# before p (ImageNet: 20,000 keys, ~0.6 MB of manifest)
SEEK_EVERY = 64
# where plain-image LMDBs usually keep the label in the key: "<label>/<name>", "<name>_<label>"
KEY_LABEL_PATTERNS = (r"^(?P<label>\d+)[/_]", r"[/_](?P<label>\d+)$")


def _keys(mdb: Path) -> list[str]:
    """The environment's sample keys, as text (keys only: no value is read)."""
    from ..formats.lmdb_env import lease_environment
    from ..formats.lmdb_values import META_KEY

    with lease_environment(mdb) as lease, lease.env.begin() as txn:
        return [bytes(k).decode("utf-8", errors="replace")
                for k in txn.cursor().iternext(keys=True, values=False) if not META_KEY.match(k)]


def _key_labels(pattern: str, keys: list[str], mdb: Path) -> set[str]:
    """The distinct labels ``pattern``'s ``label`` group finds in ``keys``; every key must match."""
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise DdpipeError(f"--label-regex {pattern!r} is not a regular expression: {e}", path=mdb) from None
    if "label" not in compiled.groupindex:
        raise DdpipeError(f"--label-regex {pattern!r} has no group (?P<label>...)", path=mdb)
    found = set()
    for key in keys:
        m = compiled.search(key)
        if m is None:
            raise DdpipeError(f"the key {key!r} does not match the label pattern {pattern!r}", path=mdb)
        found.add(m.group("label"))
    return found


def _guess_label_pattern(keys: list[str], mdb: Path) -> str:
    """The one pattern of :data:`KEY_LABEL_PATTERNS` whose labels look like classes: every key matches
    and there are at most half as many classes as samples (a number that differs from key to key is
    an index, not a label). None plausible, or several, and the user is asked, shown what was seen."""
    plausible, seen = [], []
    for pattern in KEY_LABEL_PATTERNS:
        try:
            labels = _key_labels(pattern, keys, mdb)
        except DdpipeError:
            continue
        seen.append(f"{pattern!r} gives {len(labels)} classes")
        if len(labels) <= max(len(keys) // 2, 1):
            plausible.append(pattern)
    if len(plausible) == 1:
        return plausible[0]
    shown = ", ".join(repr(k) for k in keys[:3])
    what = "; ".join(seen) if seen else "no number in them"
    raise DdpipeError(f"the values hold no labels and the keys ({shown}, ... {len(keys)} in all) do not tell them "
                      f"for sure ({what}): give --label-regex with a group (?P<label>...) or --labels-file "
                      "(lines of 'key label')", path=mdb)


def _numbered(stored: list[int | str], layout: dict[str, Any], classes: list[str] | None,
              given: list[str] | None, mdb: Path) -> list[int]:
    """Records' labels stored as class names, as class numbers: the names become the classes
    (:func:`class_order`, recorded as the layout's ``label_names``); strings of digits are numbers."""
    if not all(isinstance(v, str) for v in stored):
        raise DdpipeError("the records' labels mix class numbers and class names", path=mdb)
    names = {str(v) for v in stored}
    if all(name.isdecimal() for name in names):
        return [int(v) for v in stored]
    layout["label_names"] = order = class_order(names, classes, given, mdb)
    number = {name: i for i, name in enumerate(order)}
    return [number[str(v)] for v in stored]


def index_lmdb(data: Path, *, out: Path | None = None, values: str | None = None, label_regex: str | None = None,
               labels_file: str | None = None, allow_pickle: bool = False,
               classes: list[str] | None = None, seek_every: int = SEEK_EVERY) -> Manifest:
    """Adopt the LMDB environment in directory ``data`` (its ``data.mdb``: one shard) in place.
    ``seek_every``: record every that-many-th sample's key, where a rank's scan can start."""
    import lmdb

    from ..formats.foreign_lmdb import ForeignLMDBReader
    from ..formats.lmdb_env import lease_environment
    from ..formats.lmdb_values import META_KEY, RecordError, guess_kind, read_value, sniff_image_field

    refuse_read_only(data, out)
    # an explicit label source replaces what an earlier index recorded, class names included
    explicit = label_regex is not None or labels_file is not None
    given = classes
    classes = classes if explicit else given_or_recorded(classes, data, out)
    mdb = data / "data.mdb"
    try:
        # the process's one environment of the file (formats/lmdb_env.py)
        with lease_environment(mdb) as lease, lease.env.begin() as txn:
            first = next(((bytes(k), bytes(v)) for k, v in txn.cursor() if not META_KEY.match(k)), None)
    except (lmdb.Error, OSError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).split(": ")[-1]
        raise DdpipeError(f"not a readable LMDB environment: {why}", path=mdb) from None
    if first is None:
        raise DdpipeError("the LMDB environment holds no records", path=mdb)
    kind = values or guess_kind(first[1])
    if kind is None:
        raise DdpipeError(f"cannot tell what the values hold (the first, {first[0]!r}, starts {first[1][:8]!r}): "
                          "name it with --values image|msgpack|caffe|pickle", path=mdb)
    if kind == "pickle" and not allow_pickle:
        raise DdpipeError("the values are Python pickles: unpickling runs code stored in the file, so ddpipe reads "
                          "them only with --allow-pickle, for data you trust", path=mdb)
    try:
        image, label = read_value(kind, first[1])
    except RecordError as e:  # --values named another kind (a guessed kind reads its first value)
        raise DdpipeError(f"--values {kind} does not read the first record ({first[0]!r}): {e}", path=mdb) from None
    named = isinstance(label, str)  # the records' labels are class names (or digits), mapped once all are seen
    layout: dict[str, Any] = {"values": kind, "field": sniff_image_field(image) or "jpg"}
    if kind == "image" or label is None:
        if labels_file is not None:
            layout["labels_file"] = labels_file
        else:
            keys = _keys(mdb)
            pattern = label_regex if label_regex is not None else _guess_label_pattern(keys, mdb)
            names = _key_labels(pattern, keys, mdb)
            if not all(n.isdecimal() for n in names):  # class names in the keys: they become the classes
                layout["label_names"] = classes = class_order(names, classes, given, mdb)
            layout["label_regex"] = pattern
    stored: list[int | str] = []
    digests, seek_keys = [], []
    layout["digests"] = "records"  # over each record as stored: a reader checks a record before parsing it
    with ForeignLMDBReader(mdb, {**layout, "source_dir": str(data)}) as reader:
        for i, (raw, record) in enumerate(reader.records()):  # every record read: a bad one is named now
            digests.append(sample_digest(record))
            stored.append(reader.stored_label(record) if named else int(reader.parse(record)["cls"]))
            if i % seek_every == 0:
                seek_keys.append(base64.b64encode(raw).decode("ascii"))
        count = len(reader)
    labels = _numbered(stored, layout, classes, given, mdb) if named else [int(v) for v in stored]
    refuse_negative(labels, mdb)
    classes = layout.get("label_names", classes)
    layout.update(seek_every=seek_every, seek_keys=seek_keys)
    manifest = Manifest(format="lmdb-foreign", fields=tuple(sorted({layout["field"], "cls"})),
                        classes=named_classes(max(labels, default=-1), count, classes, data),
                        shards=(ShardInfo(mdb.name, count, mdb.stat().st_size, file_checksum(mdb),
                                          label_runs(labels), pack_digests(digests)),),
                        layout={**layout, "samples": count})
    return write_adopted(data, out, manifest)
