"""The next epoch's first batches, read as an epoch ends.

A local shuffle's first batch waits for its shuffle buffer to fill (five batches read, their shards
checked), where DALI's own readers run on from one epoch into the next. So as an epoch read whole
ends, while the decoder still works through its last batches, the loader reads the first
:data:`READ_AHEAD_BATCHES` of the epoch it is likely to be asked for next: the next one, or the same
again where the last two asked for were the same (a caller that never sets the epoch). Asked for
that epoch, it has them at once; asked for another, or a resumed one, it drops them and reads
afresh. What reading ahead raised is raised at that epoch's turn, if it is asked for.

Nothing is read ahead where an epoch issues collectives (a ``partial`` shuffle over several ranks:
every rank would have to read ahead alike, and wind it down alike when not asked) or waits on the
node's staged copies (made only once an epoch is asked for). Read by threads, a copy of the stream
reads ahead on a thread of its own (:class:`EpochAhead`); read in a process, the reading process
does (read_server.py).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

from .handoff import Ahead

if TYPE_CHECKING:
    from .loop import Loop
    from .plan import PlanOptions
    from .sample import SampleBatch
    from .stream import EncodedStream

# the first batch waits for the shuffle buffer to fill; the next comes soon after it
READ_AHEAD_BATCHES = 2


def may_read_ahead(plan: PlanOptions, world_size: int, staged: bool) -> bool:
    """Whether an epoch can be read before it is asked for (see the module)."""
    return not staged and (plan.shuffle != "partial" or world_size == 1)


def serves(ahead: tuple[int, int], seed: int, epoch: int, pending: np.ndarray | None) -> bool:
    """Whether batches read ahead for (seed, epoch) ``ahead`` are those of the epoch at (``seed``,
    ``epoch``, ``pending``): a resumed epoch (``pending``) is another."""
    return pending is None and ahead == (seed, epoch)


def likely_next(previous: int | None, last: int) -> int:
    """The epoch a caller that asked for ``previous``, then ``last``, is likely to ask for next."""
    return last if previous == last else last + 1


class EpochAhead:
    """An epoch's batches read by a copy of ``stream``, on a thread of its own, from now on, at most
    :data:`READ_AHEAD_BATCHES` ahead of whoever takes them."""

    def __init__(self, stream: EncodedStream, seed: int, epoch: int) -> None:
        self.stream = copy.copy(stream)  # its own epoch, plan and figures; the dataset and comm shared
        self.stream.go_to(seed, epoch, None)
        self._batches: Loop[SampleBatch] = iter(self.stream)
        # let go of unclosed (a loader dropped), its thread is told to stop (Ahead), and no more: a collection
        # runs that on whichever thread it happens on, and one that waited there for the thread to end waited on
        # itself when it was the stream's own producer (the test suite hung so). At exit the producer is
        # stopped before the libraries it reads with go (stream.py)
        self._ahead = Ahead(self._batches, READ_AHEAD_BATCHES, "ddpipe-epoch-ahead")

    def serves(self, seed: int, epoch: int, pending: np.ndarray | None) -> bool:
        """Whether these are the batches of the epoch at (``seed``, ``epoch``, ``pending``)."""
        return serves((self.stream.seed, self.stream.epoch), seed, epoch, pending)

    def __iter__(self) -> EpochAhead:
        return self

    def __next__(self) -> SampleBatch:
        return next(self._ahead)

    def close(self) -> None:
        """Stop reading (after the batch being read), and let the stream's producer go."""
        self._ahead.close()
        self._batches.close()
