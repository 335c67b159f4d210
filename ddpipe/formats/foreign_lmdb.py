"""LMDB environments written by other tools, read in place (``ddpipe index`` adopts them).

One environment (its ``data.mdb``) is one shard; samples are its records in key order, skipping
keys such as ``__keys__`` and ``__len__`` that tools store beside the samples. The manifest's
``layout`` says what a value holds (``"values"``: see :mod:`.lmdb_values`) and, for plain encoded
images, where the label is: ``"label_regex"`` (a pattern with a group ``label`` matched against the
key) or ``"labels_file"`` (lines of ``key label`` in a file beside ``data.mdb``).
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from ..errors import CorruptShardError
from ..fields import checked, whole_number
from ..sample import KEY, Sample, sanitize_key
from .base import AdoptedFormat, ShardReader
from .learnt import FileVersion, Learnt, LearntOfFile
from .lmdb_env import EnvironmentLease, MappedRecords, lease_environment
from .lmdb_labels import LabelSource
from .lmdb_places import MappedKeys, PlacedRecords, Placement
from .lmdb_tree import Tree, TreeError, tree_keys
from .lmdb_values import META_KEY, VALUE_KINDS, RecordError, read_value

# an unparsed record's fields (see ShardReader.parse): the key as stored and the value
STORED_KEY, RECORD = "__lmdb_key__", "__record__"


# records' places turned into ints a chunk at a time, not a whole adopted dataset's at once
_PLACES_CHUNK = 1 << 16


# what a random read learns of an adopted file: where its records lie, and which of them are samples
PlacedSamples = tuple[Placement, np.ndarray]


class ForeignLMDBReader(ShardReader):
    """Reads an adopted LMDB file through its environment, taken as it is first needed. A reader of a
    file read sample by sample (or unchecked) is given ``learnt``, where the records lie in its
    version of the file, if a reader of it found them before (learnt.py): one whose placement is
    known reads its records there without opening the environment or walking the file's tree, and
    one that found a placement keeps it for the next. One adopted file may hold a
    whole dataset, of which a rank of a global shuffle reads a share every epoch: opening it, walking
    its tree and sorting its samples from the tools' own records cost, for each epoch, in proportion
    to the dataset and not to the share."""

    def __init__(self, path: str | os.PathLike[str], layout: dict[str, Any],
                 learnt: LearntOfFile[PlacedSamples] | None = None,
                 label_sources: Learnt[FileVersion, LabelSource] | None = None) -> None:
        super().__init__(path)
        self._kind = str(layout.get("values", "image"))
        self._field = str(layout.get("field", "jpg"))
        self._n = int(layout.get("samples", -1))
        # the manifest's digests are over each record as stored: scans give records unparsed, for the
        # dataset to check before it parses them (a changed value is refused before it is read)
        self._records_checked = layout.get("digests") == "records" and self._kind != "image"
        self._placed: PlacedRecords | None = None  # made on the first random read
        self._own_placed = False  # made by this reader from a known placement, not its environment's
        self._samples = np.zeros(0, dtype=np.int64)  # the records that are samples, by position (not the metadata)
        self._learnt = learnt
        self._known = learnt.known if learnt is not None else None
        self._leased: EnvironmentLease | None = None
        # where a scan may start: every seek_every-th sample's key (recorded by ddpipe index)
        self._seek_every = int(layout.get("seek_every", 0))
        self._seek_keys = [base64.b64decode(k) for k in layout.get("seek_keys", ())]
        try:
            # the label side file lives with the source data, not with a staged copy of data.mdb
            self._labels = LabelSource.of(layout, Path(layout.get("source_dir", self.path.parent)), label_sources)
        except (OSError, re.error, KeyError) as e:
            raise self._corrupt(f"unreadable LMDB environment: {e}") from None
        if self._known is None:  # opened now, where nothing vouches for the file: a damaged one is said at once
            self._take_lease()
        if self._n < 0:
            self._n = len(self._known[1]) if self._known is not None else len(self._sample_keys())

    @property
    def _lease(self) -> EnvironmentLease:
        return self._take_lease()

    def _take_lease(self) -> EnvironmentLease:
        """The file's environment, taken the first time it is needed."""
        if self._leased is None:
            try:
                self._leased = lease_environment(self.path)
            except CorruptShardError:
                raise
            except (lmdb.Error, OSError) as e:
                raise self._corrupt(f"unreadable LMDB environment: {e}") from None
        return self._leased

    def __len__(self) -> int:
        return self._n

    def _sample_keys(self) -> list[bytes]:
        """The samples' keys in LMDB's order, from the file's leaf pages (lmdb_tree.tree_keys: LMDB's
        cursor would read every record's first page)."""
        try:
            keys = tree_keys(self.path)
        except (TreeError, OSError) as e:
            raise self._corrupt(f"unreadable LMDB environment: {e}") from None
        return [key for key in keys if not META_KEY.match(key)]

    def _sample(self, key: bytes, value: bytes | memoryview) -> Sample:
        if self._records_checked:
            return {KEY: sanitize_key(key.decode("utf-8", errors="replace")), STORED_KEY: key, RECORD: value}
        return self._parsed(key, value)

    def parse(self, sample: Sample) -> Sample:
        if RECORD not in sample:
            return sample
        return self._parsed(bytes(sample[STORED_KEY]), sample[RECORD])

    def stored_label(self, sample: Sample) -> int | str:
        """The label an unparsed record (of :meth:`records`) holds as stored, a class name as text;
        the record checked as :meth:`parse` checks it."""
        text = bytes(sample[STORED_KEY]).decode("utf-8", errors="replace")
        try:
            _, label = read_value(self._kind, sample[RECORD])
        except RecordError as e:
            raise self._corrupt(f"record {text!r}: {e}") from None
        if label is None:
            raise self._corrupt(f"record {text!r}: no label, where the first record has one")
        return label

    def _parsed(self, key: bytes, value: bytes | memoryview) -> Sample:
        """The sample a record holds; its image a view where the record is one (a JPEG stored whole, an
        encoded Caffe ``Datum``'s data), else bytes."""
        text = key.decode("utf-8", errors="replace")
        try:
            data, stored = read_value(self._kind, value)
            label = self._labels.named(stored) if isinstance(stored, str) else stored
            if label is None:
                label = self._labels.label(text)
        except RecordError as e:
            raise self._corrupt(f"record {text!r}: {e}") from None
        sample: Sample = {KEY: sanitize_key(text), self._field: data}
        if label is not None:
            sample["cls"] = b"%d" % label
        return sample

    def __getitem__(self, index: int) -> Sample:
        i = self._check_index(index)
        if self._placed is None:  # the keys and where each value lies, from the tree's pages
            try:
                self._placed, self._samples = self._records()
            except (TreeError, OSError) as e:
                raise self._corrupt(f"unreadable LMDB environment: {e}") from None
        if i >= len(self._samples):
            raise self._corrupt(f"holds {len(self._samples)} records, not {self._n}")
        record = int(self._samples[i])
        try:
            return self._sample(self._placed.keys[record], self._placed.value(record))
        except (TreeError, OSError) as e:
            raise self._corrupt(f"cannot read record {i}: {e}") from None

    def _records(self) -> tuple[PlacedRecords, np.ndarray]:
        """Where each record lies, and which records are samples: as found before in this version of
        the file (read there without an environment: see the class), else as the environment's walk
        found them, then kept for the next reader."""
        learnt = self._learnt
        if self._known is not None and learnt is not None and self._leased is None:
            placement, samples = self._known
            self._own_placed = True
            return PlacedRecords(self.path, learnt.identity, placement=placement), samples
        records = self._lease.records()
        samples = np.fromiter((j for j, key in enumerate(records.keys) if not META_KEY.match(key)), dtype=np.int64)
        if self._known is None and learnt is not None \
                and self._lease.identity == learnt.identity:  # the file opened is the version named
            learnt.learn((records.placement, samples), len(samples))
        return records, samples

    def scan(self, start: int = 0) -> Iterator[Sample]:
        return (sample for _, sample in self.records(start))

    def scan_views(self, start: int = 0) -> Iterator[Sample]:
        """:meth:`scan`, each record a view of the file where LMDB maps it (held open by the view), so
        that an image stored whole, or in an encoded ``Datum``, reaches DALI uncopied; where that
        mapping is not found (a file without records), copies as :meth:`scan` gives."""
        placed = self._placed_walk_from(start)
        if placed is not None:  # its values are views of that mapping already
            for key, value in placed:
                yield self._sample(bytes(key), value)
            return
        mapping = self._lease.mapping()
        if mapping is None:
            yield from self.scan(start)
            return
        records = MappedRecords(mapping)  # where the cursor's buffers, valid until it moves, lie in it
        for key, value in self._cursor_walk(start, buffers=True):
            at = records.place(value)
            yield self._sample(bytes(key), records.whole[at : at + len(value)] if at is not None else bytes(value))

    def records(self, start: int = 0) -> Iterator[tuple[bytes, Sample]]:
        """:meth:`scan` with each sample's key as stored (``ddpipe index`` records some, to seek by)."""
        for key, value in self._walk(start, buffers=False):
            stored = bytes(key)
            yield stored, self._sample(stored, bytes(value))

    def _walk(self, start: int, buffers: bool) -> Iterator[tuple[Any, Any]]:
        """Each sample's stored key and value from ``start`` on: views of LMDB's mapping where the tree
        walk found them (:meth:`_placed_walk_from`), else LMDB's cursor's (with ``buffers``, views valid
        until the next)."""
        placed = self._placed_walk_from(start)
        yield from placed if placed is not None else self._cursor_walk(start, buffers)

    def _placed_walk_from(self, start: int) -> Iterator[tuple[memoryview, memoryview]] | None:
        """:meth:`_placed_walk` toward ``start``; None where LMDB's mapping is not found, or the seek key
        is not where byte order puts it (LMDB's cursor then walks)."""
        placed = self._lease.placed()
        if placed is None:
            return None
        whole, places = placed
        first = self._first_record(MappedKeys(whole, places), start)
        return None if first is None else self._placed_walk(whole, places, start, *first)

    def _first_record(self, keys: MappedKeys, start: int) -> tuple[int, int] | None:
        """(record, sample position) to walk from toward ``start``: the nearest seek key's, else the
        first; None where the seek key is not where byte order puts it (a database in another order:
        LMDB's cursor then seeks)."""
        seek = start // self._seek_every if self._seek_every else 0
        if 0 < seek < len(self._seek_keys):
            record = keys.find(self._seek_keys[seek])
            return None if record is None else (record, seek * self._seek_every)
        return 0, 0

    def _placed_walk(self, whole: memoryview, places: Tree, start: int, record: int,
                     position: int) -> Iterator[tuple[memoryview, memoryview]]:
        """:meth:`_walk` from ``record`` (sample ``position``), each key and value sliced from LMDB's
        mapping where the walk of the file's tree found it: no call into LMDB a record, each of which
        let go of the interpreter lock and waited to take it back (formats/lmdb.py)."""
        i = position
        if not len(places.key_at):
            raise self._corrupt("holds no records")
        for c in range(record, len(places.key_at), _PLACES_CHUNK):
            chunk = slice(c, c + _PLACES_CHUNK)
            for key_at, key_size, value_at, value_size in zip(places.key_at[chunk].tolist(),
                                                              places.key_size[chunk].tolist(),
                                                              places.value_at[chunk].tolist(),
                                                              places.value_size[chunk].tolist(), strict=True):
                key = whole[key_at : key_at + key_size]
                if META_KEY.match(key):
                    continue
                if i >= start:
                    yield key, whole[value_at : value_at + value_size]
                i += 1
        if i != self._n:
            raise self._corrupt(f"holds {i} records, index.json says {self._n}")

    def _cursor_walk(self, start: int, buffers: bool) -> Iterator[tuple[Any, Any]]:
        try:
            with self._lease.env.begin(buffers=True) if buffers else self._lease.env.begin() as txn:
                cursor = txn.cursor()
                i = 0
                seek = start // self._seek_every if self._seek_every else 0
                if 0 < seek < len(self._seek_keys):  # near the share's start, by a key the manifest recorded
                    if not cursor.set_key(self._seek_keys[seek]):
                        raise self._corrupt(f"record {self._seek_keys[seek]!r} is missing")
                    i = seek * self._seek_every
                elif not cursor.first():
                    raise self._corrupt("holds no records")
                for key, value in cursor.iternext(keys=True, values=True):  # from the cursor's record on
                    if META_KEY.match(key):
                        continue
                    if i >= start:
                        yield key, value
                    i += 1
                if i != self._n:
                    raise self._corrupt(f"holds {i} records, index.json says {self._n}")
        except lmdb.Error as e:
            raise self._corrupt(f"cannot read: {e}") from None

    def close(self) -> None:
        if self._placed is not None and self._own_placed:
            self._placed.close()
        self._placed = None  # its environment's, closed with it, unless its own
        if self._leased is not None:
            self._leased.release()


class ForeignLMDBFormat(AdoptedFormat):
    name = "lmdb-foreign"
    suffix = ".mdb"

    # where the records of files read sample by sample or unchecked lie, by version (ForeignLMDBReader),
    # and the labels files read, by version (LabelSource.of): up to a few adopted ImageNets' worth
    # (50-60 bytes a record: its key, its value's place; about 100 a label), which a reader holds
    # anyway while it reads
    PLACED_RECORDS = 1 << 23

    def __init__(self, layout: dict[str, Any] | None = None) -> None:
        super().__init__(layout)
        self.placements = Learnt[FileVersion, PlacedSamples](self.PLACED_RECORDS)
        self.label_sources = Learnt[FileVersion, LabelSource](self.PLACED_RECORDS)

    def reader(self, path: str | os.PathLike[str]) -> ShardReader:
        return ForeignLMDBReader(path, self.layout, label_sources=self.label_sources)

    def reader_of(self, path: str | os.PathLike[str], checksum: str | None, *, vouched: bool = False,
                  by_sample: bool = False) -> ShardReader:
        """Read sample by sample (or unchecked), from where its records lie in this version of the file,
        where a reader of it found them before (:class:`ForeignLMDBReader`)."""
        return ForeignLMDBReader(path, self.layout, LearntOfFile.of(self.placements, path) if by_sample else None,
                                 self.label_sources)

    @staticmethod
    def check_layout(layout: dict[str, Any]) -> None:
        if layout.get("values", "image") not in VALUE_KINDS:
            raise ValueError(f"'values' must be one of {', '.join(VALUE_KINDS)}, not {layout['values']!r}")
        if layout.get("digests", "records") != "records":
            raise ValueError(f"'digests' must be 'records', not {layout['digests']!r}")
        for key in ("field", "labels_file"):
            checked(layout, key, str, "a name", default=None)
        for key in ("samples", "seek_every"):
            whole_number(layout.get(key, 0), repr(key), below=2**63)
        ForeignLMDBFormat.check_label_names(layout)
        for key in checked(layout, "seek_keys", list, "a list of keys in base64", default=()):
            try:
                base64.b64decode(key, validate=True)
            except (TypeError, ValueError):
                raise ValueError(f"'seek_keys' must be keys in base64, not {key!r}") from None
        pattern = checked(layout, "label_regex", str, "a regular expression", default=None)
        try:
            if pattern is not None and "label" not in re.compile(pattern).groupindex:
                raise ValueError(f"'label_regex' {pattern!r} has no group (?P<label>...)")
        except re.error as e:
            raise ValueError(f"'label_regex' {pattern!r} is no regular expression: {e}") from None
