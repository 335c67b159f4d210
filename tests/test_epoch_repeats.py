"""A shuffled epoch read whole and begun again with no ``set_epoch`` between (``ddpipe/epoch_repeats.py``):
the loop that forgot ``set_epoch`` trained on one order every epoch, without a word. It is said once,
at the caller's own line; a loop that places each epoch, repeats one on purpose, resumes, or reads
an unshuffled dataset hears nothing."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

import ddpipe
from ddpipe.errors import RepeatedEpochWarning
from tests.reading_apart import make, write_images

pytest.importorskip("nvidia.dali")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_images(tmp_path_factory.mktemp("repeats") / "wds")


def heard(loop: Callable[[], object]) -> list[warnings.WarningMessage]:
    """The RepeatedEpochWarnings ``loop`` gave."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        loop()
    return [w for w in said if issubclass(w.category, RepeatedEpochWarning)]


def read_all(loader: Iterable[Any], times: int = 1) -> None:
    for _ in range(times):
        for _batch in loader:
            pass


@pytest.mark.parametrize("read_in", ["thread", "process"])
def test_an_epoch_begun_again_without_set_epoch_is_said_once_at_the_callers_line(images: Path, read_in: str) -> None:
    loader = make(images, read_in, gpu=False)

    def three_epochs() -> None:
        for _ in range(3):
            for _batch in loader:  # the line the warning names
                pass

    said = heard(three_epochs)
    loader.close()
    assert len(said) == 1
    assert str(said[0].message).startswith("epoch 0 begins again with no set_epoch() since it was read: its "
                                           "batches come in the same order as before; call loader.set_epoch")
    assert said[0].filename == __file__ and "for _batch in loader" in Path(__file__).read_text().splitlines()[
        said[0].lineno - 1]


def test_an_encoded_stream_begun_again_is_said_too_and_a_set_epoch_ends_it(images: Path) -> None:
    stream = ddpipe.EncodedStream(images, 8, shuffle="partial", seed=3)
    said = heard(lambda: read_all(stream, times=2))
    assert [str(w.message).split("; ")[1] for w in said] == [
        "call stream.set_epoch(epoch) as each epoch starts for a new shuffle (set_epoch(0) repeats it on purpose)"]

    def placed() -> None:
        stream.set_epoch(0)
        read_all(stream)
        stream.set_epoch(1)
        read_all(stream)

    assert heard(placed) == []
    stream.close()


def test_placing_each_epoch_repeating_one_on_purpose_or_leaving_one_early_is_not_said(images: Path) -> None:
    loader = make(images, "thread", gpu=False)

    def placed() -> None:
        for epoch in (0, 1, 1, 2):  # 1 twice: set_epoch(1) again repeats it on purpose
            loader.set_epoch(epoch)
            read_all(loader)
        loader.set_epoch(3)
        for _ in range(2):  # left after its first batch: not read whole, so not begun "again"
            next(iter(loader))
        state = loader.state_dict()
        read_all(loader)
        loader.load_state_dict(state)  # a resumed epoch is placed too
        read_all(loader)

    assert heard(placed) == []
    loader.close()


def test_an_unshuffled_epoch_is_one_order_every_epoch_and_not_said(images: Path) -> None:
    loader = make(images, "thread", gpu=False, shuffle="none")
    assert heard(lambda: read_all(loader, times=3)) == []
    loader.close()
