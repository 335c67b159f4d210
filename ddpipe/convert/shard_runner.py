"""Writing one rank's shards: in this process or in worker processes, each shard made durable, named
and handed on by a thread of this process while the next ones are written.

A shard is flushed to the disk before it is named (so that a rerun after a power loss finds it whole
or not at all), and the flush of a 16 MB shard took ~40 ms here while its writer waited: one worker
converting 3,000 images without the check took 1.7 s, 1.0 s with the flush on a thread. So a writer
returns each shard finished under its temporary name, and the :class:`_Publisher` here flushes,
names and records it (``publish``) while the writers go on.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
from collections import deque
from collections.abc import Callable
from types import TracebackType

from tqdm import tqdm

from ..workers import bind_to_parent, ended_as_they_started, stop_workers, worker_context
from .shard_job import ShardJob, ShardResult, discard_partial, publish, write_shard


def run_jobs(jobs: list[ShardJob], mine: list[int], workers: int, progress: str | None,
             written: Callable[[ShardResult], None] = lambda result: None) -> dict[int, ShardResult]:
    """Write the shards ``mine`` (by ``workers`` processes where there are several), each passed to
    ``written`` as it is published, on the publishing thread; a progress bar named ``progress`` (none
    for None) counts their images. The workers are given two shards each at a time, not all at once,
    and no more shards wait to be published than there are workers, so that finished shards wait for
    ``written`` (an upload) a few at a time."""
    total = sum(len(jobs[i].items) for i in mine)
    with tqdm(total=total, unit="img", desc=progress, disable=progress is None,
              dynamic_ncols=True) as bar, _Publisher(jobs, written, workers) as publisher:
        if workers <= 1:
            for i in mine:
                publisher.add(i, write_shard(jobs[i], on_item=lambda: bar.update(1), commit=False))
        else:
            _in_workers(jobs, mine, workers, bar, publisher)
    return publisher.results


def _in_workers(jobs: list[ShardJob], mine: list[int], workers: int, bar: tqdm[None], publisher: _Publisher) -> None:
    received = 0
    futures: dict[cf.Future[ShardResult], int] = {}  # the shards the workers are given
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=worker_context(), initializer=bind_to_parent) as pool:
        try:  # from the first submit on: a Ctrl-C that lands while submitting is handled too
            queue = iter(mine)
            for i in itertools.islice(queue, 2 * workers):
                futures[pool.submit(write_shard, jobs[i], commit=False)] = i
            while futures:
                finished, _ = cf.wait(futures, return_when=cf.FIRST_COMPLETED)
                for fut in finished:
                    i = futures.pop(fut)
                    result = fut.result()
                    received += 1
                    bar.update(len(jobs[i].items))
                    publisher.add(i, result)
                    for j in itertools.islice(queue, 1):
                        futures[pool.submit(write_shard, jobs[j], commit=False)] = j
        except BaseException as e:
            # an error or Ctrl-C: end the workers now rather than wait for their shards (a worker
            # blocked on a slow source held the command for as long), and remove what they leave
            stop_workers(pool)
            pool.shutdown(wait=True, cancel_futures=True)
            for j in futures.values():
                discard_partial(jobs[j])
            if isinstance(e, cf.process.BrokenProcessPool) and not received:
                raise ended_as_they_started("the conversion's worker processes") from None
            raise


class _Publisher:
    """Publishes finished shards in the order given, on a thread of its own; :meth:`add` waits while
    more than ``behind`` are waiting, and raises the error of any publication that failed."""

    def __init__(self, jobs: list[ShardJob], written: Callable[[ShardResult], None], behind: int) -> None:
        self._jobs, self._written, self._behind = jobs, written, max(1, behind)
        self._thread = cf.ThreadPoolExecutor(1, thread_name_prefix="ddpipe-publish")
        self._waiting: deque[tuple[cf.Future[None], ShardResult]] = deque()
        self.results: dict[int, ShardResult] = {}

    def add(self, index: int, result: ShardResult) -> None:
        self._waiting.append((self._thread.submit(self._publish, index, result), result))
        while len(self._waiting) > self._behind:
            self._waiting.popleft()[0].result()

    def _publish(self, index: int, result: ShardResult) -> None:
        published = publish(self._jobs[index], result)
        self._written(published)
        self.results[index] = published

    def __enter__(self) -> _Publisher:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if et is None:
                while self._waiting:
                    self._waiting.popleft()[0].result()
        finally:
            # on an error (a full disk, say), the shards not yet published are not left behind under
            # their hidden names; one whose publication failed removed its own
            self._thread.shutdown(wait=True, cancel_futures=True)
            for future, result in self._waiting:
                if future.cancelled() and result.finished is not None:
                    result.finished.discard()
