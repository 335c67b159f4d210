"""How far a rank's exchange must run ahead of its consumer: a training loop whose every step ends in
a collective (the gradients' allreduce) holds each rank at its step's end until all ranks have taken
the batch, while a rank still taking it may wait for an exchange round the held ranks must enter.
Stepped here sample by sample, ranks in lockstep: a hand-over that holds each rank's lead never
leaves the job waiting on itself, and one sample less for the rank with the largest lead does."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.plan import EpochPlan, PlanOptions, plan_epoch

from ..test_plan import manifest_of


def finishes_in_lockstep(plan: EpochPlan, holds: list[int]) -> bool:
    """Whether every rank takes every batch when each takes batch ``k`` only once all have taken batch
    ``k - 1``, rank ``r``'s exchange hands on at most ``holds[r]`` samples its consumer has not taken,
    and a round moves only once every rank has handed on all before it. A consumer taking a batch
    takes arrivals as they come, up to the furthest its batch needs; one whose batch is taken waits."""
    ranks, bs = plan.ranks, plan.options.batch_size
    bounds = [(r.start, r.stop) for r in ranks[0].rounds]
    handed = [0] * len(ranks)  # samples each rank's exchange has handed on
    taken = [0] * len(ranks)  # of those, the ones its consumer has taken
    for k in range(plan.num_batches):
        furthest = [int(r.positions[k * bs : (k + 1) * bs].max()) + 1 for r in ranks]
        while True:
            moved = False
            for r in range(len(ranks)):
                pulled = min(handed[r], furthest[r]) if taken[r] < furthest[r] else taken[r]
                moved |= pulled > taken[r]
                taken[r] = pulled
            if all(t >= f for t, f in zip(taken, furthest, strict=True)):
                break
            # the rounds every rank has entered: all it handed on before them is handed on
            entered = [j for j, (start, _) in enumerate(bounds) if all(h >= start for h in handed)]
            ready = bounds[max(entered)][1] if entered else 0
            for r in range(len(ranks)):
                now = min(ready, taken[r] + holds[r])
                moved |= now > handed[r]
                handed[r] = max(handed[r], now)
            if not moved:
                return False
    return True


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 60), min_size=2, max_size=16), world=st.integers(2, 5),
       fraction=st.sampled_from([0.1, 0.5, 1.0]), round_size=st.integers(2, 48), buffer=st.integers(0, 120),
       batch_size=st.integers(1, 12), seed=st.integers(0, 1000))
def test_a_hand_over_holding_the_lead_never_waits_on_itself(sizes: list[int], world: int, fraction: float,
                                                           round_size: int, buffer: int, batch_size: int,
                                                           seed: int) -> None:
    options = PlanOptions(shuffle="partial", exchange_fraction=fraction, round_size=round_size,
                          buffer_size=buffer, batch_size=batch_size)
    plan = plan_epoch(manifest_of(sizes), world, seed, 0, options)
    leads = [r.lead for r in plan.ranks]
    assert finishes_in_lockstep(plan, [max(1, lead) for lead in leads])
    widest = int(np.argmax(leads))
    if leads[widest] > 1:
        short = [max(1, lead) for lead in leads]
        short[widest] -= 1
        assert not finishes_in_lockstep(plan, short)


def test_small_batches_and_a_large_buffer_lead_past_the_default_prefetch() -> None:
    """What made the loader of a training loop hang with its default options: 2 ranks, batches of 4,
    a shuffle buffer of 4,096 and every sample exchanged: one rank's round waits for the other's
    exchange to hand on more than the 256 samples a default hand-over held."""
    options = PlanOptions(shuffle="partial", exchange_fraction=1.0, buffer_size=4096, batch_size=4)
    plan = plan_epoch(manifest_of([1000] * 8), 2, 0, 0, options)
    assert max(r.lead for r in plan.ranks) > 256
    assert not finishes_in_lockstep(plan, [256, 256])
    assert finishes_in_lockstep(plan, [max(256, r.lead) for r in plan.ranks])


def test_nothing_exchanged_leads_nothing() -> None:
    for shuffle in ("none", "local", "global"):
        plan = plan_epoch(manifest_of([30] * 6), 3, 0, 0, PlanOptions(shuffle=shuffle, batch_size=4))
        assert [r.lead for r in plan.ranks] == [0, 0, 0]
