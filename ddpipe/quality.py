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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class ShuffleScore:
    batch_skew: float
    random_skew: float
    order_correlation: float
    rank_skew: float

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


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2:
        return 0.0
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def score_epoch(streams: Sequence[np.ndarray], labels_of: np.ndarray, batch_size: int) -> ShuffleScore:
    """Score one epoch: ``streams[r]`` are the global indices rank ``r`` yielded, in order;
    ``labels_of[g]`` is the class of sample ``g``."""
    num_classes = int(labels_of.max()) + 1
    reference = np.bincount(labels_of, minlength=num_classes) / len(labels_of)
    label_streams = [labels_of[np.asarray(s, dtype=np.int64)] for s in streams]
    rank_skew = [_tv(np.bincount(ls, minlength=num_classes), reference) for ls in label_streams if len(ls)]
    return ShuffleScore(
        batch_skew=batch_skew(label_streams, num_classes, batch_size, reference),
        random_skew=random_skew(labels_of, num_classes, batch_size),
        order_correlation=float(np.mean([_spearman(np.asarray(s), np.arange(len(s))) for s in streams])),
        rank_skew=float(np.mean(rank_skew)) if rank_skew else 0.0,
    )
