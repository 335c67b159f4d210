"""The interface every shard format implements.

A format offers three things over one shard file: a sequential scan (the fast path, reading the
file front to back), random access by index within the shard, and a writer whose shard becomes
visible only when it is complete (see :mod:`ddpipe.formats.atomic`).
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from ..checksum import file_checksum, pack_digests, sample_digest
from ..errors import ChecksumMismatchError, CorruptShardError, DdpipeError, MissingShardError
from ..sample import Sample, check_sample
from . import atomic
from .mapped import KeptMappings, MappedFile, ShardMapping

R = TypeVar("R", bound="ShardReader")


class ShardReader(abc.ABC):
    """Reads one shard. Use as a context manager, or call :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise MissingShardError("shard file not found", path=self.path)

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of samples in the shard."""

    @abc.abstractmethod
    def __getitem__(self, index: int) -> Sample:
        """Random access to the ``index``-th sample (0-based, in stored order)."""

    @abc.abstractmethod
    def scan(self, start: int = 0) -> Iterator[Sample]:
        """Sequential scan from sample ``start`` to the end, in stored order."""

    def parse(self, sample: Sample) -> Sample:
        """A sample as :meth:`scan` and ``[]`` gave it, made whole. Readers whose records are checked
        before they are parsed (a manifest's digests over the records as stored, so that nothing
        runs on bytes that changed) give them unparsed and parse them here, once the check passed;
        most readers' samples are whole already."""
        return sample

    def scan_views(self, start: int = 0) -> Iterator[Sample]:
        """:meth:`scan`, where a format may give fields as views of the shard in memory instead of
        copies; a view keeps the shard mapped while it lives (:func:`ddpipe.sample.owned` copies
        a sample out). Formats without such views scan as usual."""
        return self.scan(start)

    def __iter__(self) -> Iterator[Sample]:
        return self.scan()

    def adopt_mapping(self, mapped: ShardMapping) -> None:  # noqa: B027 - optional hook
        """Read through ``mapped`` (its format's :meth:`ShardFormat.mapping` of this reader's file,
        paged in already by the thread that hashed it ahead), rather than map and page it in again.
        Readers without a mapping of their own ignore it."""

    def mapped_file(self) -> ShardMapping:
        """The shard's file mapped, for its checksum: a reader that reads from a mapping of its own
        returns that one, so that a check and the scan after it read the file from disk once. Others
        get one for the checksum alone, which pages the file in with one call and goes once taken
        (an adopted LMDB: warm checked reads 0.52 of raw against 0.37 reading the file to hash it)."""
        return MappedFile(self.path)

    def close(self) -> None:  # noqa: B027 - optional hook: not every reader holds a handle
        """Release file handles."""

    def __enter__(self: R) -> R:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _check_index(self, index: int) -> int:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"{self.path}: sample index {index} out of range for {n} samples")
        return index

    def _corrupt(self, what: str) -> CorruptShardError:
        return CorruptShardError(what, path=self.path)


class ShardWriter(abc.ABC):
    """Writes one shard under a hidden temporary name; :meth:`commit` makes it visible.

    As a context manager it commits on success and discards the partial file on any error.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.tmp_path = atomic.partial_path(self.path)
        atomic.discard(self.tmp_path)  # a leftover from an interrupted run is never reused
        self.count = 0
        self._done = False

    def write(self, sample: Sample) -> None:
        check_sample(sample)
        try:
            self._write(sample)
        except OSError as e:
            self.abort()
            atomic.raise_if_disk_full(e, self.path)
            raise
        self.count += 1

    @abc.abstractmethod
    def _write(self, sample: Sample) -> None:
        """Append one validated sample."""

    @abc.abstractmethod
    def _finish(self) -> None:
        """Flush and close ``self.tmp_path`` so it holds the complete shard."""

    def _sidecars(self) -> list[tuple[Path, Path]]:
        """Extra (temporary, final) files committed with the shard, such as an index."""
        return []

    def commit(self) -> Path:
        """Finish the shard and rename it (and its sidecars) into place; return the final path."""
        self.finish().commit()
        return self.path

    def finish(self) -> atomic.Finished:
        """Finish the shard under its temporary name, for whoever makes it durable and names it."""
        if self._done:
            raise RuntimeError(f"{self.path}: writer already closed")
        try:
            self._finish()
        except OSError as e:
            self.abort()
            atomic.raise_if_disk_full(e, self.path)
            raise
        self._done = True
        files = [*self._sidecars(), (self.tmp_path, self.path)]
        return atomic.Finished(tuple((str(tmp), str(final)) for tmp, final in files))

    def abort(self) -> None:
        """Discard everything written so far; the final name is never touched."""
        if self._done:
            return
        self._done = True
        try:
            self._close_quietly()
        finally:
            atomic.discard(self.tmp_path)
            for tmp, _ in self._sidecars():
                atomic.discard(tmp)

    def _close_quietly(self) -> None:  # noqa: B027 - optional hook
        """Close open handles without finishing the shard."""

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.commit()
        else:
            self.abort()


class ShardFormat(abc.ABC):
    """A shard format: its name, its file suffix, and how to read and write one shard."""

    name: str
    suffix: str
    # the fewest bytes a shard of this format spends on one sample: a manifest that claims more
    # samples than a shard's size allows is refused before anything is sized from its count
    min_sample_bytes: int = 8
    # its readers read through a mapping of their own (:meth:`mapping`, :meth:`ShardReader.adopt_mapping`):
    # a shard hashed ahead keeps the mapping it was hashed through for them; others let it go once hashed
    reads_mapped: bool = False
    # its scan copies a sample out in one call (LMDB: msgpack), for less than views of it cost to give and
    # then copy: a reader that wants copies scans for copies (unchecked warm LMDB reads: ~6,000 MB/s
    # against ~4,600 through views copied out)
    copies_cheaply: bool = False
    # read unchecked, its next shard is paged in ahead, on another thread, by the hash a checked read
    # takes (reading.ShardsAhead): cold tar and HDF5 reads ran ~6-10% faster so, and LMDB's once its
    # environment was opened on the reading thread (ShardMapping.prepare). Not adopted files: one
    # may hold a whole dataset, of which a rank reads a part
    pages_in_ahead: bool = False
    # a sequential scan of one of its shards checks each sample against the manifest's digests, not the
    # whole file's checksum: adopted files, one of which may hold a whole dataset that many ranks each
    # read a part of. A shard of ddpipe's own is scanned whole, and hashing it whole (ahead, on another
    # thread: reading.ShardsAhead) costs less than hashing each sample; its digests are for random reads
    scans_check_samples: bool = False

    def __init__(self) -> None:
        self.kept = KeptMappings()  # this dataset's: each made by get_format; pickled empty

    @abc.abstractmethod
    def reader(self, path: str | os.PathLike[str]) -> ShardReader: ...

    def reader_of(self, path: str | os.PathLike[str], checksum: str | None, *, vouched: bool = False,
                  by_sample: bool = False) -> ShardReader:
        """:meth:`reader`, for a file whose bytes are known to hash to ``checksum``, the manifest's (None:
        not known): a format may then open it from what it learnt of a file of those bytes before.
        ``vouched``: the file was checked whole earlier in the same read, and is reopened trusting its
        bytes (a random access): a format read through files beside the shard may read them as they
        were found to agree with those bytes, where it kept them (:meth:`check_sidecars`).
        ``by_sample``: its bytes are not checked whole, now or before: each sample read is checked
        against its digest, or none is (an unchecked read), so a format may open it from what it
        learnt of the same file (:func:`~ddpipe.formats.learnt.file_version`) opened so before."""
        return self.reader(path)

    def mapping(self, path: str | os.PathLike[str], *, keep: bool = False) -> ShardMapping:
        """The file at ``path`` mapped as this format's readers map it: a shard hashed ahead is hashed
        through it, and with :attr:`reads_mapped` its reader then takes it over. ``keep``: a file of
        the dataset's own, whose mapping may be kept for the next epoch (:class:`KeptMappings`)."""
        return MappedFile(Path(path), self.kept if keep else None)

    @abc.abstractmethod
    def writer(self, path: str | os.PathLike[str]) -> ShardWriter: ...

    def sidecar_files(self, path: str | os.PathLike[str]) -> list[Path]:
        """Files kept beside a shard (an index, say) that belong to it."""
        return []

    def configured(self, layout: dict[str, Any], data_root: Path) -> ShardFormat:
        """This format set up for one dataset's ``layout`` (its manifest's): how an adopted format's
        files hold samples; ``data_root``, where its files are. ddpipe's own formats have one layout
        and return themselves."""
        return self

    def verify(self, reader: ShardReader, checksum: str, actual: str | None = None) -> None:
        """Raise :class:`ChecksumMismatchError` unless the shard's bytes hash to ``checksum`` (its
        manifest's), so that a replaced or damaged file is caught before any of its samples is used.
        ``actual``: the file's checksum, taken already (ahead, on another thread). The files beside
        the shard that its reader reads through are then checked against it (:meth:`check_sidecars`)."""
        actual = actual if actual is not None else self.checksum(reader)
        if actual != checksum:
            raise ChecksumMismatchError(reader.path, expected=checksum, actual=actual)
        self.check_sidecars(reader, checksum)

    def check_sidecars(self, reader: ShardReader, checksum: str) -> None:
        """Raise :class:`CorruptShardError` unless the files beside the shard that ``reader`` reads
        through (:meth:`sidecar_files`) agree with the shard, whose bytes hash to ``checksum``: they are
        not in its checksum. Nothing to check for a format without them."""
        return

    def written_checksums(self, path: str | os.PathLike[str]) -> tuple[str, str]:
        """The checksum of the shard just written at ``path`` and each sample's digest
        (:func:`~ddpipe.checksum.sample_digest`) packed, as the manifest records them: read back
        through one mapping of the file, so that the digests are of what a read will compare, not of
        what the writer was given."""
        with self.reader(path) as reader:
            return self.checksum(reader), pack_digests(sample_digest(sample) for sample in reader.scan())

    def checksum(self, reader: ShardReader) -> str:
        """The checksum of the shard ``reader`` reads, as manifests record it: through the reader's
        mapping of the file where it has one that fits whole, else read in chunks."""
        mapped = reader.mapped_file()
        if mapped.fits_whole and mapped.size > 0:  # an empty file cannot be mapped
            return mapped.checksum()
        return file_checksum(reader.path)


class LayoutError(ValueError):
    """A manifest's ``layout`` that its adopted format cannot follow (a value of the wrong kind)."""


class AdoptedFormat(ShardFormat):
    """Files another tool wrote, read in place (``ddpipe index`` adopts them) and never written. Each
    dataset's manifest gives the ``layout`` its reader follows; ``layout["source_dir"]`` is where the
    dataset's own files are (side files live there, not beside a staged copy)."""

    scans_check_samples = True

    def __init__(self, layout: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.layout = dict(layout or {})

    def configured(self, layout: dict[str, Any], data_root: Path) -> ShardFormat:
        """LayoutError for a layout the reader cannot follow, before any file is opened."""
        try:
            self.check_layout(layout)
        except ValueError as e:
            raise LayoutError(str(e)) from None
        return type(self)({**layout, "source_dir": str(data_root)})

    @staticmethod
    @abc.abstractmethod
    def check_layout(layout: dict[str, Any]) -> None:
        """Raise ValueError naming the first key whose value the reader cannot use (:mod:`ddpipe.fields`)."""

    @staticmethod
    def check_label_names(layout: dict[str, Any]) -> None:
        """``label_names``, where labels are stored as class names: the names, in class order."""
        names = layout.get("label_names", [])
        if isinstance(names, bool) or not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"'label_names' must be a list of class names, not {names!r}")

    def writer(self, path: str | os.PathLike[str]) -> ShardWriter:
        raise DdpipeError(f"{self.name} files are read in place, never written: convert them to write ddpipe shards")
