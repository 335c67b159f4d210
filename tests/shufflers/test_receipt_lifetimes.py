"""How long a rank holds what it receives: the receive buffers that the plan says are held at once
bound what a slow consumer actually holds, and only long-held samples are copied out."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.plan import PlanOptions, RankPlan, plan_epoch
from ddpipe.shufflers import receipt_lifetimes

from ..test_plan import manifest_of


def buffers_held_by_slowest_consumer(rank: RankPlan, ahead: int, copy_out: tuple[np.ndarray, ...]) -> int:
    """Step a producer and the slowest consumer the queue allows, sample by sample: the most rounds
    whose buffers (taken one round early, freed when the consumer has yielded every sample left in
    them) are held at once."""
    round_of: dict[int, int] = {}  # stream position -> round whose buffer holds it
    for j, r in enumerate(rank.rounds):
        first_received = r.stop - len(r.received)
        for i in range(len(r.received)):
            if not copy_out[j][i]:
                round_of[first_received + i] = j
    # yield position p takes the arrival the plan names (padded repeats included)
    taken_of_yield = rank.positions.tolist()
    most = 0
    yielded = 0
    pulled_max = -1
    for k, r in enumerate(rank.rounds):
        pulled = max(r.start - ahead, 0)  # the consumer is at most `ahead` behind the producer
        while yielded < len(taken_of_yield) and max(pulled_max, taken_of_yield[yielded]) < pulled:
            pulled_max = max(pulled_max, taken_of_yield[yielded])
            yielded += 1
        live = {round_of[s] for s in taken_of_yield[yielded:] if s in round_of and round_of[s] <= k + 1}
        most = max(most, len(live))
    return most


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=2, max_size=20), world=st.integers(2, 5),
       fraction=st.sampled_from([0.1, 0.3, 0.7, 1.0]), round_size=st.integers(4, 64),
       buffer=st.integers(0, 80), ahead=st.integers(0, 100), seed=st.integers(0, 1000))
def test_buffers_held_bound_the_slowest_consumer(sizes: list[int], world: int, fraction: float,
                                                  round_size: int, buffer: int, ahead: int, seed: int) -> None:
    options = PlanOptions(shuffle="partial", exchange_fraction=fraction, round_size=round_size, buffer_size=buffer)
    plan = plan_epoch(manifest_of(sizes), world, seed, 0, options)
    for rank in plan.ranks:
        life = receipt_lifetimes(rank.positions, rank.rounds, ahead, copy_beyond=2 * buffer)
        assert len(life.copy_out) == len(rank.rounds)
        assert life.rounds_held >= buffers_held_by_slowest_consumer(rank, ahead, life.copy_out)
        assert life.rounds_held <= len(rank.rounds)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(5, 40), min_size=4, max_size=20), buffer=st.integers(1, 60),
       seed=st.integers(0, 1000))
def test_only_samples_held_long_are_copied_out(sizes: list[int], buffer: int, seed: int) -> None:
    options = PlanOptions(shuffle="partial", exchange_fraction=0.5, round_size=16, buffer_size=buffer)
    plan = plan_epoch(manifest_of(sizes), 3, seed, 0, options)
    for rank in plan.ranks:
        if len(set(rank.order.tolist())) != len(rank.order):
            continue  # padded: a repeated sample's arrival is ambiguous
        yielded_at = {g: p for p, g in enumerate(rank.order.tolist())}
        life = receipt_lifetimes(rank.positions, rank.rounds, 0, copy_beyond=2 * buffer)
        for r, copied in zip(rank.rounds, life.copy_out, strict=True):
            arrived = range(r.stop - len(r.received), r.stop)
            for s, g, copy in zip(arrived, r.received.tolist(), copied.tolist(), strict=True):
                assert copy == (yielded_at[g] - s > 2 * buffer)


def test_without_a_shuffle_buffer_nothing_is_copied_and_rounds_go_in_turn() -> None:
    options = PlanOptions(shuffle="partial", exchange_fraction=0.3, round_size=32, buffer_size=0)
    plan = plan_epoch(manifest_of([50] * 8), 2, 0, 0, options)
    for rank in plan.ranks:
        life = receipt_lifetimes(rank.positions, rank.rounds, 0, copy_beyond=0)
        assert not any(c.any() for c in life.copy_out)
        assert life.rounds_held == 2  # the round being used and the next one's buffer, taken early
