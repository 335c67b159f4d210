"""Handing items between the loader's threads: a put that a stopped pipeline never blocks in, items
handed over in groups, and a thread of its own running an iterator ahead of its caller (reading
ahead of the exchange, preparing batches ahead of the decoder)."""

from __future__ import annotations

import itertools
import queue
import threading
import weakref
from collections.abc import Generator, Iterable, Iterator
from typing import Any, TypeVar

from .sample import Sample

T = TypeVar("T")

#: Marks the end of a stream handed between threads.
END = object()


class SampleQueue(queue.Queue[Any]):
    """Groups of samples handed between threads, bounded by the samples queued, not the groups:
    groups differ in length (an exchange round's last one is short, a small round's whole output is
    one), and what the consumer may be owed is counted in samples (``RankPlan.lead``). A put waits
    while ``maxsize`` samples or more are queued; any other item (:data:`END`, an error) counts one."""

    def _init(self, maxsize: int) -> None:
        super()._init(maxsize)
        self._samples = 0

    def _qsize(self) -> int:
        return self._samples

    def _put(self, item: Any) -> None:
        super()._put(item)
        self._samples += _weight(item)

    def _get(self) -> Any:
        item = super()._get()
        self._samples -= _weight(item)
        return item


def _weight(item: Any) -> int:
    return max(1, len(item)) if isinstance(item, list) else 1


def put_unless_stopped(q: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    """Put ``item`` unless ``stop`` is set first; a full queue never blocks a stopped pipeline."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


class Ahead(Iterator[T]):
    """``items`` produced by a thread of its own (``name``), started at once, at most ``depth`` ahead of
    the caller, until the caller closes this (or lets go of it); an exception ``items`` raise reaches
    the caller after the items before it. Closing waits for the item being produced, then leaves
    ``items`` to the caller (to close, now that no thread runs it)."""

    def __init__(self, items: Iterator[T], depth: int, name: str) -> None:
        self._q: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._done = False
        # the thread holds the queue and the event, not this object: one let go of stops it
        self._thread = threading.Thread(target=_fill, args=(items, self._q, self._stop), daemon=True, name=name)
        self._thread.start()
        weakref.finalize(self, self._stop.set)

    def __iter__(self) -> Ahead[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item = self._q.get()
        if item is END:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        result: T = item
        return result

    def close(self) -> None:
        self._done = True
        self._stop.set()
        if self._thread is not threading.current_thread():  # else collected there: it stops by itself
            self._thread.join()


def _fill(items: Iterator[Any], q: queue.Queue[Any], stop: threading.Event) -> None:
    try:
        for item in items:
            if not put_unless_stopped(q, item, stop):
                return
        put_unless_stopped(q, END, stop)
    except BaseException as e:  # reaches the consumer intact
        put_unless_stopped(q, e, stop)


def read_ahead(samples: Iterator[Sample], depth: int, group: int = 32) -> Generator[Sample, None, None]:
    """``samples`` produced by a thread of its own, at most about ``depth`` ahead of the caller,
    until the caller closes this generator: reading that goes on while the caller waits (for an
    exchange round). Not stopped by the loader's stop: a rank that stops iterating still completes
    the exchange round in progress, which the other ranks are waiting in. Samples cross between the
    threads ``group`` at a time: a queue's put and get cost more than reading a small sample does."""
    chunks = Ahead(in_groups(samples, group), max(1, depth // group), "ddpipe-reader")
    try:
        for chunk in chunks:
            yield from chunk
    finally:
        chunks.close()


def groups(q: queue.Queue[Any]) -> Generator[list[Any], None, None]:
    """The groups (lists) put into ``q``, until :data:`END`; an exception put there is raised here."""
    while True:
        group = q.get()
        if group is END:
            return
        if isinstance(group, BaseException):
            raise group
        yield group


def ungrouped(q: queue.Queue[Any]) -> Generator[Any, None, None]:
    """The items of the groups put into ``q`` (:func:`groups`), one at a time."""
    for group in groups(q):
        yield from group


def in_groups(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` as lists of ``size`` (the last may be shorter), taken as they come."""
    it = iter(items)
    return iter(lambda: list(itertools.islice(it, size)), [])
