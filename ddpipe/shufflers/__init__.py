"""Shuffle modes: one algorithm per module, each one entry in a registry the plan consults.

- ``none``: stored order.
- ``local``: each rank permutes its runs of shards and streams through a bounded shuffle buffer.
- ``partial``: ``local``, after exchanging a fraction Q of the samples with other ranks (the
  exchange itself is carried out by :mod:`ddpipe.exchange`).
- ``global``: a permutation of the whole epoch, read by random access.
"""

from __future__ import annotations

from .base import ShuffleMode
from .full import GlobalShuffle
from .local import LocalShuffle
from .none import NoShuffle
from .partial import ExchangeRound, PartialShuffle, ReceiptLifetimes, receipt_lifetimes

SHUFFLERS: dict[str, ShuffleMode] = {m.name: m for m in (NoShuffle(), LocalShuffle(), PartialShuffle(),
                                                          GlobalShuffle())}
SHUFFLE_MODES = tuple(SHUFFLERS)


def get_shuffler(name: str) -> ShuffleMode:
    try:
        return SHUFFLERS[name]
    except KeyError:
        raise ValueError(f"shuffle must be one of {', '.join(SHUFFLE_MODES)}, not {name!r}") from None


__all__ = ["SHUFFLERS", "SHUFFLE_MODES", "ExchangeRound", "ReceiptLifetimes", "ShuffleMode", "get_shuffler",
           "receipt_lifetimes"]
