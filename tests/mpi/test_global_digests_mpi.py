"""A global shuffle's ranks on several nodes each read a share of every shard, and check the samples
they read against their digests; the ranks of one node want all of each shard together, and hash
each whole, once read into the page cache they share (``reading._random_digests``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import mpiexec
from ..helpers import flip_inside_sample, make_dataset, shard_file, tiny_samples

pytestmark = pytest.mark.mpi

READ = ("import json, sys, ddpipe; from ddpipe.comm import init_comm; c = init_comm(timeout=60)\n"
        "s = ddpipe.EncodedStream(sys.argv[1], 4, shuffle='global', on_error='skip', comm=c)\n"
        "got = [x['__key__'] for b in s for x in b]\n"
        "r = c.allgather({'got': got, 'skipped': s.stats.skipped})\n"
        "c.world.rank == 0 and open(sys.argv[2], 'w').write(json.dumps(r))")


@pytest.mark.parametrize("nodes", [1, 4])
def test_under_skip_ranks_on_many_nodes_drop_the_changed_sample_alone_and_on_one_node_its_shard(
        nodes: int, tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "ds", "wds", [48, 48], payload=400)
    samples = {s["__key__"]: bytes(s["bin"]) for s in tiny_samples(96, 4, 400)}
    flip_inside_sample(shard_file(root, 1), samples["s/000060"])  # shard 1's sample 12
    out = tmp_path / "out.json"
    proc = mpiexec(4, "-c", READ, root, out, timeout=200, nodes=nodes)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    got = sorted(key for r in report for key in r["got"])
    dropped = {"s/000060"} if nodes == 4 else {f"s/{i:06d}" for i in range(48, 96)}
    assert got == sorted(set(samples) - dropped)
    assert sum(r["skipped"] for r in report) == len(dropped)
