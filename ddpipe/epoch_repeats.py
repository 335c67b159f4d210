"""An epoch read whole and begun again with no ``set_epoch`` between: its batches come in the same
order as before, every epoch, which a training loop that forgot ``set_epoch`` never notices (PyTorch's
DistributedSampler repeats its order so, in silence). Said once, as a
:class:`~ddpipe.errors.RepeatedEpochWarning`; ``set_epoch`` with the same epoch repeats it on purpose."""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

from .errors import RepeatedEpochWarning


class EpochRepeats:
    """Watches one loader's (or stream's) epochs: :meth:`finished` as one is read whole, :meth:`reset`
    where the caller places it (``set_epoch``, ``load_state_dict``), :meth:`starting` as one begins."""

    def __init__(self, what: str, said_elsewhere: bool = False) -> None:
        self.what = what  # "loader", "stream": what the warning tells the caller to call set_epoch on
        # a stream under a decode stage (which watches the epochs it delivers), or a copy placed by go_to
        self.said_elsewhere = said_elsewhere
        self._finished: int | None = None
        self._said = False

    def reset(self) -> None:
        self._finished = None

    def finished(self, epoch: int) -> None:
        self._finished = epoch

    def starting(self, epoch: int, shuffle: str) -> None:
        # "none": one order, every epoch
        if self._finished != epoch or shuffle == "none" or self._said or self.said_elsewhere:
            return
        self._said = True
        warnings.warn(RepeatedEpochWarning(
            f"epoch {epoch} begins again with no set_epoch() since it was read: its batches come in the same "
            f"order as before; call {self.what}.set_epoch(epoch) as each epoch starts for a new shuffle "
            f"(set_epoch({epoch}) repeats it on purpose)"), stacklevel=_callers_level())


def _callers_level() -> int:
    """The ``stacklevel`` that names the caller's line (its ``for`` statement): the first frame outside
    ddpipe, however many of ddpipe's lie between (a Loader's, its decode stage's)."""
    inside = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame: FrameType | None = sys._getframe(1)  # the frame that warns, level 1
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level
