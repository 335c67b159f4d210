"""The watchdog that ends a job whose bulk transfer hangs."""

from __future__ import annotations

import threading

from ddpipe.comm import Watchdog


def recording_watchdog(timeout: float) -> tuple[Watchdog, list[str], threading.Event]:
    """A watchdog that records what it reports, and an event set at its first report."""
    fired: list[str] = []
    reported = threading.Event()

    def on_timeout(reason: str) -> None:
        fired.append(reason.split(" did not complete")[0])
        reported.set()

    return Watchdog(timeout, on_timeout), fired, reported


def test_a_watched_call_that_outlives_its_deadline_is_named() -> None:
    dog, fired, reported = recording_watchdog(0.05)
    with dog.watch("exchange round 3"):
        assert reported.wait(30), "the watchdog never fired"  # a hang bound, not a timing assert
    assert fired == ["exchange round 3"]


def test_a_call_that_ends_in_time_is_not_reported_later() -> None:
    """Disarmed calls stay quiet, even once the deadline they had has long passed: the watchdog
    checks again on its own clock, so a finished call must not leave a stale deadline behind."""
    dog, fired, reported = recording_watchdog(0.05)
    with dog.watch("round 1"):
        pass
    # ten of its checks pass with nothing armed (a slow machine can only make this pass, never fail)
    assert not reported.wait(0.5), fired
    with dog.watch("round 2"):
        pass
    # the next call hangs: only it is reported, not the two that ended
    with dog.watch("round 3"):
        assert reported.wait(30)
    assert fired == ["round 3"]


def test_a_silent_peer_is_reported_only_while_a_call_waits() -> None:
    """Silence is a reason to stop waiting, not to end a rank that waits for nothing (its previous
    rank may simply have finished): reported while armed, with what waited, long before the deadline."""
    silence: list[str] = []
    reasons: list[str] = []
    reported = threading.Event()

    def on_timeout(reason: str) -> None:
        reasons.append(reason)
        reported.set()

    dog = Watchdog(3600, on_timeout, lambda: silence[0] if silence else None)
    silence.append("host mnode2 (ranks 2, 3), which has shown no sign of life for 30 s")
    assert not reported.wait(2.5), reasons  # silent, but nothing waits (the watchdog checks every second)
    with dog.watch("exchange round 4"):
        assert reported.wait(30)
    assert reasons == ["exchange round 4 waits on host mnode2 (ranks 2, 3), which has shown no sign of life for 30 s"]
