"""Node-local staging: one copy per node of the shards its ranks read, made ahead of the readers.

On each node, local rank 0 copies (in a background thread) the shards that the node's ranks will
read this epoch, in the order they will read them, from the source dataset to ``stage_dir``; every
rank asks :meth:`NodeStager.path` for a shard and waits until its copy is complete and verified, and
never sees a partial file (copies are renamed into place once their checksum matches). Valid copies
are reused across epochs and runs. With a ``capacity`` in bytes, the stager keeps a window ahead of
the readers and evicts shards every local rank has finished with. On several nodes, a shard that
another node holds is fetched from that node rather than from the source (``peers.py``).

Coordination between the processes of a node goes through the stage directory: a verification
stamp per staged shard, a ``flock`` per shard while it is copied (two jobs may share a directory,
but not if either has a capacity: ``job_lock.py``), a ``.failed`` note per shard the stager could
not copy, per-rank ``.done`` notes for eviction, and with a capacity a ``.reached`` note of how far
the stager has come (a reader waiting for a copy the stager has gone past reads the source's).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

from ..comm import Comm
from ..dataset import Dataset
from ..errors import ChecksumMismatchError, DdpipeError, DiskFullError, OptionError
from ..formats.atomic import atomic_write_bytes, commit, discard
from ..shard_copy import CopyStopped, copy_shard, copy_sidecars, is_staged, remove_staged, stamp_path, write_stamp
from .job_lock import hold_directory
from .options import StageOptions, dataset_stage_dir
from .peers import fetch_from_peer, holders, inventory_bits
from .shared_dir import refuse_a_shared_capacity

_REACHED = ".reached"  # how far the leader's stager has come in this epoch's order (with a capacity)


class NodeStager:
    """A node's staged copies, as one process of it sees them. ``copies``: whether this process makes
    them where it is local rank 0 (a rank's reading process only reads them: its parent copies)."""

    def __init__(self, dataset: Dataset, options: StageOptions, comm: Comm, copies: bool = True) -> None:
        self.dataset = dataset
        self.options = options
        self.comm = comm
        largest = max(dataset.manifest.shards, key=lambda s: s.bytes, default=None)
        if options.capacity is not None and largest is not None and largest.bytes > options.capacity:
            raise OptionError(f"a staging capacity of {options.capacity:,} bytes is less than the largest shard "
                              f"({largest.file}, {largest.bytes:,} bytes): a shard is staged whole"
                              ).everywhere()  # every rank checks the same manifest and options
        self.dir = dataset_stage_dir(Path(options.stage_dir), dataset)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # named as given: the dataset's directory under it is ddpipe's own name
            raise DdpipeError(f"the staging directory cannot be made there: {e.strerror}",
                              path=options.stage_dir) from None
        self.is_leader = copies and comm.world.local_rank == 0
        if options.capacity is not None and copies and comm.world.num_nodes > 1:
            refuse_a_shared_capacity(comm, Path(options.stage_dir), self.dir, self.is_leader)
        if copies:
            self._take_the_directory()
        self.stats = {"copied": 0, "reused": 0, "bytes": 0, "seconds": 0.0, "evicted": 0, "fallbacks": 0,
                      "peer_copied": 0, "peer_bytes": 0, "not_fitted": 0}
        self._thread: threading.Thread | None = None
        self._thread_ended = threading.Event()  # set by the thread as it ends (see _join)
        # registered while a thread stages, by a weak reference: the thread holds the stager while it runs,
        # and a stream dropped mid-epoch after that goes with its stager (and its dataset's kept mappings,
        # a descriptor each) rather than live until the process ends
        self._at_exit = functools.partial(_stop_if_alive, weakref.ref(self))
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._epoch = 0
        self._readers: dict[int, int] = {}  # shard -> how many local ranks read it this epoch
        self._position: dict[int, int] = {}  # shard -> its place in the node's order this epoch
        self._my_runs: dict[int, int] = {}  # shard -> runs of it left in this rank's reads
        self.on_staged: Callable[[int], None] | None = None  # called by the leader after each shard
        #: no rank reads (``ddpipe stage`` ahead of a job): stop at the first shard that does not fit in the
        #: capacity, rather than wait for readers to be done with the staged ones
        self.fill_only = False
        self._link = comm.peer_link() if copies and options.peers and comm.world.num_nodes > 1 else None
        self._holders: dict[int, int] = {}  # shard -> the leader rank of another node that holds it
        if self._link is not None and self.is_leader:
            self._link.serve(self._serve_lookup)

    def _take_the_directory(self) -> None:
        """Refuse, on every rank at once, to stage where another job stages this dataset, if either has
        a capacity (job_lock.py); the leaders look. Once a leader holds it with a capacity, it removes
        the notes an earlier run left of the shards its ranks were done with, before any rank of this
        run reads: they are named by epoch and local rank only, so the stager took them for this run's
        and evicted copies no reader had read yet (a rerun waited out the timeout for them)."""
        refusal = hold_directory(self, self.dir, self.options.capacity is not None) if self.is_leader else None
        if self.is_leader and refusal is None and self.options.capacity is not None:
            self._remove_done_notes(before=None)
            discard(self.dir / _REACHED)  # and how far its stager came
        if self.comm.world.size > 1:
            refusal = next((r for r in self.comm.allgather(refusal) if r is not None), None)
        if refusal is not None:
            raise OptionError(refusal).everywhere()

    # ---- leader ----------------------------------------------------------------------------------

    def start(self, epoch: int, order: list[int], readers: dict[int, int], my_runs: dict[int, int]) -> None:
        """Begin staging ``order`` (this node's shards, in the order its ranks read them). ``readers``:
        how many of the node's ranks read each shard; ``my_runs``: how many separate runs of each shard
        this rank reads (it is done with a shard after the last)."""
        self.close()
        self._epoch, self._readers, self._my_runs = epoch, readers, dict(my_runs)
        self._position = {s: i for i, s in enumerate(order)}
        if self.is_leader and self.options.capacity is not None:  # else they pile up, one per shard and rank
            self._remove_done_notes(before=epoch)
        shards = self.dataset.manifest.shards
        # what this node already holds: copies of earlier epochs or runs (the leader looks)
        staged = [s for s, info in enumerate(shards) if is_staged(self.dir / info.file, info)] if self.is_leader else []
        if self._link is not None:  # every rank takes part: who holds what, as the epoch starts
            mine = inventory_bits(staged, len(shards)) if self.is_leader else None
            everyone = self.comm.allgather((self.comm.world.node, mine))
            self._holders = holders([bits for _, bits in everyone], [node for node, _ in everyone],
                                    self.comm.world.node, len(shards))
        self._stop.clear()
        if self.is_leader:
            self._thread_ended.clear()
            self._thread = threading.Thread(target=self._stage_all, args=(order, staged), daemon=True,
                                             name="ddpipe-stager")
            self._thread.start()
            # a process that ends while a copy is under way (a script's Ctrl-C) stops it first: the
            # thread, killed at exit, left the copy under its hidden name, for a rerun to remove
            atexit.register(self._at_exit)

    def _stage_all(self, order: list[int], staged: list[int]) -> None:
        """Stage ``order``; ``staged``: what the node holds already, which counts against the capacity."""
        position = {s: i for i, s in enumerate(order)}
        try:
            for i, shard in enumerate(order):
                if self._stop.is_set():
                    return
                if self.options.capacity is not None:
                    self._say_reached(i)
                    if shard not in staged and not self._make_room(shard, staged, position, i):
                        if not self._stop.is_set():  # the shards left: staged as the job's readers make room
                            self.stats["not_fitted"] += len(set(order[i:]) - set(staged))
                        return
                self._stage_one(shard)
                if shard not in staged:
                    staged.append(shard)
                if self.on_staged is not None:
                    self.on_staged(shard)
        except CopyStopped:  # closed: nothing of the copy is left
            return
        except BaseException as e:  # reaches the readers through path()
            self._error = self._directory_gone() if isinstance(e, OSError) and not self.dir.is_dir() else e
        finally:
            self._thread_ended.set()

    def _stage_one(self, shard: int) -> None:
        info = self.dataset.manifest.shards[shard]
        dest = self.dir / info.file
        with self._locked(dest):
            if is_staged(dest, info):
                self.stats["reused"] += 1
                return
            remove_staged(dest)  # a stale or damaged copy is fetched again
            discard(self._failed(dest))  # and a failure of an earlier run is tried again
            t0 = time.perf_counter()
            try:
                copy_sidecars(self.dataset, shard, self.dir)
                peer = self._holders.get(shard)
                if peer is not None and self._link is not None and fetch_from_peer(self._link, peer, shard, dest, info):
                    self.stats["peer_copied"] += 1
                    self.stats["peer_bytes"] += info.bytes
                else:
                    copy_shard(self.dataset, shard, dest, self.options.limits, self._stop)
            except DiskFullError as e:
                print(f"ddpipe: warning: {e}; readers use the source for {info.file}", file=sys.stderr, flush=True)
                atomic_write_bytes(self._failed(dest), str(e).encode())
                return
            except ChecksumMismatchError as e:
                # the source itself is damaged: readers verify it too, and fail naming it or, under
                # on_error="skip", drop its samples, as they would without staging
                atomic_write_bytes(self._failed(dest), str(e).encode())
                return
            write_stamp(dest, info)
            self.stats["copied"] += 1
            self.stats["bytes"] += info.bytes
            self.stats["seconds"] += time.perf_counter() - t0

    def _serve_lookup(self, shard: int) -> str | None:
        """What this node sends a peer asking for ``shard``: its verified copy, if it still has one."""
        shards = self.dataset.manifest.shards
        if not 0 <= shard < len(shards):
            return None
        dest = self.dir / shards[shard].file
        return str(dest) if is_staged(dest, shards[shard]) else None

    def _make_room(self, shard: int, staged: list[int], position: dict[int, int], now: int) -> bool:
        """Evict until ``shard`` fits: first shards this epoch is done with (every local reader finished,
        or not read at all), else the staged shard needed latest (staged again when its turn comes; a rank
        that has it open keeps reading the unlinked file). Wait for readers only when neither exists, and
        then, with :attr:`fill_only` or once stopped, say that it does not fit (False)."""
        shards = self.dataset.manifest.shards
        need = shards[shard].bytes
        while sum(shards[s].bytes for s in staged) + need > self.options.capacity and staged:  # type: ignore[operator]
            done = [s for s in staged if position.get(s, -1) < now and self._all_done(s)]
            later = [s for s in staged if position.get(s, -1) > now]
            if done or later:
                victim = done[0] if done else max(later, key=lambda s: position[s])
                evicted = self.dir / shards[victim].file
                remove_staged(evicted)
                for sidecar in self.dataset.format.sidecar_files(evicted):  # a tar's index: staged with it again
                    discard(sidecar)
                staged.remove(victim)
                self.stats["evicted"] += 1
            elif self.fill_only or self._stop.wait(0.01):
                return False
        return True

    @contextlib.contextmanager
    def _locked(self, dest: Path) -> Iterator[None]:
        with open(dest.with_name(f".{dest.name}.lock"), "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # another job staging the same shard: wait, then reuse its copy
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # ---- readers ---------------------------------------------------------------------------------

    def path(self, shard: int) -> Path:
        """The staged copy of ``shard`` once complete and verified (waiting for it), or the source if
        the stager could not copy it, has gone past it (with a capacity), or its verified copy was
        removed or changed since (no copy is made again before the next epoch)."""
        info = self.dataset.manifest.shards[shard]
        dest = self.dir / info.file
        deadline = time.monotonic() + self.options.wait_timeout
        delay = 1e-3
        while not is_staged(dest, info):
            if self._failed(dest).exists() or self._passed(shard):
                self.stats["fallbacks"] += 1
                return self.dataset.shard_path(shard)
            if stamp_path(dest).exists() and not is_staged(dest, info):  # verified, then changed: no copy
                # is coming this epoch (a copy under way has none: its stamp is removed first, and written last)
                print(f"ddpipe: warning: the staged copy {dest} was removed or changed after it was verified; "
                      "reading the source's", file=sys.stderr, flush=True)
                self.stats["fallbacks"] += 1
                return self.dataset.shard_path(shard)
            self.check()
            if not self.dir.is_dir():  # no copy is coming, and none of the node's notes is left
                raise self._directory_gone()
            if self._stop.is_set():
                raise DdpipeError(f"stopped waiting for the staged copy of {info.file}: staging was closed", path=dest)
            if time.monotonic() > deadline:
                raise DdpipeError(f"shard {info.file} was not staged within {self.options.wait_timeout:.0f} s; "
                                  "is local rank 0 of this node alive?", path=dest)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return dest

    def ready_path(self, shard: int) -> Path | None:
        """The staged copy of ``shard`` if it is complete and verified now, else None (no waiting)."""
        info = self.dataset.manifest.shards[shard]
        dest = self.dir / info.file
        return dest if is_staged(dest, info) else None

    @property
    def keeps_copies(self) -> bool:
        """Without a capacity no copy is evicted: each stays for the next epoch (and run)."""
        return self.options.capacity is None

    def invalidate(self, shard: int) -> None:
        """The copy of ``shard`` differs from the manifest (found on read): remove it, stamp first, so
        that it is staged again rather than trusted."""
        remove_staged(self.dir / self.dataset.manifest.shards[shard].file)

    def release(self, shard: int) -> None:
        """This rank has finished reading ``shard`` this epoch (eviction may take it back)."""
        if self.options.capacity is None:
            return
        self._my_runs[shard] = self._my_runs.get(shard, 1) - 1
        if self._my_runs[shard] > 0:
            return  # this rank comes back to the shard later in the epoch
        info = self.dataset.manifest.shards[shard]
        marker = self.dir / f".{info.file}.done.{self._epoch}.{self.comm.world.local_rank}"
        marker.touch()

    def _remove_done_notes(self, before: int | None) -> None:
        """Remove the notes of :meth:`release` of epochs before ``before`` (None: every epoch's)."""
        for note in self.dir.glob(".*.done.*.*"):
            epoch = note.name.rsplit(".", 2)[-2]
            if before is None or (epoch.isdecimal() and int(epoch) < before):
                discard(note)

    def _all_done(self, shard: int) -> bool:
        name = self.dataset.manifest.shards[shard].file
        done = len(list(self.dir.glob(f".{name}.done.{self._epoch}.*")))
        return done >= self._readers.get(shard, 0)

    def _say_reached(self, place: int) -> None:
        """Tell the node's readers that the stager has come to ``place`` in this epoch's order (with a
        capacity, which holds the directory for this job alone)."""
        tmp = self.dir / f"{_REACHED}.{self.comm.world.rank}.partial"
        tmp.write_text(f"{self._epoch} {place}")
        commit(tmp, self.dir / _REACHED, durable=False)

    def _passed(self, shard: int) -> bool:
        """Whether the stager went past ``shard`` this epoch: a copy not there then was made and taken
        back (or never could be), and the reader takes the source's rather than wait for one that is
        not coming. Its eviction counted on notes that said the node's ranks were done with it, and a
        note may be stale: this epoch iterated a second time leaves the first time's."""
        if self.options.capacity is None:  # nothing is taken back
            return False
        try:
            epoch, place = map(int, (self.dir / _REACHED).read_text().split())
        except (OSError, ValueError):  # none yet
            return False
        return epoch == self._epoch and place > self._position.get(shard, place)

    def _directory_gone(self) -> DdpipeError:
        return DdpipeError("the staging directory was removed while this job staged into it (remove one only "
                           "between jobs, or give the job a capacity to keep it small)", path=self.dir)

    def _failed(self, dest: Path) -> Path:
        return dest.with_name(f".{dest.name}.failed")

    def check(self) -> None:
        """Raise what stopped this node's staging, if anything has (on the leader; never waits)."""
        if self._error is not None:
            raise self._error

    def wait(self) -> None:
        """Block until this epoch's staging is done (on the leader); raise what stopped it."""
        self._join()
        self.check()

    def close(self) -> None:
        """Stop staging: a copy under way is given up at its next chunk, and removed."""
        self._stop.set()
        self._join()

    def _stop_at_exit(self) -> None:
        self._stop.set()
        self._join(timeout=10)  # a hang bound: a chunk from a slow source, or a lock another job holds

    def _join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end, on the event it sets as it does, not on Thread.join() alone: a
        join that a signal's exception interrupted (Ctrl-C or SIGTERM in wait()) left the thread marked
        ended while it still ran (CPython 3.11), and a join after it returned at once."""
        if self._thread is not None and self._thread_ended.wait(timeout):
            self._thread.join()
            self._thread = None
            atexit.unregister(self._at_exit)


def _stop_if_alive(stager: weakref.ReferenceType[NodeStager]) -> None:
    """Stop ``stager``'s copy under way as the process ends, if the stager is still alive."""
    alive = stager()
    if alive is not None:
        alive._stop_at_exit()
