"""The state contract, written once and run against every stage (as torchdata.nodes' tests run
``run_test_save_load_state`` against each node): a state taken mid-epoch and loaded into a fresh
stage continues with exactly what had not been yielded."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Protocol, TypeVar

B = TypeVar("B")
B_co = TypeVar("B_co", covariant=True)


class Resumable(Protocol[B_co]):
    def __iter__(self) -> Iterator[B_co]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def check_save_load_state(make: Callable[[], Resumable[B]], items: Callable[[B], list[Hashable]], cut: int,
                          epoch: int = 1) -> None:
    """``make()``: a fresh stage of the same configuration; ``items(batch)``: what identifies each
    sample of a batch; ``cut``: the batches yielded before the state is taken.

    - The batches before the cut and those of a fresh stage resumed from the state are, together,
      the whole epoch's samples, each as often as in an uninterrupted epoch.
    - The resumed stage says how many batches are left, and yields that many.
    - A state taken after the resumed epoch's last batch resumes to nothing; the next epoch is whole.
    """
    whole = make()
    whole.set_epoch(epoch)
    everything = [items(b) for b in whole]
    assert 0 < cut < len(everything), "cut inside the epoch"

    first = make()
    first.set_epoch(epoch)
    before: list[list[Hashable]] = []
    for batch in first:
        before.append(items(batch))
        if len(before) == cut:
            break
    state = first.state_dict()

    resumed = make()
    resumed.load_state_dict(state)
    left = len(resumed)
    after = [items(b) for b in resumed]
    assert len(after) == left
    assert Counter(i for b in before + after for i in b) == Counter(i for b in everything for i in b)

    done = make()
    done.load_state_dict(resumed.state_dict())
    assert len(done) == 0 and list(done) == []
    done.set_epoch(epoch + 1)
    assert len([items(b) for b in done]) == len(everything)
