"""What a loader's stages counted in the epoch being iterated: typed, one object per stage.

:class:`ReadStats` belongs to the encoded stream: its counts are written on the caller's thread as
batches are yielded; the producer thread only appends the name of a shard it finds corrupt, and
the exchange's figures are handed over whole once the epoch is read. :class:`DecodeStats` belongs
to the decode stage, written on the caller's thread as batches are decoded. A new epoch starts both
afresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

#: how many skipped samples a stage names (it counts them all)
NAMED_AT_MOST = 1000


class SkippedSample(NamedTuple):
    key: str
    shard: str  # the shard's file or object, as messages name it
    reason: str


@dataclass
class SkipCounts:
    """Samples left out under ``on_error="skip"``: all counted, the first :data:`NAMED_AT_MOST` named."""

    skipped: int = 0
    skipped_samples: list[SkippedSample] = field(default_factory=list)

    def skip(self, sample: SkippedSample) -> None:
        self.skipped += 1
        if len(self.skipped_samples) < NAMED_AT_MOST:
            self.skipped_samples.append(sample)


@dataclass(frozen=True)
class ExchangeStats:
    """What this rank's part in the partial exchange moved and cost in one epoch."""

    samples_sent: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0  # in the collectives, waiting included
    wait_seconds: float = 0.0  # waiting for slower ranks to arrive
    cpu_seconds: float = 0.0
    round_bytes: tuple[tuple[int, ...], ...] = ()  # per round, the bytes sent to each rank


@dataclass
class ReadStats(SkipCounts):
    """The encoded stream's epoch: samples dropped because they could not be read as ``index.json``
    records them (``ReadOptions(on_error="skip")``), the shards they came from, how many samples
    the consumer held for later batches at most, and the exchange's figures (after the epoch)."""

    corrupt_shards: list[str] = field(default_factory=list)
    held_peak: int = 0
    exchange: ExchangeStats | None = None


@dataclass
class DecodeStats(SkipCounts):
    """The decode stage's epoch: images that did not decode (``DecodeOptions(on_error="skip")``),
    and samples repeated to keep the last batches full after skips (decode/refill.py)."""

    repeated: int = 0


@dataclass(frozen=True)
class LoaderStats:
    """A loader's two stages' figures, and what they add up to."""

    read: ReadStats
    decode: DecodeStats

    @property
    def skipped(self) -> int:
        """Samples left out this epoch, unreadable or undecodable."""
        return self.read.skipped + self.decode.skipped

    @property
    def skipped_samples(self) -> list[SkippedSample]:
        return (self.read.skipped_samples + self.decode.skipped_samples)[:NAMED_AT_MOST]
