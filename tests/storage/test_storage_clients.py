"""obstore's clients and the scratch directory under threads and processes: threads asking at once
are each served, and a client never crosses a fork."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

import ddpipe
from ddpipe.errors import DdpipeError
from ddpipe.reading import read_samples
from ddpipe.storage import ObjectCache, open_storage

from .bucket_data import upload_dir
from .servers import RangeServer


def _keys_in_child(dataset: ddpipe.Dataset, out: Any) -> None:
    try:
        out.put(sorted(s["__key__"] for s in read_samples(dataset, np.arange(len(dataset)))))
    except DdpipeError as e:
        out.put(str(e))


AT_ONCE = 6


def asked_at_once(rounds: int, fresh_question: Callable[[], Callable[[], Any]]) -> Iterator[list[Any]]:
    """Each round, a fresh question (made by ``fresh_question``) asked by AT_ONCE threads released
    together, threads taking turns as often as they can (the windows of these races were a few
    bytecodes); the answers, a list a round."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(AT_ONCE) as pool:
            for _ in range(rounds):
                question, together = fresh_question(), threading.Barrier(AT_ONCE)

                def ask(_: int, question: Callable[[], Any] = question, together: threading.Barrier = together) -> Any:
                    together.wait()
                    return question()

                yield list(pool.map(ask, range(AT_ONCE)))
    finally:
        sys.setswitchinterval(switch)


def test_threads_asking_at_once_for_a_new_client_are_each_served(http_root: RangeServer) -> None:
    """The client is made on first use, which a shard's fetches (the pool's threads, the reader's) can
    ask for at once: a thread that found it half made took its own process for a forked one, and the
    epoch failed with the fork's message (a run of the suite on one core)."""
    (http_root.root / "wds").mkdir()
    (http_root.root / "wds" / "x").write_bytes(b"0123456789")
    # before the fix, 100 rounds failed in 2 runs of 5
    for sizes in asked_at_once(200, lambda: functools.partial(open_storage(f"{http_root.url}/wds").size, "x")):
        assert sizes == [10] * AT_ONCE


def test_threads_asking_at_once_for_the_scratch_directory_share_one() -> None:
    """A remote dataset's fetched shards go to a directory made on first use: threads that asked at
    once had each made one, and the second had forgotten the fetches under way in the first."""
    def fresh_cache_dir() -> Callable[[], Path]:
        cache = ObjectCache(open_storage("http://127.0.0.1:9/wds"))  # nothing is fetched: no server
        return lambda: cache.dir

    for dirs in asked_at_once(200, fresh_cache_dir):
        assert len(set(dirs)) == 1


def test_a_dataset_used_before_a_fork_is_refused_in_the_child_and_one_spawned_reads(
        local_sets: dict[str, Path], bucket: str) -> None:
    """obstore's clients do not survive a fork (their runtime's threads stay in the parent): a child
    forked after the dataset was used gets one line saying so rather than hang; a spawned one (the
    dataset pickled without its client) reads everything."""
    import multiprocessing

    url = f"s3://{bucket}/wds"
    upload_dir(local_sets["wds"], url)
    dataset = ddpipe.open_dataset(url)  # the parent's client is made here (the listing)
    parent = sorted(s["__key__"] for s in read_samples(dataset, np.arange(len(dataset))))
    for method in ("fork", "spawn"):
        ctx: Any = multiprocessing.get_context(method)
        out = ctx.Queue()
        child = ctx.Process(target=_keys_in_child, args=(dataset, out))
        child.start()
        got = out.get(timeout=120)
        child.join(timeout=60)
        if method == "fork":
            assert isinstance(got, str) and "forked from one that had used" in got and url in got
        else:
            assert got == parent and len(got) == 24
