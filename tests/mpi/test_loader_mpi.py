"""Invariants 1-4 of DESIGN.md with real ranks, for every shuffle mode and every format.

One launch per world size runs all modes and formats (a launch costs seconds on two cores) and
saves mid-epoch states; a second launch at another world size resumes from them.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

from ..conftest import mpiexec
from ..helpers import make_dataset
from .ranks import TINY_DALI, indexed_samples, ranks_report

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("loader_worker.py")
SIZES = [13, 7, 20, 1, 16, 9, 11]  # 77 samples in uneven shards


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("loader-data")
    for fmt in ("wds", "hdf5", "lmdb"):
        make_dataset(root / fmt, fmt, SIZES)
    return root


def run(data: Path, ranks: int, phase: str, tmp: Path) -> dict[str, Any]:
    out = tmp / f"report-{phase}-{ranks}.json"
    proc = mpiexec(ranks, WORKER, data, out, phase, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def flat(per_rank: list[list[list[str]]]) -> list[str]:
    return [k for batches in per_rank for b in batches for k in b]


def check_epoch(name: str, ranks: list[dict[str, Any]], field: str, world: int) -> None:
    drop_last = name.endswith("-1")
    per_rank = [r[field] for r in ranks]
    # invariant 2: the same number of batches, and of samples, on every rank
    assert len({len(b) for b in per_rank}) == 1, name
    assert len({sum(map(len, b)) for b in per_rank}) == 1, name
    counts = collections.Counter(flat(per_rank))
    total = sum(SIZES)
    # invariant 1: every sample once; padding adds copies only to even out the ranks
    if drop_last:
        assert max(counts.values()) == 1 and total - len(counts) < world * 5 + world, name
    else:
        assert len(counts) == total, name
        assert sum(counts.values()) == world * -(-total // world), name


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_invariants_with_real_ranks(data: Path, tmp_path: Path, world: int) -> None:
    report = run(data, world, "run", tmp_path)
    assert report["world"] == world
    for name, ranks in report.items():
        if name == "world":
            continue
        assert len(ranks) == world
        check_epoch(name, ranks, "first", world)
        check_epoch(name, ranks, "other", world)
        # every sample carries its own bytes, however it reached the rank
        assert all(r["wrong_bytes"] == [] for r in ranks), name
        # invariant 3: the same stream for the same seed and epoch; another for another epoch
        assert all(r["first"] == r["again"] for r in ranks), name
        if "-none-" not in name:
            assert any(r["first"] != r["other"] for r in ranks), name
        # invariant 4: a fresh loader continues with exactly the samples not yet yielded
        before = flat([r["part"] for r in ranks])
        after = flat([r["rest"] for r in ranks])
        assert not set(before) & set(after), name
        epoch = set(flat([r["first"] for r in ranks]))
        if name.endswith("-0"):
            assert set(before) | set(after) == epoch, name
        else:
            assert len(epoch - set(before) - set(after)) < world * 5 + world, name


@pytest.mark.parametrize(("first", "second"), [(3, 2), (2, 4)])
def test_resume_into_a_different_world_size(data: Path, tmp_path: Path, first: int, second: int) -> None:
    a = run(data, first, "run", tmp_path)
    b = run(data, second, "resume", tmp_path)
    for name, ranks in b.items():
        if name == "world":
            continue
        assert len(ranks) == second
        before = flat([r["part"] for r in a[name]])
        after = flat([r["rest"] for r in ranks])
        epoch = set(flat([r["first"] for r in a[name]]))
        assert not set(before) & set(after), name  # nothing twice
        assert len({len(r["rest"]) for r in ranks}) == 1, name  # equal batches on the new ranks
        if name.endswith("-0"):
            assert set(before) | set(after) == epoch, name  # nothing lost
        else:  # drop_last may drop a few of the rest to give the new ranks whole, equal batches
            assert len(epoch - set(before) - set(after)) < second * 5 + second, name


@pytest.mark.parametrize("world", [2, 3])
def test_breaking_mid_epoch_never_hangs(tmp_path: Path, world: int) -> None:
    """Regression: a rank that stopped iterating also stopped reading, while its exchange round
    still needed samples; the other ranks then waited in that round forever."""
    data = make_dataset(tmp_path / "wds", "wds", [23, 19, 31], payload=4096)
    proc = mpiexec(world, Path(__file__).with_name("break_worker.py"), data, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all trials ok" in proc.stdout


TWO_LOOPS = """
import json, sys
import ddpipe
from ddpipe.comm import init_comm
from ddpipe.errors import DdpipeError
comm = init_comm(timeout=60)  # a deadlock aborts the job, failing the test
stream = ddpipe.EncodedStream(sys.argv[1], 4, shuffle="partial", exchange_fraction=1.0, round_size=4, prefetch=1,
                              comm=comm)
whole = [b.indices.tolist() for b in stream]
first = iter(stream)
next(first)
second = iter(stream)
again = [next(second).indices.tolist()]
try:
    next(first)  # taking turns, as zip(stream, stream) would
    said = None
except DdpipeError as e:
    said = str(e)
again += [b.indices.tolist() for b in second]
report = comm.allgather({"whole": whole, "again": again, "said": said})
if comm.world.rank == 0:
    open(sys.argv[2], "w").write(json.dumps(report))
"""


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_later_loop_over_a_stream_ends_the_one_before_on_every_rank(tmp_path: Path, ranks: int) -> None:
    """Two loops over one stream at once ran two producers, whose exchange rounds took turns on one
    communicator: each rank unpacked the other loop's samples ('rank 1 sent samples the plan does not
    expect', msgpack's ExtraData) and the job ended. Now the later loop ends the earlier, whose next
    ``next()`` says so, and gives the epoch whole on every rank."""
    data = make_dataset(tmp_path / "wds", "wds", [23, 19, 31], payload=1024)
    report = ranks_report(ranks, TWO_LOOPS, data, tmp_path / "out.json")
    for rank in report:
        assert rank["again"] == rank["whole"]
        assert rank["said"].startswith("this loop over the stream was ended by a later iter() of it")


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("damage", ["images", "shard"])
def test_skipped_images_leave_batches_of_constant_size_on_every_rank(tmp_path: Path, ranks: int, damage: str) -> None:
    """Two truncated JPEGs, or a shard whose bytes fail its checksum (samples 8-11)."""
    import ddpipe

    samples = indexed_samples(20)
    bad = {5, 13} if damage == "images" else {8, 9, 10, 11}
    if damage == "images":
        for i in bad:
            samples[i]["jpg"] = samples[i]["jpg"][: len(samples[i]["jpg"]) // 2]
    data = tmp_path / "bad"
    ddpipe.write_dataset(data, iter(samples), samples_per_shard=4)
    if damage == "shard":
        from ..helpers import flip_middle_keeping_time, shard_file

        flip_middle_keeping_time(shard_file(data, 2))
    out = tmp_path / "out.json"
    code = ("import json, sys, ddpipe; from ddpipe.comm import init_comm; c = init_comm(timeout=60); "
            f"ld = ddpipe.Loader(sys.argv[1], 3, {TINY_DALI}, shuffle='partial', "
            "exchange_fraction=0.5, round_size=4, on_error='skip', comm=c); "
            "b = [y.tolist() for _, y in ld]; p = ld.plan(); "
            "s = [len(p.batch(c.world.rank, i)) for i in range(p.num_batches)]; "
            "r = c.allgather({'batches': b, 'sizes': s, 'repeated': ld.stats.decode.repeated}); "
            "c.world.rank == 0 and open(sys.argv[2], 'w').write(json.dumps(r))")
    report = ranks_report(ranks, code, data, out)
    assert len({len(r["batches"]) for r in report}) == 1  # every rank yields the same number of batches
    for r in report:  # every batch has the size the plan gave it: none short by a skipped image
        assert [len(b) for b in r["batches"]] == r["sizes"]
    labels = [y for r in report for b in r["batches"] for y in b]
    assert set(labels) == set(range(20)) - bad  # every decodable sample, none that does not decode
    planned_copies = sum(sum(r["sizes"]) for r in report) - 20  # the plan's own padding (pad, not drop)
    repeats = sum(r["repeated"] for r in report)
    assert len(labels) - (20 - len(bad)) <= planned_copies + repeats  # beyond each once: padding, counted repeats


@pytest.mark.parametrize(("ranks", "shuffle", "read_in", "bad"),
                         [(3, "none", "thread", set()), (4, "partial", "process", set()), (3, "local", "thread", {7})])
def test_without_padding_every_sample_is_decoded_once_across_ranks_of_unequal_shares(
        tmp_path: Path, ranks: int, shuffle: str, read_in: str, bad: set[int]) -> None:
    """pad=False (evaluation): 22 samples over 3 or 4 ranks, which cannot each have as many; each
    sample comes out decoded exactly once across the job, every rank yields as many batches, and a
    skipped image is left out, not made up for with a repeat."""
    import ddpipe

    samples = indexed_samples(22)
    for i in bad:
        samples[i]["jpg"] = samples[i]["jpg"][: len(samples[i]["jpg"]) // 2]
    data = tmp_path / "ds"
    ddpipe.write_dataset(data, iter(samples), samples_per_shard=4)
    out = tmp_path / "out.json"
    code = ("import json, sys, ddpipe; from ddpipe.comm import init_comm; c = init_comm(timeout=60); "
            f"ld = ddpipe.Loader(sys.argv[1], 3, {TINY_DALI}, shuffle={shuffle!r}, exchange_fraction=0.5, "
            f"round_size=4, pad=False, read_in={read_in!r}, on_error='skip', comm=c); "
            "b = [[y.tolist() for _, y in ld] for e in range(2) if ld.set_epoch(e) or True]; "
            "r = c.allgather({'batches': b, 'repeated': ld.stats.decode.repeated}); ld.close(); "
            "c.world.rank == 0 and open(sys.argv[2], 'w').write(json.dumps(r))")
    report = ranks_report(ranks, code, data, out)
    for epoch in range(2):
        per_rank = [r["batches"][epoch] for r in report]
        assert len({len(batches) for batches in per_rank}) == 1  # as many batches on every rank
        labels = [y for batches in per_rank for b in batches for y in b]
        assert sorted(labels) == sorted(set(range(22)) - bad)  # each decodable sample once, no copy
    assert all(r["repeated"] == 0 for r in report)


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_corrupt_shard_met_while_reading_ahead_ends_the_job_naming_it(tmp_path: Path, ranks: int) -> None:
    """With ``on_error="fail"``, a shard that fails its checksum is reported by the rank that reads it,
    wherever it met it (a rank reads the next round's samples while it waits for a round), and the
    job ends at once rather than at the watchdog's timeout."""
    from ..helpers import flip_middle_keeping_time, shard_file

    data = make_dataset(tmp_path / "wds", "wds", [12] * 8, payload=2048)
    bad = shard_file(data, 5)
    flip_middle_keeping_time(bad)
    code = ("import sys, ddpipe, ddpipe.distributed; "
            "job = ddpipe.distributed.init('cpu', timeout=100, process_group=False); "
            "ld = ddpipe.EncodedStream(sys.argv[1], 2, shuffle='partial', exchange_fraction=0.5, "
            "round_size=4, comm=job.comm); [None for _ in ld]")
    proc = mpiexec(ranks, "-c", code, data, timeout=90)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert f"{bad.name}: checksum mismatch" in output and "ending the job" in output, output
    assert "did not complete within" not in output, output


def test_decoded_images_are_the_samples_exchanged_over_two_epochs(tmp_path: Path) -> None:
    """DALI reads the encoded bytes in place (the shard's mapping, the exchange's landing zone or
    receive buffer), so those must outlive its batches in flight: on 2 ranks with half of every
    rank's samples exchanged in small rounds, each decoded image is still its own label's colour,
    over two epochs of one pipeline."""
    import numpy as np

    import ddpipe

    from ..decode.images import COLORS, labelled_samples

    data = tmp_path / "colours"
    ddpipe.write_dataset(data, iter(labelled_samples(96, np.random.default_rng(4))), samples_per_shard=8,
                         classes=[str(c) for c in range(len(COLORS))])
    out = tmp_path / "out.json"
    code = ("import json, sys, torch, ddpipe; from ddpipe.comm import init_comm; c = init_comm(timeout=60); "
            f"ld = ddpipe.Loader(sys.argv[1], 8, {TINY_DALI}, shuffle='partial', exchange_fraction=0.5, round_size=8, "
            "comm=c); "
            "colours = torch.tensor(" + repr(COLORS) + ", dtype=torch.float32); seen = []\n"
            "for epoch in range(2):\n"
            "    ld.set_epoch(epoch)\n"
            "    for x, y in ld:\n"
            "        nearest = torch.cdist(x.float().mean(dim=(2, 3)), colours).argmin(dim=1)\n"
            "        seen.append([nearest.tolist(), y.tolist()])\n"
            "r = c.allgather({'seen': seen, 'sent': ld.stats.read.exchange.samples_sent})\n"
            "c.world.rank == 0 and open(sys.argv[2], 'w').write(json.dumps(r))")
    report = ranks_report(2, code, data, out)
    assert all(r["sent"] > 0 for r in report)  # samples did cross between the ranks
    pairs = [(a, b) for r in report for colours, labels in r["seen"] for a, b in zip(colours, labels, strict=True)]
    assert len(pairs) == 2 * 96 and all(a == b for a, b in pairs)
