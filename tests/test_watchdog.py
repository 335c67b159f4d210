"""The watchdog that ends a job whose bulk transfer hangs."""

from __future__ import annotations

import threading

from ddpipe.comm import Watchdog


def test_a_watched_call_that_outlives_its_deadline_is_named() -> None:
    fired: list[str] = []
    done = threading.Event()

    def on_timeout(what: str) -> None:
        fired.append(what)
        done.set()

    dog = Watchdog(0.05, on_timeout)
    with dog.watch("exchange round 3"):
        assert done.wait(30), "the watchdog never fired"  # a hang bound, not a timing assert
    assert fired == ["exchange round 3"]


def test_a_call_that_ends_in_time_is_not_reported_later() -> None:
    """Disarmed calls stay quiet, even once the deadline they had has long passed: the watchdog
    checks again on its own clock, so a finished call must not leave a stale deadline behind."""
    fired: list[str] = []
    late = threading.Event()

    def on_timeout(what: str) -> None:
        fired.append(what)
        late.set()

    dog = Watchdog(0.05, on_timeout)
    with dog.watch("round 1"):
        pass
    # ten of its checks pass with nothing armed (a slow machine can only make this pass, never fail)
    assert not late.wait(0.5), fired
    with dog.watch("round 2"):
        pass
    # the next call hangs: only it is reported, not the two that ended
    with dog.watch("round 3"):
        assert late.wait(30)
    assert fired == ["round 3"]
