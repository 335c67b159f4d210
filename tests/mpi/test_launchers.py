"""ddpipe starts under each launcher: none (a world of one), mpiexec, torchrun; and reads srun's PMI."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from ddpipe.comm import Comm, init_comm, launched_by_mpi, launched_by_torchrun

from ..conftest import mpiexec, torchrun
from ..helpers import make_dataset

WORKER = Path(__file__).with_name("torchrun_worker.py")


def test_no_launcher_is_a_world_of_one() -> None:
    comm = init_comm()
    assert type(comm) is Comm and comm.world.size == 1 and comm.allgather("x") == ["x"]


def test_launcher_detection() -> None:
    assert launched_by_mpi({"PMI_RANK": "0", "PMI_SIZE": "2"})  # mpiexec (Hydra) and srun --mpi=pmi2
    assert launched_by_mpi({"PMIX_RANK": "3"})  # srun --mpi=pmix
    assert launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "4"})  # Open MPI's mpirun
    assert not launched_by_mpi({"SLURM_PROCID": "0"})  # srun without PMI starts no MPI world
    assert launched_by_torchrun({"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2"})
    assert not launched_by_torchrun({"RANK": "1"})


def test_the_rank_a_launcher_named_is_read_where_init_comm_reads_its_world() -> None:
    """The CLI leaves a refusal every rank reached to rank 0 before (or without) MPI's start: a rank
    it cannot read is None (the line is said), never 0 for a rank that is not."""
    from ddpipe.comm.world import launched_rank

    assert launched_rank({"PMI_RANK": "3", "PMI_SIZE": "4"}) == 3
    assert launched_rank({"PMIX_RANK": "5"}) == 5
    assert launched_rank({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2"}) == 2
    assert launched_rank({"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2"}) == 1
    assert launched_rank({"RANK": "1"}) is None  # no launcher init_comm follows: a world of one
    assert launched_rank({"SLURM_PROCID": "2"}) is None  # srun without PMI starts no MPI world
    assert launched_rank({"MPI_LOCALNRANKS": "2"}) is None  # under MPI, but no rank read here
    assert launched_rank({}) is None


@pytest.mark.mpi
def test_mpiexec_world_and_node() -> None:
    code = ("from ddpipe.comm import init_comm; c = init_comm(); w = c.world; "
            "rows = c.allgather((w.rank, w.size, w.local_rank, w.local_size, w.node, w.num_nodes)); "
            "w.rank == 0 and print(rows)")  # one print: lines from several ranks would interleave
    proc = mpiexec(3, "-c", code)
    assert proc.returncode == 0, proc.stderr
    rows = sorted(ast.literal_eval(proc.stdout))
    assert rows == [(r, 3, r, 3, 0, 1) for r in range(3)]


@pytest.mark.mpi
def test_torchrun_runs_the_exchange(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "wds", "wds", [10, 11, 12])
    proc = torchrun(2, WORKER, data, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in ranks] == [[0, 2, 0], [1, 2, 1]]
    assert len(ranks[0]["keys"]) == len(ranks[1]["keys"]) == 17
    assert set(ranks[0]["keys"]) | set(ranks[1]["keys"]) == {f"s/{i:06d}" for i in range(33)}
    assert ranks[0]["sent"] > 0


@pytest.mark.mpi
def test_a_loader_only_script_under_torchrun_ends_cleanly(tmp_path: Path) -> None:
    # its ranks leave ddpipe's gloo group together at exit: one leaving while gloo still talked to it
    # was killed with SIGABRT ("terminate called without an active exception") in 3 of 8 runs of 4 ranks
    data = make_dataset(tmp_path / "wds", "wds", [10, 11, 12])
    for run in range(3):
        out = tmp_path / f"run{run}"
        out.mkdir()
        proc = torchrun(4, WORKER, data, out, "loader-only")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        keys = [json.loads((out / f"rank{r}.json").read_text())["keys"] for r in range(4)]
        assert len({len(k) for k in keys}) == 1  # every rank the same number of samples
        assert set().union(*keys) == {f"s/{i:06d}" for i in range(33)}


@pytest.mark.mpi
@pytest.mark.parametrize("when", ["before", "after"])
def test_torchrun_leaves_the_default_process_group_to_the_script(tmp_path: Path, when: str) -> None:
    data = make_dataset(tmp_path / "wds", "wds", [10, 11, 12])
    proc = torchrun(2, Path(__file__).with_name("torchrun_group_worker.py"), data, tmp_path, when)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    everything = {f"s/{i:06d}" for i in range(33)}
    for r in ranks:
        assert r["backend"] == "gloo" and r["world"] == 2 and r["total"] == 3.0  # the script's group, as it made it
    assert set(ranks[0]["keys"]) | set(ranks[1]["keys"]) == everything
    assert set(ranks[0]["again"]) | set(ranks[1]["again"]) == everything
    if when == "after":  # a whole epoch of ddpipe's collectives made no default group
        assert all(r["untouched"] for r in ranks)
