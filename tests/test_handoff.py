"""The hand-over between the loader's producer and consumer is bounded in samples, not in groups:
an exchange with small rounds hands on short groups, and the plan's lead is counted in samples."""

from __future__ import annotations

import queue

import pytest

from ddpipe.handoff import END, SampleQueue, ungrouped


def test_short_groups_fill_the_hand_over_by_their_samples_not_their_number() -> None:
    q = SampleQueue(8)
    for group in ([1, 2], [3], [4, 5, 6], [7]):  # 7 samples in 4 groups: room for more
        q.put_nowait(group)
    q.put_nowait([8, 9, 10])  # one more group while fewer than 8 are queued
    with pytest.raises(queue.Full):
        q.put_nowait([11])
    assert q.get_nowait() == [1, 2]  # 8 queued now: still full
    with pytest.raises(queue.Full):
        q.put_nowait([11])
    assert q.get_nowait() == [3]
    q.put_nowait([11])


def test_the_end_and_an_error_take_a_place_each() -> None:
    q = SampleQueue(2)
    q.put_nowait([1])
    q.put_nowait(END)
    with pytest.raises(queue.Full):
        q.put_nowait(RuntimeError("late"))
    assert list(ungrouped(q)) == [1]
    assert q.empty()
