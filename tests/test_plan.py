"""Properties of plan_epoch: the invariants of DESIGN.md, checked without MPI or files."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpipe.manifest import Manifest, ShardInfo
from ddpipe.plan import EpochPlan, PlanOptions, plan_epoch


def manifest_of(sizes: list[int]) -> Manifest:
    shards = tuple(ShardInfo(f"shard-{i:06d}.tar", n, n * 100, "xxh3_64:0") for i, n in enumerate(sizes))
    return Manifest(format="wds", fields=("cls", "jpg"), classes=("a",), shards=shards)


shard_sizes = st.lists(st.integers(0, 40), min_size=1, max_size=12)
options = st.builds(
    PlanOptions,
    shuffle=st.sampled_from(["none", "local", "partial", "global"]),
    exchange_fraction=st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]),
    shard_assignment=st.sampled_from(["sticky", "rotate"]),
    drop_last=st.booleans(),
    pad=st.booleans(),
    batch_size=st.integers(1, 7),
    buffer_size=st.sampled_from([0, 1, 5, 64]),
    round_size=st.integers(1, 30),
)


def reads_of(plan: EpochPlan, g: int) -> set[int]:
    """The ranks that read sample ``g``."""
    return {r.rank for r in plan.ranks if g in set(r.reads.tolist())}


@settings(max_examples=300, deadline=None)
@given(sizes=shard_sizes, world=st.integers(1, 6), seed=st.integers(0, 2**32), epoch=st.integers(0, 5), opt=options)
def test_invariants(sizes: list[int], world: int, seed: int, epoch: int, opt: PlanOptions) -> None:
    m = manifest_of(sizes)
    n = m.num_samples
    plan = plan_epoch(m, world, seed, epoch, opt)
    orders = [r.order for r in plan.ranks]
    # 2. equal work: the same number of samples, so the same number of batches, on every rank
    assert all(len(o) == plan.samples_per_rank for o in orders)
    if opt.drop_last:
        assert plan.samples_per_rank % opt.batch_size == 0
    yielded = collections.Counter(np.concatenate(orders).tolist())
    # 1. exactly once: drop_last yields every kept sample once; pad yields every sample, plus documented copies
    if opt.drop_last:
        assert max(yielded.values(), default=1) == 1
        assert sorted(yielded) == sorted(set(range(n)) - set(plan.dropped.tolist()))
        assert len(plan.dropped) < world * opt.batch_size + world
    else:
        assert set(yielded) == set(range(n))
        if n >= world:  # padding: each rank short of one sample repeats one of its own share
            for r in plan.ranks:
                own = collections.Counter(r.reads.tolist())
                assert sum(c - 1 for c in own.values()) <= 1
                for g, c in own.items():
                    assert c == 1 or reads_of(plan, g) == {r.rank}  # every copy on the rank it belongs to
    # the exchange moves samples between ranks but neither creates nor loses any
    reads = collections.Counter(np.concatenate([r.reads for r in plan.ranks]).tolist())
    assert reads == yielded
    # 3. determinism
    again = plan_epoch(m, world, seed, epoch, opt)
    assert all(np.array_equal(a.order, b.order) for a, b in zip(plan.ranks, again.ranks, strict=True))


@settings(max_examples=300, deadline=None)
@given(sizes=shard_sizes, world=st.integers(1, 9), seed=st.integers(0, 2**32), opt=options)
def test_without_padding_each_sample_is_yielded_once_in_as_many_batches(sizes: list[int], world: int, seed: int,
                                                                         opt: PlanOptions) -> None:
    m = manifest_of(sizes)
    padded = plan_epoch(m, world, seed, 1, dataclasses.replace(opt, pad=True, drop_last=False))
    exact = plan_epoch(m, world, seed, 1, dataclasses.replace(opt, pad=False, drop_last=False))
    batches = [[exact.batch(r, b) for b in range(exact.num_batches)] for r in range(world)]
    yielded = collections.Counter(np.concatenate([b for rank in batches for b in rank] + [np.zeros(0, int)]).tolist())
    assert yielded == collections.Counter(range(m.num_samples))  # each sample once, none left out
    assert exact.num_batches == padded.num_batches  # 2. every rank as many batches, as with padding
    for r, rank in enumerate(batches):
        # the same plan read, exchanged and batched; each batch the padded one less what it repeats
        assert np.array_equal(exact.ranks[r].reads, padded.ranks[r].reads)
        assert np.array_equal(exact.ranks[r].order, padded.ranks[r].order)
        for b, batch in enumerate(rank):
            full = collections.Counter(padded.batch(r, b).tolist())
            assert not collections.Counter(batch.tolist()) - full
    # what is left out is exactly what padding added
    copies = sum(int(r.copies.sum()) for r in exact.ranks if r.copies is not None)
    assert copies == world * padded.samples_per_rank - m.num_samples


@settings(max_examples=100, deadline=None)
@given(sizes=shard_sizes, world=st.integers(2, 6), q=st.sampled_from([0.1, 0.3, 0.5, 1.0]),
       round_size=st.integers(1, 30))
def test_exchange_sends_fraction_q_to_other_ranks(sizes: list[int], world: int, q: float, round_size: int) -> None:
    plan = plan_epoch(manifest_of(sizes), world, 1, 0, PlanOptions(exchange_fraction=q, round_size=round_size))
    for rank in plan.ranks:
        sent = sum(len(s) for rd in rank.rounds for s in rd.send)
        received = sum(len(x) for rd in rank.rounds for x in rd.recv)
        assert sent == received  # counts stay equal
        assert sent == sum(int(q * (rd.stop - rd.start) + 0.5) for rd in rank.rounds)
        assert all(d != rank.rank for rd in rank.rounds for d in rd.dests)
        for rd in rank.rounds:  # what r receives through slot t is what the source sends through slot t
            for t, src in enumerate(rd.sources):
                peer = plan.ranks[src].rounds[rank.rounds.index(rd)]
                assert peer.dests[t] == rank.rank
                assert np.array_equal(plan.ranks[src].reads[peer.send[t]], rd.recv[t])


def test_seed_and_epoch_change_the_stream() -> None:
    m = manifest_of([50] * 8)
    for mode in ("local", "partial", "global"):
        a = plan_epoch(m, 4, 1, 0, PlanOptions(shuffle=mode)).ranks[0].order
        assert not np.array_equal(a, plan_epoch(m, 4, 1, 1, PlanOptions(shuffle=mode)).ranks[0].order)
        assert not np.array_equal(a, plan_epoch(m, 4, 2, 0, PlanOptions(shuffle=mode)).ranks[0].order)
    none = plan_epoch(m, 4, 1, 0, PlanOptions(shuffle="none"))
    assert np.array_equal(none.ranks[1].order, np.arange(100, 200))


def shards_read(plan_: EpochPlan, rank: int, sizes: list[int]) -> set[int]:
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return set((np.searchsorted(starts, plan_.ranks[rank].reads, side="right") - 1).tolist())


def test_sticky_reads_the_same_shards_every_epoch_rotate_does_not() -> None:
    sizes = [25] * 16
    m = manifest_of(sizes)
    for mode in ("local", "partial"):
        sticky = [shards_read(plan_epoch(m, 4, 3, e, PlanOptions(shuffle=mode)), 2, sizes) for e in range(4)]
        assert all(s == sticky[0] for s in sticky) and len(sticky[0]) == 4
        rotate = [shards_read(plan_epoch(m, 4, 3, e, PlanOptions(shuffle=mode, shard_assignment="rotate")), 2, sizes)
                  for e in range(4)]
        assert any(s != rotate[0] for s in rotate)


def test_ranks_read_whole_shards_sequentially() -> None:
    m = manifest_of([100] * 8)
    plan = plan_epoch(m, 4, 0, 0, PlanOptions(shuffle="local"))
    reads = plan.ranks[0].reads
    assert len(reads) == 200 and np.all(np.diff(reads)[np.diff(reads) != 1] != 0)
    runs = np.flatnonzero(np.diff(reads) != 1)
    assert len(runs) == 1  # two whole shards, each read front to back


@settings(max_examples=150, deadline=None)
@given(sizes=shard_sizes, world=st.integers(1, 5), new_world=st.integers(1, 5), opt=options,
       frac=st.floats(0, 1))
def test_resume_plans_exactly_the_rest(sizes: list[int], world: int, new_world: int, opt: PlanOptions,
                                       frac: float) -> None:
    m = manifest_of(sizes)
    plan = plan_epoch(m, world, 9, 2, opt)
    done = int(plan.num_batches * frac)
    yielded = plan.yielded(done)
    # what the state says was yielded is what the ranks' batches held (without padding: no copy)
    batches = [plan.batch(r, b) for r in range(world) for b in range(done)]
    assert sorted(yielded.tolist()) == sorted(np.concatenate([np.zeros(0, int), *batches]).tolist())
    epoch_set = set(np.concatenate([r.order for r in plan.ranks]).tolist())
    pending = np.zeros(m.num_samples, dtype=bool)
    pending[sorted(epoch_set - set(yielded.tolist()))] = True
    rest = plan_epoch(m, new_world, 9, 2, opt, pending=pending)
    after = set(np.concatenate([r.order for r in rest.ranks]).tolist())
    assert not after & set(yielded.tolist())  # nothing yielded twice across the interruption
    if opt.drop_last:
        assert after | set(rest.dropped.tolist()) == set(np.flatnonzero(pending).tolist())
        # what the README promises: a resumed epoch drops less than one batch per rank of what was left
        assert len(rest.dropped) < new_world * opt.batch_size
    else:
        assert after == set(np.flatnonzero(pending).tolist())  # and nothing lost


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="exchange_fraction"):
        PlanOptions(exchange_fraction=1.5)
    with pytest.raises(ValueError, match="shuffle"):
        PlanOptions(shuffle="random")


@pytest.mark.parametrize(("args", "says"), [
    ((1.5, 0, 0), "world_size must be a whole number of at least 1, not 1.5"),  # was range()'s TypeError
    ((True, 0, 0), "world_size must be a whole number of at least 1, not True"),  # planned for one rank
    ((0, 0, 0), "world_size must be a whole number of at least 1, not 0"),
    ((2, None, 0), "seed must be a whole number, not None"),  # was the seeding's "unsupported operand"
    ((2, "7", 0), "seed must be a whole number, not '7'"),
    ((2, 0, -1), "epoch must be a whole number of at least 0, not -1"),  # was numpy's "expected non-negative"
    ((2, 0, 1.5), "epoch must be a whole number of at least 0, not 1.5"),  # was "seed must be integer"
    ((2, 0, 0, "partial"), "options must be a PlanOptions, not str"),  # was "'str' object has no attribute"
])
def test_a_plan_of_arguments_of_the_wrong_kind_is_refused_naming_the_argument(args: tuple[object, ...],
                                                                              says: str) -> None:
    from ddpipe.errors import OptionError

    with pytest.raises(OptionError) as refused:
        plan_epoch(manifest_of([4, 4]), *args)  # type: ignore[arg-type]
    assert str(refused.value) == says


@settings(max_examples=50, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1))
def test_two_seeds_of_the_range_give_two_orders(a: int, b: int) -> None:
    """A seed was masked to 63 bits: -1 drew 2**63 - 1's order, -2**63 seed 0's. Over 300 samples
    two orders agree by chance with odds of 1 in 300!, never here."""
    def order(seed: int) -> list[int]:
        plan = plan_epoch(manifest_of([30] * 10), 1, seed, 0, PlanOptions(shuffle="global", batch_size=1))
        return [int(i) for i in plan.ranks[0].reads]

    for x, y in ((a, b), (-1, 2**63 - 1), (-(2**63), 0), (a, a & (2**63 - 1))):
        assert (order(x) == order(y)) == (x == y), (x, y)


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**64])
def test_a_seed_past_int64_is_refused_where_it_would_fold_onto_another(seed: int) -> None:
    import ddpipe

    said = f"seed must be a whole number from -2\\*\\*63 to 2\\*\\*63 - 1, not {seed}"
    with pytest.raises(ddpipe.OptionError, match=said):
        plan_epoch(manifest_of([4, 4]), 2, seed, 0)
    with pytest.raises(ddpipe.OptionError, match=said):
        ddpipe.ConvertOptions(seed=seed)

