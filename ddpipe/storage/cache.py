"""Local copies of a remote dataset's objects while a process reads them.

A shard is fetched whole (ranged requests, ``concurrency`` at once) into a scratch directory, and
the format readers open it there as they would a file of a local dataset: every format, its index
and its checks work unchanged. The dataset asks for the next two shards ahead (:meth:`ObjectCache.prefetch`),
so that their transfers overlap the reading of the one before and each other's request latency
(a rank's read-ahead: two shards), and at most ``keep`` copies stay: the
oldest is unlinked (a reader that still has it open keeps its data until it closes it). Nodes that
read a dataset every epoch stage it instead (``ddpipe.staging``), one verified copy per node.

The scratch directory and the thread that fetches ahead belong to the process that made them: a
forked child makes its own (obstore's clients must not cross a fork either).
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import MissingShardError
from .objects import ObjectStorage


class ObjectCache:
    def __init__(self, storage: ObjectStorage, keep: int = 4) -> None:
        self.storage = storage
        self.keep = max(keep, 2)
        self._made: tuple[int, Path] | None = None  # (the process, its scratch directory): see dir
        self._lock = threading.RLock()  # dir's making, and the fetches (which ask for paths under it)
        self._fetches: dict[str, Future[Path]] = {}
        self._held: OrderedDict[str, None] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict[str, object]:
        """A copy for another process (spawned workers): its own scratch, lock, pool and fetches."""
        return {"storage": self.storage, "keep": self.keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["storage"], state["keep"])  # type: ignore[misc]

    @property
    def dir(self) -> Path:
        """This process's scratch directory (made on first use in each process, with fresh fetch
        state, and removed when the cache goes). Made once, whichever threads ask at once: two made
        it each, and the second forgot the first's fetches."""
        scratch = self._made_here()
        if scratch is not None:
            return scratch
        with self._lock:
            scratch = self._made_here()
            if scratch is None:
                scratch = Path(tempfile.mkdtemp(prefix="ddpipe-objects-"))
                weakref.finalize(self, shutil.rmtree, scratch, True)
                # and at the end of a multiprocessing child, which leaves by os._exit (no atexit hooks)
                multiprocessing.util.Finalize(self, shutil.rmtree, args=(scratch, True), exitpriority=0)
                self._fetches, self._held, self._pool = {}, OrderedDict(), None
                self._made = (os.getpid(), scratch)
            return scratch

    def _made_here(self) -> Path | None:
        """The scratch directory, if this process made it."""
        made = self._made
        return made[1] if made is not None and made[0] == os.getpid() else None

    def path(self, name: str) -> Path:
        return self.dir / name

    def _fetch(self, names: tuple[str, ...], sizes: tuple[int | None, ...]) -> Path:
        for i, (name, size) in enumerate(zip(names, sizes, strict=True)):
            dest = self.path(name)
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    self.storage.download(name, dest, size)
                except MissingShardError:
                    if i == 0:
                        raise  # a sidecar is optional: a tar without its index is scanned
        return self.path(names[0])

    def _submit(self, names: tuple[str, ...], sizes: tuple[int | None, ...], here: bool) -> Future[Path]:
        """The fetch of ``names``: one already under way, else a new one, in the pool or (``here``)
        run by the caller, so that the shard wanted now never waits behind the ones fetched ahead."""
        self.path(names[0])  # this process's directory and fetch state, made (or remade after a fork) first
        run_here = False
        with self._lock:
            future = self._fetches.get(names[0])
            if future is None:
                if here:
                    future, run_here = Future(), True
                else:
                    if self._pool is None:
                        self._pool = ThreadPoolExecutor(2, thread_name_prefix="ddpipe-objects")
                    future = self._pool.submit(self._fetch, names, sizes)
                self._fetches[names[0]] = future
            self._held[names[0]] = None
            self._held.move_to_end(names[0])
            while len(self._held) > self.keep:
                old, _ = self._held.popitem(last=False)
                stale = self._fetches.pop(old, None)
                if stale is not None and stale.done() and stale.exception() is None:
                    _unlink_tree(self.path(old))
        if run_here:
            try:
                future.set_result(self._fetch(names, sizes))
            except BaseException as e:
                future.set_exception(e)
        return future

    def prefetch(self, names: tuple[str, ...], sizes: tuple[int | None, ...]) -> None:
        """Start fetching ``names`` (a shard, then its sidecars) in the background."""
        self._submit(names, sizes, here=False)

    def fetch(self, names: tuple[str, ...], sizes: tuple[int | None, ...]) -> Path:
        """``names`` here (fetched now, or waited for), the first one's local path. A failed fetch
        raises here, and is tried afresh the next time."""
        future = self._submit(names, sizes, here=True)
        try:
            return future.result()
        except BaseException:
            with self._lock:
                if self._fetches.get(names[0]) is future:
                    del self._fetches[names[0]]
            raise

    def close(self) -> None:
        if self._pool is not None and self._made_here() is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _unlink_tree(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
