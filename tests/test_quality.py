from __future__ import annotations

import numpy as np

from ddpipe.manifest import Manifest, ShardInfo
from ddpipe.plan import PlanOptions, plan_epoch
from ddpipe.quality import score_epoch


def class_sorted(num_classes: int = 10, per_class: int = 100, shard: int = 50) -> tuple[Manifest, np.ndarray]:
    n = num_classes * per_class
    shards = tuple(ShardInfo(f"s{i}.tar", shard, 1, "x") for i in range(n // shard))
    return Manifest("wds", ("cls",), tuple(map(str, range(num_classes))), shards), np.arange(n) // per_class


def score(mode: str, q: float = 0.3) -> dict[str, float]:
    m, labels = class_sorted()
    plan = plan_epoch(m, 4, 0, 0, PlanOptions(shuffle=mode, exchange_fraction=q, batch_size=32, buffer_size=64))
    return score_epoch([r.order for r in plan.ranks], labels, 32).to_dict()


def test_scores_order_the_modes_as_expected() -> None:
    none, local, partial, full = score("none"), score("local"), score("partial", 0.5), score("global")
    assert none["batch_skew"] > 0.85 and none["order_correlation"] > 0.99 and none["rank_skew"] > 0.7
    assert local["order_correlation"] < 0.2 and local["batch_skew"] < none["batch_skew"]
    assert partial["batch_skew"] < local["batch_skew"] and partial["rank_skew"] < local["rank_skew"]
    assert full["batch_skew"] < partial["batch_skew"] and full["rank_skew"] < 0.1
    assert abs(full["batch_skew"] - full["random_skew"]) < 0.05  # global shuffling is as good as random


def test_more_exchange_mixes_more() -> None:
    scores = [score("partial", q) for q in (0.1, 0.3, 0.5)]
    assert scores[0]["batch_skew"] > scores[1]["batch_skew"] > scores[2]["batch_skew"]
    assert scores[0]["rank_skew"] > scores[1]["rank_skew"] > scores[2]["rank_skew"]
