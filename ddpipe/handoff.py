"""Handing items between the loader's threads: a put that a stopped pipeline never blocks in, and
items handed over in groups."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Generator, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

#: Marks the end of a stream handed between threads.
END = object()


def put_unless_stopped(q: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    """Put ``item`` unless ``stop`` is set first; a full queue never blocks a stopped pipeline."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def ungrouped(q: queue.Queue[Any]) -> Generator[Any, None, None]:
    """The items of the groups (lists) put into ``q``, one at a time, until :data:`END`; an exception
    put there is raised here."""
    while True:
        group = q.get()
        if group is END:
            return
        if isinstance(group, BaseException):
            raise group
        yield from group


def in_groups(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` as lists of ``size`` (the last may be shorter), taken as they come."""
    it = iter(items)
    return iter(lambda: list(itertools.islice(it, size)), [])
