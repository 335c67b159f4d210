"""How well mixed an epoch's stream is, from the labels and stored positions of what each rank yields.

- ``batch_skew``: mean total-variation distance between each batch's class histogram and the
  dataset's (0: every batch has the dataset's class mix; 1: batches of one class a dataset of many
  never has). Read it against ``random_skew``, the same measure for uniformly random batches of
  the same size, which is the best any shuffle can do.
- ``order_correlation``: Spearman correlation between stored position and yield position within
  each rank, averaged over ranks (1: stored order; near 0: no trace of it).
- ``rank_skew``: mean TV distance between each rank's class mix over the whole epoch and the
  dataset's: what local shuffling cannot fix on class-sorted shards, and what the exchange
  reduces (near 0 for ``global``).
- ``step_skew``: mean TV distance between each step's global batch (every rank's batch of that
  step together) and the dataset's class mix. The exchange moves samples between ranks within a
  round, so it cannot change it: when the whole job reads few classes at a time (few ranks on
  class-sorted shards), only a larger shuffle buffer or a shard order that interleaves classes can.

:func:`advise_exchange` scores the plans of ``local``, ``partial`` at several Q and ``global`` for
one world size, from the manifest alone (``ddpipe plan``), and picks the smallest Q whose batch
skew closes a chosen share of the gap between ``local`` and ``global``: batch norm's statistics
are a rank's local batch, so that is the score that follows accuracy (benchmarks/shuffle_accuracy.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from .errors import OptionError
from .manifest import Manifest
from .plan import PlanOptions, plan_epoch
from .shufflers import compared_modes, get_shuffler


@dataclass(frozen=True)
class ShuffleScore:
    batch_skew: float
    random_skew: float
    order_correlation: float
    rank_skew: float
    step_skew: float

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def _tv(counts: np.ndarray, reference: np.ndarray) -> float:
    return float(0.5 * np.abs(counts / counts.sum() - reference).sum())


def batch_skew(labels: Sequence[np.ndarray], num_classes: int, batch_size: int, reference: np.ndarray) -> float:
    """Mean TV distance of each full batch's class mix from ``reference`` (class frequencies)."""
    distances = []
    for stream in labels:
        for start in range(0, len(stream) - batch_size + 1, batch_size):
            counts = np.bincount(stream[start : start + batch_size], minlength=num_classes)
            distances.append(_tv(counts, reference))
    return float(np.mean(distances)) if distances else 0.0


def random_skew(all_labels: np.ndarray, num_classes: int, batch_size: int, batches: int = 500,
                seed: int = 0) -> float:
    """``batch_skew`` of uniformly random batches: the floor a perfect shuffle reaches."""
    rng = np.random.default_rng(seed)
    reference = np.bincount(all_labels, minlength=num_classes) / len(all_labels)
    draws = [rng.choice(all_labels, batch_size, replace=False) for _ in range(batches)]
    return batch_skew(draws, num_classes, batch_size, reference)


def step_skew(labels: Sequence[np.ndarray], num_classes: int, batch_size: int, reference: np.ndarray) -> float:
    """Mean TV distance of each step's global batch (the ranks' batches of that step together) from
    ``reference``, over the steps where every rank has a full batch."""
    steps = min(len(stream) for stream in labels) // batch_size if len(labels) else 0
    distances = [_tv(np.bincount(np.concatenate([s[i * batch_size : (i + 1) * batch_size] for s in labels]),
                                 minlength=num_classes), reference) for i in range(steps)]
    return float(np.mean(distances)) if distances else 0.0


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2:
        return 0.0
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def score_epoch(streams: Sequence[np.ndarray], labels_of: np.ndarray, batch_size: int,
                random_floor: float | None = None) -> ShuffleScore:
    """Score one epoch: ``streams[r]`` are the global indices rank ``r`` yielded, in order;
    ``labels_of[g]`` is the class of sample ``g``; ``random_floor``: ``random_skew``, if known."""
    num_classes = int(labels_of.max()) + 1
    reference = np.bincount(labels_of, minlength=num_classes) / len(labels_of)
    label_streams = [labels_of[np.asarray(s, dtype=np.int64)] for s in streams]
    rank_skew = [_tv(np.bincount(ls, minlength=num_classes), reference) for ls in label_streams if len(ls)]
    return ShuffleScore(
        batch_skew=batch_skew(label_streams, num_classes, batch_size, reference),
        random_skew=random_skew(labels_of, num_classes, batch_size) if random_floor is None else random_floor,
        order_correlation=float(np.mean([_spearman(np.asarray(s), np.arange(len(s))) for s in streams])),
        rank_skew=float(np.mean(rank_skew)) if rank_skew else 0.0,
        step_skew=step_skew(label_streams, num_classes, batch_size, reference),
    )


@dataclass(frozen=True)
class ModeScore:
    """One shuffle's scores, and the share of the local-to-global batch-skew gap it closes."""

    shuffle: str
    exchange_fraction: float
    score: ShuffleScore
    gap_closed: float

    def to_dict(self) -> dict[str, object]:
        return {"shuffle": self.shuffle, "exchange_fraction": self.exchange_fraction, **self.score.to_dict(),
                "gap_closed": self.gap_closed}


# A plan whose steps are this many times further from the class mix than a global shuffle's lost
# accuracy that no Q recovered in benchmarks/shuffle_accuracy.py (W = 16: 2.4 times, Q = 0.9 recovered
# 84%; W = 64: 1.9 times, Q = 0.7 recovered 96%): there the shuffle buffer is the lever
STEP_SKEW_LIMIT = 2.0


@dataclass(frozen=True)
class ExchangeAdvice:
    world_size: int
    batch_size: int
    samples_per_rank: int
    within: float  # the chosen Q leaves at most this share of the batch-skew gap open
    scores: tuple[ModeScore, ...]  # local, partial at each Q (ascending), global
    chosen: float | None  # the smallest Q that does; None if none of those scored does

    @property
    def buffer_bound(self) -> bool:
        """Whether the steps themselves are far from the class mix, which no Q changes."""
        local, best = self.scores[0].score.step_skew, self.scores[-1].score.step_skew
        return local > STEP_SKEW_LIMIT * best

    def to_dict(self) -> dict[str, object]:
        return {"world_size": self.world_size, "batch_size": self.batch_size,
                "samples_per_rank": self.samples_per_rank, "within": self.within,
                "chosen_exchange_fraction": self.chosen, "buffer_bound": self.buffer_bound,
                "scores": [m.to_dict() for m in self.scores]}


def advise_exchange(manifest: Manifest, labels_of: np.ndarray, world_size: int, fractions: Sequence[float],
                    options: PlanOptions | None = None, within: float = 0.25, seed: int = 0,
                    epoch: int = 0) -> ExchangeAdvice:
    """Score ``local``, ``partial`` at each of ``fractions`` and ``global`` for ``world_size`` ranks
    (the plans the Loader would carry out with ``options``), and choose the smallest Q whose batch
    skew is within ``within`` of the local-to-global gap from global's."""
    if not 0 <= within <= 1:  # NaN too: "closes nan% of the gap"
        raise OptionError(f"within is a share of the gap, in [0, 1], not {within}")
    labels_of = np.asarray(labels_of)
    if labels_of.shape != (manifest.num_samples,):  # an IndexError deep in the scoring, or a score of other labels
        raise OptionError(f"labels_of has shape {labels_of.shape}, not one label per sample of the dataset: "
                          f"({manifest.num_samples},)")
    if labels_of.dtype.kind not in "iu":
        raise OptionError(f"labels_of must hold class numbers (manifest.sample_labels()), not {labels_of.dtype}")
    if labels_of.size and int(labels_of.min()) < 0:
        raise OptionError(f"labels_of must hold class numbers, 0 or more, not {labels_of.min()}")
    base = options or PlanOptions()
    num_classes = int(labels_of.max()) + 1 if len(labels_of) else 1
    floor = random_skew(labels_of, num_classes, base.batch_size)
    modes = [*((m, 0.0) for m in compared_modes("start")),
             *((m, q) for m in compared_modes("between")
               for q in (sorted(fractions) if get_shuffler(m).exchanges else [0.0])),
             *((m, 0.0) for m in compared_modes("end"))]
    raw = []
    for shuffle, q in modes:
        plan = plan_epoch(manifest, world_size, seed, epoch, replace(base, shuffle=shuffle, exchange_fraction=q))
        raw.append((shuffle, q, score_epoch([r.order for r in plan.ranks], labels_of, base.batch_size, floor),
                    plan.samples_per_rank))
    local, best = raw[0][2].batch_skew, raw[-1][2].batch_skew
    gap = local - best
    scores = tuple(ModeScore(shuffle, q, score, (local - score.batch_skew) / gap if gap > 0 else 1.0)
                   for shuffle, q, score, _ in raw)
    chosen = next((m.exchange_fraction for m in scores
                   if get_shuffler(m.shuffle).exchanges and m.gap_closed >= 1 - within),
                  None)
    return ExchangeAdvice(world_size, base.batch_size, raw[0][3], within, scores, chosen)
