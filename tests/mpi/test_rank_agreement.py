"""Every rank plans the whole job's epoch for itself, so ranks given different datasets, plan options or
seeds are refused before the first epoch, on every rank, in one line each (a node-local copy that is
stale or partial on one node had ranks plan apart: samples read twice or never, silently)."""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ddpipe
from ddpipe.plan import PlanOptions
from ddpipe.rank_agreement import RankView, disagreement

from ..conftest import mpiexec
from ..decode.images import labelled_samples
from ..helpers import make_dataset

ON_HOSTS = Path(__file__).parents[1] / "hosts" / "on_hosts.py"
HOST_LOCAL = Path("/dev/shm/ddpipe-test-data")
TRAIN = ["--model", "smallcnn", "--batch-size", "4", "--image-size", "32", "--decode", "dali-cpu", "--dtype", "uint8",
         "--shuffle", "local"]


def train_on_node_local_copies(first: Path, second: Path) -> tuple[int, str, str]:
    """``ddpipe train`` on two real hosts (tests/hosts/ssh-ns), each with its own copy of a dataset at
    the same node-local path: mnode1's from ``first``, mnode2's from ``second``."""
    setup = {"mnode1": [["copy", str(first), str(HOST_LOCAL)]], "mnode2": [["copy", str(second), str(HOST_LOCAL)]]}
    proc = mpiexec(4, ON_HOSTS, json.dumps(setup), "train", HOST_LOCAL, *TRAIN, timeout=240, hosts=2)
    return proc.returncode, proc.stdout, proc.stderr


def images(root: Path, n: int, seed: int) -> Path:
    samples = labelled_samples(n, np.random.default_rng(seed))
    ddpipe.write_dataset(root, iter(samples), samples_per_shard=8, classes=[str(c) for c in range(6)])
    return root


def said_once(stderr: str) -> str:
    """The one line of a refusal every rank reached alike: rank 0 says it for the job (each rank did)."""
    lines = [line for line in stderr.splitlines() if line]
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    return lines[0]


@pytest.mark.mpi
def test_ranks_reading_different_node_local_copies_are_refused_naming_both(tmp_path: Path) -> None:
    whole = images(tmp_path / "whole", 24, seed=1)
    partial = images(tmp_path / "partial", 16, seed=1)
    code, _, err = train_on_node_local_copies(whole, partial)
    line = said_once(err)
    assert code == 1 and line.startswith(f"ddpipe: error: {HOST_LOCAL}: the ranks read different datasets: rank 0 on "
                                         "mnode1 has 24 samples in 3 shards, rank 2 on mnode2 has 16 in 2;"), line
    # the same counts, other bytes (a stale copy): told apart by the shards' checksums
    stale = images(tmp_path / "stale", 24, seed=2)
    code, _, err = train_on_node_local_copies(whole, stale)
    assert code == 1 and "rank 2 on mnode2 has 24 in 3 (other contents);" in said_once(err)
    # the same dataset copied to each node is one dataset
    code, out, err = train_on_node_local_copies(whole, whole)
    assert code == 0 and "epoch 0:" in out, out + err


@pytest.mark.mpi
def test_ranks_given_different_seeds_are_refused_naming_the_seed(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "wds", "wds", [8] * 4, payload=500)
    code = ("import sys, ddpipe; from ddpipe.comm import init_comm; c = init_comm(timeout=300); "
            "ddpipe.EncodedStream(sys.argv[1], 4, seed=c.world.rank, comm=c)")
    proc = mpiexec(2, "-c", code, data, timeout=200)
    assert proc.returncode != 0
    # in a script, the first rank to reach the uncaught error ends the job (MPI_Abort), and the other
    # may be ended before it prints the same error; the error's name and its message are written apart,
    # so the two ranks' lines can interleave between them: the message is looked for on its own
    said = (f"{data}: the ranks were given different options: seed 0 on rank 0 on "
            f"{socket.gethostname()}, 1 on rank 1 on {socket.gethostname()}; give every rank the same")
    assert said in proc.stderr and "ddpipe.errors.DdpipeError" in proc.stderr, proc.stderr


def view(node: int = 0, **changes: object) -> RankView:
    base = RankView(node=node, host=f"host{node}", dataset="d" * 32, samples=32, shards=4, plan=PlanOptions(),
                    seed=0, stage_dir=None)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


CHANGES = {"dataset": {"dataset": "e" * 32}, "samples": {"dataset": "e" * 32, "samples": 31},
           "seed": {"seed": 7}, "batch_size": {"plan": PlanOptions(batch_size=8)},
           "shuffle": {"plan": PlanOptions(shuffle="global")},
           "exchange_fraction": {"plan": PlanOptions(exchange_fraction=0.5)}}


@given(ranks=st.integers(2, 9), odd=st.data(), change=st.sampled_from(sorted(CHANGES)))
def test_the_first_rank_given_something_else_is_named(ranks: int, odd: st.DataObject, change: str) -> None:
    views = [view(node=r % 2) for r in range(ranks)]
    assert disagreement(views) == ""
    k = odd.draw(st.integers(1, ranks - 1))
    views[k] = dataclasses.replace(views[k], **CHANGES[change])  # type: ignore[arg-type]
    why = disagreement(views)
    assert f"rank {k} on host{k % 2}" in why and "rank 0 on host0" in why, why
    if change in ("dataset", "samples"):
        assert why.startswith("the ranks read different datasets")
    else:
        assert why.startswith(f"the ranks were given different options: {'seed' if change == 'seed' else change} ")


@given(ranks=st.integers(2, 9), odd=st.data())
def test_ranks_of_a_node_with_two_staging_directories_are_refused_and_of_two_nodes_are_not(
        ranks: int, odd: st.DataObject) -> None:
    views = [view(node=r % 2, stage_dir=f"/local/node{r % 2}") for r in range(ranks)]
    assert disagreement(views) == ""  # each node its own directory
    k = odd.draw(st.integers(0, ranks - 1))
    views[k] = dataclasses.replace(views[k], stage_dir="/elsewhere")
    same_node = [v for r, v in enumerate(views) if r % 2 == k % 2]
    why = disagreement(views)
    assert (why == "") == (len(same_node) == 1), why
    if why:
        assert why.startswith(f"ranks of node {k % 2} were given different staging directories: /elsewhere and "), why
