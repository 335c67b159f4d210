"""One local-directory name for the whole job, resolved on each node."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpipe.errors import DdpipeError
from ddpipe.staging import default_stage_dir, node_local_dir
from ddpipe.staging.local_dir import visible_local_dirs


@given(st.lists(st.integers(0, 4096), min_size=2, max_size=8, unique=True))
def test_node_in_the_name_gives_every_node_its_own_directory(nodes: list[int]) -> None:
    dirs = [node_local_dir("/scratch/job/node-{node}", n, "h", {}) for n in nodes]
    assert len(set(dirs)) == len(nodes)


def test_a_plain_name_is_the_same_on_every_node() -> None:
    assert node_local_dir("/local/ssd", 0, "a", {}) == node_local_dir("/local/ssd", 7, "b", {}) == Path("/local/ssd")


def test_the_host_and_the_nodes_environment() -> None:
    env = {"SLURM_TMPDIR": "/tmp/slurm-42", "USER": "ada"}
    assert node_local_dir("$SLURM_TMPDIR/ddpipe", 1, "gpu07", env) == Path("/tmp/slurm-42/ddpipe")
    assert node_local_dir("/nvme/${USER}/{host}-{node}", 3, "gpu07", env) == Path("/nvme/ada/gpu07-3")


@pytest.mark.parametrize(("template", "message"), [
    ("$SLURM_TMPDIR/x", r"names \$SLURM_TMPDIR, which is not set on node 2"),
    ("/x/{rank}", r"names \{rank\}; it may name \{node\}, \{host\}"),
    ("/x/{node", "not a valid template"),
])
def test_a_name_that_cannot_be_resolved_says_why(template: str, message: str) -> None:
    with pytest.raises(DdpipeError, match=message):
        node_local_dir(template, 2, "h", {})


def test_auto_is_the_environments_choice() -> None:
    assert default_stage_dir({"DDPIPE_LOCAL_DIR": "/fast/{node}"}) == Path("/fast/{node}")
    assert default_stage_dir({}).name == "ddpipe-stage"


def test_a_leading_tilde_is_the_nodes_home() -> None:
    assert node_local_dir("~/stage/{node}", 2, "h", {"HOME": "/home/ada"}) == Path("/home/ada/stage/2")
    assert node_local_dir("/data/~x", 0, "h", {"HOME": "/home/ada"}) == Path("/data/~x")  # only where it leads


@given(st.sets(st.integers(0, 120), max_size=6), st.sampled_from(["{node}", "{node:03d}", "n{node}-{host}"]))
def test_every_nodes_directory_is_found_after_the_job(nodes: set[int], name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        template = f"$SCRATCH/stage/{name}"
        env = {"SCRATCH": tmp}
        made = [node_local_dir(template, n, "gpu07", env) for n in sorted(nodes)]
        for d in made:
            d.mkdir(parents=True)
        (Path(tmp) / "stage" / "other").mkdir(parents=True, exist_ok=True)  # no node's: left out
        (Path(tmp) / "stage" / "007x").mkdir(exist_ok=True)
        (Path(tmp) / "stage" / "n3-gpu08").mkdir(exist_ok=True)  # another host's name
        assert visible_local_dirs(template, "gpu07", env) == made


def test_a_name_without_node_is_this_machines_directory(tmp_path: Path) -> None:
    assert visible_local_dirs(tmp_path / "{host}", "gpu07", {}) == []
    (tmp_path / "gpu07").mkdir()
    assert visible_local_dirs(tmp_path / "{host}", "gpu07", {}) == [tmp_path / "gpu07"]
    assert visible_local_dirs("auto", "h", {"DDPIPE_LOCAL_DIR": str(tmp_path / "gpu07")}) == [tmp_path / "gpu07"]


def test_a_staging_directory_that_cannot_be_made_is_named_as_given(tmp_path: Path) -> None:
    """A file where the directory goes was reported as '<it>/ddpipe-09d5...: Not a directory', the
    dataset's directory under it, a name the user never gave."""
    import ddpipe

    from ..conftest import run_cli
    from ..helpers import make_dataset

    data = make_dataset(tmp_path / "ds", "wds", [4, 4])
    (tmp_path / "a-file").write_text("")
    for stage in (tmp_path / "a-file", tmp_path / "a-file" / "stage"):
        with pytest.raises(DdpipeError) as refused:
            ddpipe.EncodedStream(data, 4, stage_dir=stage)
        assert str(refused.value) == f"{stage}: the staging directory cannot be made there: Not a directory"
        proc = run_cli("stage", data, "--local-dir", stage, "--quiet")
        assert (proc.returncode, proc.stderr) == (1, f"ddpipe: error: {refused.value}\n")
