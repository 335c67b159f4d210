"""Refilled batches: the plan's sizes, every decodable sample once and in order, repeats only at the end."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.decode.refill import refilled
from ddpipe.loader_stats import DecodeStats


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=12), data=st.data())
def test_refilled_batches_have_the_plans_sizes_and_every_sample_once(sizes: list[int], data: st.DataObject) -> None:
    total = sum(sizes)
    kept = data.draw(st.lists(st.booleans(), min_size=total, max_size=total))
    if not any(kept):
        kept[0] = True  # a rank with nothing decodable at all is an error, tested below
    ids = torch.arange(total)
    batches, at = [], 0
    for n in sizes:  # what a decoder hands back: each planned batch less its dropped samples
        keep = torch.tensor(kept[at : at + n])
        batches.append((ids[at : at + n][keep].float().view(-1, 1, 1, 1), ids[at : at + n][keep]))
        at += n
    stats = DecodeStats()
    out = list(refilled(iter(batches), sizes, stats))
    assert [len(y) for _, y in out] == sizes
    assert all(torch.equal(x.view(-1).long(), y) for x, y in out)  # images stay with their labels
    stream = torch.cat([y for _, y in out]).tolist()
    decodable = ids[torch.tensor(kept)].tolist()
    assert stream[: len(decodable)] == decodable  # every decodable sample, once, in stream order
    assert stats.repeated == total - len(decodable) == len(stream) - len(decodable)
    assert set(stream[len(decodable) :]) <= set(decodable)  # then only repeats


def test_nothing_decodable_is_an_error() -> None:
    import pytest

    from ddpipe.errors import DdpipeError

    empty = (torch.zeros(0, 1, 1, 1), torch.zeros(0, dtype=torch.int64))
    with pytest.raises(DdpipeError, match="every sample"):
        list(refilled(iter([empty, empty]), [2, 2], DecodeStats()))
