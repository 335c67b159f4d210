"""Adding a shuffle mode is one class and one registry entry: a toy mode (each rank yields its reads
backwards), registered here, is planned, loaded, scored by ``ddpipe plan``'s advice and projected,
with no other code naming it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ddpipe
from ddpipe.bench.projection import Cluster, Workload, projection_table
from ddpipe.reading import read_samples
from ddpipe.shufflers import SHUFFLERS
from ddpipe.shufflers.base import ShuffleMode

from ..helpers import make_dataset


class Backwards(ShuffleMode):
    name = "backwards"
    compared = "between"

    def yield_positions(self, n: int, seed: int, epoch: int, rank: int, buffer_size: int) -> np.ndarray:
        return np.arange(n)[::-1].copy()


@pytest.fixture
def backwards(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(SHUFFLERS, Backwards.name, Backwards())
    return Backwards.name


def test_a_registered_mode_is_planned_and_loaded(backwards: str, tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "ds", "wds", [5, 7, 4])
    dataset = ddpipe.open_dataset(root)
    plan = ddpipe.plan_epoch(dataset.manifest, 2, 0, 0, ddpipe.PlanOptions(shuffle=backwards, batch_size=2))
    for r in plan.ranks:
        assert list(r.order) == list(r.reads[::-1])
    assert sorted(np.concatenate([r.order for r in plan.ranks]).tolist()) == list(range(16))
    keys = [s["__key__"] for b in ddpipe.EncodedStream(root, 4, shuffle=backwards) for s in b]
    one = ddpipe.plan_epoch(dataset.manifest, 1, 0, 0, ddpipe.PlanOptions(shuffle=backwards, batch_size=4))
    assert keys == [s["__key__"] for s in read_samples(dataset, one.ranks[0].order)]
    assert keys == [s["__key__"] for s in read_samples(dataset, one.ranks[0].reads)][::-1]


def test_a_registered_mode_is_scored_and_projected(backwards: str, tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "ds", "wds", [8] * 6)
    dataset = ddpipe.open_dataset(root)
    labels = dataset.manifest.sample_labels()
    assert labels is not None
    advice = ddpipe.advise_exchange(dataset.manifest, labels, 2, [0.2, 0.5], ddpipe.PlanOptions(batch_size=4))
    assert [m.shuffle for m in advice.scores] == ["local", "partial", "partial", backwards, "global"]
    assert [m.exchange_fraction for m in advice.scores if m.shuffle == backwards] == [0.0]
    work = Workload(images=10_000, image_bytes=110e3, batch_size=64, step_time=0.1, decode_rate=2000)
    rows, _ = projection_table(Cluster(nodes=1), work, [1, 2])
    assert sum(r["shuffle"] == backwards for r in rows) == 4  # 2 scales, staged and not (not random access)


def test_an_unregistered_mode_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(ddpipe.OptionError, match="none, local, partial, global, not 'backwards'"):
        ddpipe.PlanOptions(shuffle="backwards")
