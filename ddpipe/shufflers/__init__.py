"""Shuffle modes: one algorithm per module, each one entry in a registry the plan consults.

- ``none``: stored order.
- ``local``: each rank permutes its runs of shards and streams through a bounded shuffle buffer.
- ``partial``: ``local``, after exchanging a fraction Q of the samples with other ranks (the
  exchange itself is carried out by :mod:`ddpipe.exchange`).
- ``global``: a permutation of the whole epoch, read by random access.
"""

from __future__ import annotations

from ..errors import OptionError
from .base import ShuffleMode
from .full import GlobalShuffle
from .local import LocalShuffle
from .none import NoShuffle
from .partial import ExchangeRound, PartialShuffle, ReceiptLifetimes, exchange_leads, receipt_lifetimes

SHUFFLERS: dict[str, ShuffleMode] = {m.name: m for m in (NoShuffle(), LocalShuffle(), PartialShuffle(),
                                                          GlobalShuffle())}
SHUFFLE_MODES = tuple(SHUFFLERS)


def get_shuffler(name: str) -> ShuffleMode:
    try:
        return SHUFFLERS[name]
    except KeyError:
        raise OptionError(f"shuffle must be one of {', '.join(SHUFFLERS)}, not {name!r}") from None


def compared_modes(role: str) -> list[str]:
    """The modes with that place (``"start"``, ``"between"``, ``"end"``) when modes are compared."""
    return [name for name, mode in SHUFFLERS.items() if mode.compared == role]


__all__ = [
    "SHUFFLERS",
    "SHUFFLE_MODES",
    "ExchangeRound",
    "ReceiptLifetimes",
    "ShuffleMode",
    "compared_modes",
    "exchange_leads",
    "get_shuffler",
    "receipt_lifetimes",
]
