"""Reading a rank's samples from a dataset: sequential runs through each shard, or random access.

Sequential reading scans each run of increasing positions within a shard once (samples in between
are skipped) and asks for the next shard while one is read; random access (``global`` shuffling)
keeps shards open, and checks a shard it wants a share of sample by sample where the manifest
records their digests. Either way every sample is checked against the manifest before it is
used (invariant 7): a damaged one is an error naming it, or under ``on_corrupt`` a placeholder.

A shard checked whole against its checksum is hashed ahead (:class:`ShardsAhead`): the next
shard's bytes are read and hashed on a thread of their own while this one's samples are parsed, so
the check neither stalls reading nor comes after any of the shard's values are used. Read
unchecked, the next shard is paged in on that thread all the same, by the same hash, its checksum
then unused: without it an unchecked read paged its shards in on the reading thread, and ran slower
cold than a checked one (``ShardFormat.pages_in_ahead``).
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .checksum import digest_mismatch
from .dataset import OPEN_SHARDS, Dataset, OnCorrupt, ShardStore
from .errors import CorruptShardError
from .formats import ShardReader
from .formats.mapped import SCAN_WHOLE_LIMIT, HashedFile, ShardMapping, hash_mapped
from .sample import Sample, owned
from .throttle import SourceLimits


def keeps_mappings(dataset: Dataset, store: ShardStore | None, verify: bool, keep_mapped: bool) -> bool:
    """Whether a read keeps the mappings of the shard files it checks whole for the next epoch
    (``keep_mapped``, :class:`~ddpipe.formats.mapped.KeptMappings`): only checked reads, since the next
    epoch's check is what vouches that a file kept mapped (an LMDB file's environment, its tree walked
    as it opened: lmdb_env.py) has not changed since; and only files that stay: a dataset's own local
    files, or staged copies no capacity evicts. A copy a capacity may evict, or an object's scratch
    file, is deleted by ddpipe while a mapping would hold its space."""
    return keep_mapped and verify and files_stay(dataset, store)


def files_stay(dataset: Dataset, store: ShardStore | None) -> bool:
    """The files a read opens stay while it reads: a dataset's own local files, or staged copies no
    capacity evicts; not a copy a capacity may evict, nor an object's scratch file, which ddpipe
    deletes while a mapping of it would hold its space."""
    return store.keeps_copies if store is not None else not dataset.is_remote


def read_samples(dataset: Dataset, indices: np.ndarray, *, random_access: bool = False,
                 store: ShardStore | None = None, limits: SourceLimits | None = None, verify: bool = True,
                 on_corrupt: OnCorrupt | None = None, views: bool = False, keep_mapped: bool = False,
                 node_ranks: int = 1) -> Generator[Sample, None, None]:
    """The samples of ``dataset`` at global ``indices``, in that order.

    Sequential by default: each run of increasing positions within one shard is one scan of the
    shard from the run's first position (samples in between are skipped); ``store`` hears when
    the last run of a shard is done. ``random_access`` reads each sample on its own, keeping a
    few shards open. ``on_corrupt``: see :class:`~ddpipe.dataset.Dataset`. ``views``: sequential
    reads may give fields as views of the shard in memory (:meth:`ShardReader.scan_views`).
    ``keep_mapped``: the mappings of shard files checked whole are kept for a later read, where the
    files stay (:func:`keeps_mappings`, :class:`~ddpipe.formats.mapped.KeptMappings`). ``node_ranks``:
    the ranks of this node that read the dataset at random as this read does, a share each (a global
    shuffle's: the node's ranks), whose reads share the node's page cache (:func:`_random_digests`).
    """
    shards, positions = dataset.locate(np.asarray(indices, dtype=np.int64))
    keep = keeps_mappings(dataset, store, verify, keep_mapped)
    if random_access:
        yield from _read_random(dataset, shards.tolist(), positions.tolist(), store, verify, on_corrupt, keep,
                                node_ranks)
    else:
        yield from _read_in_order(dataset, shards, positions, store, limits, verify, on_corrupt, views, keep)


def _read_in_order(dataset: Dataset, shards: np.ndarray, positions: np.ndarray, store: ShardStore | None,
                   limits: SourceLimits | None, verify: bool, on_corrupt: OnCorrupt | None, views: bool,
                   keep: bool) -> Iterator[Sample]:
    """Each run of increasing positions within one shard read as one scan of the shard (see
    :func:`read_samples`), the next shards made ready ahead (:class:`ShardsAhead`)."""
    n = len(shards)
    corrupt: dict[int, CorruptShardError] = {}  # found once, told once, however many runs it has

    def found_corrupt(shard: int, error: CorruptShardError) -> None:
        corrupt[shard] = error
        if on_corrupt is not None:
            on_corrupt(shard, error)

    # objects are fetched ahead by their cache (Dataset.prefetch); their staged copies are files like any other
    ahead = ShardsAhead(dataset, store, verify, keep) \
        if limits is None and (store is not None or not dataset.is_remote) else None
    # views, copied out only where wanted (samples skipped between wanted ones cost no copy), unless the
    # format copies a sample out for less than its views cost
    scan_views = views or not dataset.format.copies_cheaply
    try:
        for i, j in _runs(shards, positions):
            wanted = positions[i:j].tolist()
            shard = int(shards[i])
            if ahead is not None and ahead.keep and shard not in corrupt:
                # the first shard too, before the next: its mapping is made where it may be kept
                ahead.start(shard, wanted[0] == 0)
            if j < n and shards[j] != shards[i]:
                for later in _shards_ahead(dataset, shards, j):
                    if later not in corrupt and (ahead is None or not ahead.start(later, positions[j] == 0)):
                        dataset.prefetch(later, store, limits)
            if shard in corrupt:
                yield from (dataset.placeholder(shard, p, corrupt[shard]) for p in wanted)
            else:
                scan = dataset.iter_shard(shard, wanted[0], store=store, limits=limits, verify=verify,
                                          on_corrupt=found_corrupt if on_corrupt is not None else None,
                                          views=scan_views, hashed=ahead.take(shard) if ahead is not None else None)
                yield from _wanted_of(scan, wanted, views)
            if store is not None and (j == n or shards[j] != shards[i]):
                store.release(shard)
    finally:
        if ahead is not None:
            ahead.close()


def _runs(shards: np.ndarray, positions: np.ndarray) -> Iterator[tuple[int, int]]:
    """Where each run of increasing positions within one shard begins and ends (``i``, ``j``: the run is
    ``[i, j)``), in order: a run ends where the shard changes or the positions go back."""
    if len(shards) == 0:
        return
    cuts = np.flatnonzero((shards[1:] != shards[:-1]) | (positions[1:] <= positions[:-1])) + 1
    yield from itertools.pairwise([0, *cuts.tolist(), len(shards)])


def _wanted_of(scan: Generator[Sample, None, None], wanted: list[int], views: bool) -> Iterator[Sample]:
    """The samples at the increasing positions ``wanted`` of a shard's ``scan`` (which starts at the first),
    each copied out of the shard unless ``views``; the scan closed once the last is found."""
    k = 0
    for pos, sample in enumerate(scan, start=wanted[0]):
        if pos == wanted[k]:  # only a wanted sample is copied out of the shard
            yield sample if views else owned(sample)
            k += 1
            if k == len(wanted):
                break
    # closed now, not when collected: the shard may come again later, opened ahead, and an LMDB environment
    # may be open once per process
    scan.close()


class ShardsAhead:
    """Shards made ready on a thread of their own, one ahead of the reader. Checked (``verify``): the
    file is read (cold) and hashed in one call into xxhash, which lets go of the interpreter for it,
    while the shard before is parsed; the shard is opened, and its checksum compared, when its turn
    comes, on the reader's thread, so no value of it is used before its bytes are known to be the
    manifest's and a mismatch is the same error, raised at the same point, as without the look
    ahead. The file is opened (an LMDB shard's environment too) on the reader's thread when its hash
    is asked for, and the hash's thread makes one call (``ShardMapping.prepare``). Unchecked: the
    file is hashed all the same, its checksum unused, where the format pages
    in ahead (``ShardFormat.pages_in_ahead``) and its scan would page it in whole (from its first
    sample, a file of a shard's size at most: mapped.py): the hash touching its pages in order, from
    C, was the fastest way to page a cold file in (the kernel's read-ahead runs ahead of it; paged in
    with one call, ``MAP_POPULATE``, even after asking for the whole file, the read was no faster
    than the reading thread paging it in itself). Not for a shard checked sample by sample (adopted
    files), nor a staged copy not complete yet (waiting for it would wait on the node's stager,
    which may itself wait for this reader). Where mappings are kept for the next epoch
    (``keep_mapped``), a run's own shard is hashed here too, when its turn comes, if it was not ahead:
    the mapping made for it is then one that may be kept (``keep``: :func:`keeps_mappings`)."""

    def __init__(self, dataset: Dataset, store: ShardStore | None, verify: bool, keep: bool = False) -> None:
        self.dataset, self.store, self.verify, self.keep = dataset, store, verify, keep
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ddpipe-check-ahead" if verify else "ddpipe-page-ahead")
        self._hashing: dict[int, tuple[ShardMapping, Future[HashedFile | None]]] = {}

    def start(self, shard: int, from_start: bool) -> bool:
        """Hash ``shard`` in the background; False where that is not for this shard. ``from_start``: its
        reader starts at its first sample."""
        if shard in self._hashing:
            return True
        if self.verify and self.dataset.scan_digests(shard) is not None:
            return False
        if not self.verify and not (from_start and self.dataset.format.pages_in_ahead
                                    and self.dataset.manifest.shards[shard].bytes <= SCAN_WHOLE_LIMIT):
            return False
        path = self.store.ready_path(shard) if self.store is not None else self.dataset.shard_path(shard)
        if path is None:
            return False
        try:
            mapping = self.dataset.format.mapping(path, keep=self.keep)
        except OSError:  # opening the shard then says why
            return False
        mapping.prepare()  # here, not on the hash's thread: ShardMapping.prepare
        self._hashing[shard] = mapping, self._pool.submit(_hashed, mapping, self.dataset.format.reads_mapped)
        return True

    def take(self, shard: int) -> HashedFile | None:
        """``shard``'s file hashed ahead (waiting for it), if a hash was started and the file could be
        read: :meth:`Dataset.open_shard` compares its checksum (checked) and reads through its mapping."""
        hashing = self._hashing.pop(shard, None)
        return hashing[1].result() if hashing is not None else None

    def close(self) -> None:
        """Stop: a hash under way is waited for (it is one call), one not started is dropped, and the
        mappings made ahead that no reader took are let go of (an LMDB shard's holds its environment
        open)."""
        for _, hashing in self._hashing.values():
            hashing.cancel()
        self._pool.shutdown(wait=True)
        for mapping, _ in self._hashing.values():
            mapping.close()
        self._hashing.clear()


def _hashed(mapping: ShardMapping, keep: bool) -> HashedFile | None:
    """The file of ``mapping`` hashed through it, paged in and kept for the reader where the format
    reads mapped (``keep``: its reader then pages in nothing on the reading thread), or None where it
    cannot be read (opening it then says why)."""
    try:
        return hash_mapped(mapping, keep)
    except (OSError, ValueError):  # a CorruptShardError (an empty file) is a ValueError
        return None


def _shards_ahead(dataset: Dataset, shards: np.ndarray, j: int) -> list[int]:
    """The shards to ask for while the one before position ``j`` is read: the next; for objects
    the one after it too, two transfers at once keeping a link busy through each one's request
    latency (benchmarks/object_store.py)."""
    ahead = [int(shards[j])]
    if dataset.is_remote:
        rest = np.flatnonzero(shards[j:] != shards[j])
        if len(rest):
            ahead.append(int(shards[j + rest[0]]))
    return ahead


def _read_random(dataset: Dataset, shards: list[int], positions: list[int], store: ShardStore | None,
                 verify: bool, on_corrupt: OnCorrupt | None, keep: bool, node_ranks: int) -> Iterator[Sample]:
    """Each sample read on its own from shards kept open. A shard that this node's reads want most of
    is checked whole when first opened, its mapping then kept for the next epoch with ``keep`` (a
    global shuffle reads every shard of the dataset each epoch: docs/benchmarks.md,
    feed-global-kept); one they want less of (a rank's share of a global shuffle on many nodes),
    where the manifest records its samples' digests, is checked sample by sample, so that the node
    reads its share of the dataset rather than all of it (random_access in docs/benchmarks.md).
    Readers whose mappings were paged in whole (checked whole) and are not kept stay open up to
    ``OPEN_SHARDS``: each holds its file's pages in the process's page tables. The others stay open up
    to the descriptors a dataset keeps mappings with (:func:`~ddpipe.formats.mapped.kept_files`),
    where the files stay (:func:`files_stay`): a mapping kept holds its descriptor and its pages
    whether or not a reader is open on it, and one read sample by sample (or unchecked) holds the
    pages read alone. Reopening a shard for each sample read from it cost more than reading the
    sample (docs/benchmarks.md, feed-global-resident)."""
    paged: OrderedDict[int, ShardReader] = OrderedDict()  # mappings paged in whole, not kept
    resident: OrderedDict[int, ShardReader] = OrderedDict()  # the others
    resident_limit = dataset.format.kept.files if files_stay(dataset, store) else OPEN_SHARDS
    # each shard's digests, or None where it is checked whole: decided once for the read, from what it wants
    digests_of = {shard: _random_digests(dataset, shard, count, node_ranks)
                  for shard, count in Counter(shards).items()} if verify else {}
    # each shard checked whole once (the file checked), however often it is reopened: a reopen trusts its
    # bytes, as it trusts the samples it reads, so a format may open it from what it learnt of them (an
    # object's scratch copy, fetched again, is checked again: Dataset.open_shard)
    checked: dict[int, Path] = {}
    corrupt: dict[int, CorruptShardError] = {}
    told: set[int] = set()  # shards with a sample that differs, reported once to on_corrupt
    try:
        for shard, pos in zip(shards, positions, strict=True):
            if shard in corrupt:
                yield dataset.placeholder(shard, pos, corrupt[shard])
                continue
            digests = digests_of.get(shard)
            check = verify and digests is None and shard not in checked
            try:
                reader = paged.pop(shard, None) or resident.pop(shard, None) or \
                    dataset.open_shard(shard, store, verify=check, keep=keep and digests is None,
                                       vouched=checked.get(shard))
            except CorruptShardError as e:
                if on_corrupt is None:
                    raise
                on_corrupt(shard, e)
                corrupt[shard] = e
                yield dataset.placeholder(shard, pos, e)
                continue
            if check:
                checked[shard] = reader.path
            sample = reader[pos]
            error = digest_mismatch(digests, pos, sample, dataset.source_name(reader.path))
            if error is not None and dataset.reads_staged_copy(shard, reader):
                reader.close()
                reader = dataset.reopen_from_source(shard, store, error, reader.path)
                sample = reader[pos]
                error = digest_mismatch(digests, pos, sample, dataset.source_name(reader.path))
            whole = shard in checked and not dataset.format.kept.holds(reader.path)
            open_now, limit = (paged, OPEN_SHARDS) if whole else (resident, resident_limit)
            open_now[shard] = reader
            if len(open_now) > limit:
                open_now.popitem(last=False)[1].close()
            if error is not None:
                if on_corrupt is None:
                    raise error
                if shard not in told:
                    on_corrupt(shard, error)
                    told.add(shard)
                sample = dataset.placeholder(shard, pos, error)
            else:
                sample = reader.parse(sample)  # checked first, then parsed
            yield sample
    finally:
        for reader in [*paged.values(), *resident.values()]:
            reader.close()


def _random_digests(dataset: Dataset, shard: int, wanted: int, node_ranks: int) -> np.ndarray | None:
    """The digests a random read checks ``shard``'s samples against, or None where it checks the whole
    file: its manifest's, where the ``node_ranks`` ranks of this node, each wanting about ``wanted``
    of its samples as this read does, want less than half of them together; or where the format
    checks its scans sample by sample too (an adopted file). A node whose ranks want most of a
    shard reads it whole either way, and hashing it reads it in order, once, into the page cache
    they share: ranks sharing one cache that read their shares sample by sample read every file in
    random order, and their cold epochs took longer than each hashing every file whole
    (docs/benchmarks.md, global_shuffle)."""
    if not dataset.format.scans_check_samples and 2 * wanted * node_ranks >= dataset.manifest.shards[shard].samples:
        return None
    return dataset.sample_digests(shard)
