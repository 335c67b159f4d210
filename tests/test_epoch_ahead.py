"""The next epoch's first batches read as an epoch ends (``ddpipe/epoch_ahead.py``), by threads and by
a reading process: whichever epoch is asked for comes as planned, one read ahead was read before it
was asked for, and the thread that reads ahead ends with whoever lets go of it."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ddpipe
from ddpipe import epoch_ahead
from ddpipe.handoff import Ahead
from tests.reading_apart import BATCH, epoch_of, make, natural_samples, same, write_images

pytest.importorskip("nvidia.dali")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_images(tmp_path_factory.mktemp("ahead") / "wds")


@pytest.mark.parametrize("read_in", ["thread", "process"])
def test_the_epoch_read_ahead_is_the_epoch_asked_for(images: Path, read_in: str) -> None:
    """Read ahead as asked for (1 after 0, 2 after 1, 2 after 2 twice), and not (2 after 1 and 2, 5, 3,
    a resumed epoch): each epoch comes as a new loader, which has read nothing ahead, gives it."""
    loader = make(images, read_in)
    for epoch in (0, 1, 2, 2, 2, 5, 3):
        fresh = make(images, "thread")
        assert same(epoch_of(loader, epoch), epoch_of(fresh, epoch)), epoch
        fresh.close()
    resumes_epoch_4_as_a_new_loader_does(images, loader)  # the epoch it has read ahead
    loader.close()


def resumes_epoch_4_as_a_new_loader_does(images: Path, loader: ddpipe.Loader) -> None:
    """Given a state three batches into epoch 4, ``loader`` gives the rest, as a new loader does."""
    fresh = make(images, "thread")
    fresh.set_epoch(4)
    it = iter(fresh)
    for _ in range(3):
        next(it)
    state = fresh.state_dict()
    it.close()  # type: ignore[attr-defined]
    for each in (fresh, loader):
        each.load_state_dict(state)
    want, got = list(fresh), list(loader)
    assert same(got, want) and sum(len(y) for _, y in got) == 60 - 3 * BATCH
    fresh.close()


def held_ahead(loader: ddpipe.Loader) -> bool:
    """Whether the loader (reading by threads) holds the next epoch's first batches, read."""
    ahead = loader.decoding._ahead
    return ahead is not None and ahead._ahead._q.full()


@pytest.mark.parametrize("reads_ahead", [True, False])
def test_an_epoch_read_ahead_by_threads_was_read_before_it_was_asked_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads_ahead: bool) -> None:
    """Epoch 1's first batches are read as epoch 0 ends: with the shards gone by the time it is asked
    for, epoch 1 still comes whole (a local shuffle's first batch needs all 60 samples read into its
    buffer); a loader that does not read ahead finds them missing."""
    if not reads_ahead:
        monkeypatch.setattr(epoch_ahead, "may_read_ahead", lambda *_: False)
    root = tmp_path / "wds"
    ddpipe.write_dataset(root, iter(natural_samples(60)), samples_per_shard=16, classes=["a", "b", "c"])
    loader, fresh = make(root, "thread"), make(root, "thread")
    want = epoch_of(fresh, 1)
    fresh.close()
    epoch_of(loader, 0)
    deadline = time.monotonic() + 60  # a hang bound: the batches are read within a second or so
    while reads_ahead and not held_ahead(loader) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held_ahead(loader) == reads_ahead
    for shard in root.glob("*.tar"):
        shard.unlink()
    if reads_ahead:
        assert same(epoch_of(loader, 1), want)
    else:
        with pytest.raises(FileNotFoundError):
            epoch_of(loader, 1)
    loader.close()


@pytest.mark.parametrize("read_in", ["thread", "process"])
def test_where_no_epoch_is_read_ahead_the_next_ones_plan_is_made_ahead(
        images: Path, monkeypatch: pytest.MonkeyPatch, read_in: str) -> None:
    """Where nothing is read ahead (a partial shuffle on several ranks, or staging), the plan of the
    epoch likely next is made as an epoch ends, on a thread of its own: asked for that epoch, the
    loader plans nothing on the caller's thread; asked for another, or a resumed one, it plans
    afresh. The batches are a fresh loader's either way."""
    import ddpipe.stream
    from ddpipe.plan import plan_epoch

    whole = {}
    for epoch in (0, 1, 3):
        fresh = make(images, "thread")
        whole[epoch] = epoch_of(fresh, epoch)
        fresh.close()
    monkeypatch.setattr(epoch_ahead, "may_read_ahead", lambda *_: False)
    planned: dict[str, list[int]] = {}

    def recorded(*args: Any) -> Any:
        planned.setdefault(threading.current_thread().name, []).append(args[3])
        return plan_epoch(*args)

    monkeypatch.setattr(ddpipe.stream, "plan_epoch", recorded)
    loader = make(images, read_in)
    for epoch in (0, 1, 1, 3):
        assert same(epoch_of(loader, epoch), whole[epoch]), epoch
    assert planned.pop("MainThread") == [0, 1, 3]  # 1 again: its plan made ahead was 2's
    ahead = planned.pop("ddpipe-plan-ahead")
    assert ahead[:3] == [1, 2, 1] and ahead[3:] in ([], [4])  # 4 after 3: made by now, or being made
    assert not planned
    resumes_epoch_4_as_a_new_loader_does(images, loader)  # the epoch whose plan it has made ahead
    loader.close()


def test_what_the_thread_ahead_raises_comes_after_the_items_before_it() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("the third")

    ahead = Ahead(items(), 1, "test-ahead")
    assert next(ahead) == 1 and next(ahead) == 2
    with pytest.raises(ValueError, match="the third"):
        next(ahead)
    with pytest.raises(StopIteration):
        next(ahead)


def test_the_thread_ahead_ends_when_its_holder_lets_go_of_it_unread() -> None:
    """Started at once, full, never read from: closed, or only let go of, its thread ends."""
    def endless() -> Iterator[int]:
        n = 0
        while True:
            n += 1
            yield n

    for close in (True, False):
        ahead = Ahead(endless(), 2, "test-ahead-unread")
        thread = ahead._thread
        if close:
            ahead.close()
        del ahead
        gc.collect()
        thread.join(timeout=60)  # a hang bound: it sees the stop within a put's timeout
        assert not thread.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "test-ahead-unread"]

