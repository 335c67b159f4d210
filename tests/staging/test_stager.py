"""Node-local staging in one process, and the faults: damaged copies, missing source, full disk, a
shared stage directory, and a capacity smaller than the node's share (staging stopped part-way:
test_stager_stops.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ddpipe
from ddpipe.errors import ChecksumMismatchError, MissingShardError, OptionError, RepeatedEpochWarning
from ddpipe.manifest import load_manifest
from ddpipe.shard_copy import verified_copy
from ddpipe.staging import SourceLimits

from ..conftest import run_cli
from ..helpers import make_dataset
from .sources import ALL, keys, source, staged


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return source(tmp_path)


def test_staged_epoch_reads_local_copies_and_reuses_them(data: Path, tmp_path: Path) -> None:
    plain = keys(ddpipe.EncodedStream(data, 8, shuffle="local", seed=2))
    loader = ddpipe.EncodedStream(data, 8, shuffle="local", seed=2, stage_dir=tmp_path / "stage")
    assert keys(loader) == plain
    assert loader.stager is not None and loader.stager.stats["copied"] == 5
    local = staged(tmp_path / "stage", data)
    for info in load_manifest(data).shards:
        assert (local / info.file).read_bytes() == (data / info.file).read_bytes()
    again = ddpipe.EncodedStream(data, 8, shuffle="local", seed=2, stage_dir=tmp_path / "stage")
    assert keys(again) == plain  # a second run reads the copies made by the first
    assert again.stager is not None and again.stager.stats == {**again.stager.stats, "copied": 0, "reused": 5}


def test_damaged_copy_is_fetched_again(data: Path, tmp_path: Path) -> None:
    list(ddpipe.EncodedStream(data, 8, stage_dir=tmp_path / "stage"))
    victim = staged(tmp_path / "stage", data) / "shard-000002.tar"
    victim.write_bytes(victim.read_bytes()[:5000])
    loader = ddpipe.EncodedStream(data, 8, stage_dir=tmp_path / "stage")
    assert set(keys(loader)) == ALL
    assert loader.stager is not None and loader.stager.stats["copied"] == 1
    assert victim.read_bytes() == (data / "shard-000002.tar").read_bytes()


def test_leftover_partial_file_is_never_read(data: Path, tmp_path: Path) -> None:
    local = staged(tmp_path / "stage", data)
    local.mkdir(parents=True)
    (local / ".shard-000001.tar.partial").write_bytes(b"half a copy from a killed stager")
    assert set(keys(ddpipe.EncodedStream(data, 8, stage_dir=tmp_path / "stage"))) == ALL
    assert not (local / ".shard-000001.tar.partial").exists()


def test_missing_source_shard_is_named(data: Path, tmp_path: Path) -> None:
    loader = ddpipe.EncodedStream(data, 8, shuffle="none", stage_dir=tmp_path / "stage")
    (data / "shard-000003.tar").unlink()
    with pytest.raises(MissingShardError, match=r"shard-000003\.tar"):
        list(loader)


def test_corrupt_source_is_a_checksum_error(data: Path, tmp_path: Path) -> None:
    info = load_manifest(data).shards[0]
    src = data / info.file
    raw = bytearray(src.read_bytes())
    raw[3000] ^= 1
    src.write_bytes(bytes(raw))
    with pytest.raises(ChecksumMismatchError, match=info.file):
        verified_copy(src, tmp_path / "copy.tar", info)
    assert not list(tmp_path.glob("*copy*"))  # nothing half-written left behind


def test_capacity_evicts_and_keeps_every_sample_once(data: Path, tmp_path: Path) -> None:
    one = load_manifest(data).shards[0].bytes
    loader = ddpipe.EncodedStream(data, 8, shuffle="local", stage_dir=tmp_path / "stage",
                           stage_capacity=2 * one + 100)
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = keys(loader)
        assert len(got) == 60 and set(got) == ALL
    assert loader.stager is not None and loader.stager.stats["evicted"] >= 3
    assert len(list(staged(tmp_path / "stage", data).glob("shard-*.tar"))) <= 2
    assert len(list(staged(tmp_path / "stage", data).glob("shard-*.idx"))) <= 2  # a tar's index goes with it


def test_a_rerun_with_a_capacity_reads_every_sample(data: Path, tmp_path: Path) -> None:
    """The notes of the run before (which shards its ranks were done with, by epoch and local rank)
    were counted for this one's: its stager evicted copies not yet read, and the rerun waited out
    the timeout (a hang bound here)."""
    one = max(s.bytes for s in load_manifest(data).shards)
    for run in range(2):
        with ddpipe.EncodedStream(data, 8, shuffle="local", stage_dir=tmp_path / "stage", stage_capacity=2 * one + 100,
                                  stage_wait_timeout=60) as stream:
            for epoch in range(2):
                stream.set_epoch(epoch)
                assert set(keys(stream)) == ALL, (run, epoch)
    notes = sorted(p.name.split(".done.")[1] for p in staged(tmp_path / "stage", data).glob(".*.done.*"))
    assert set(notes) <= {"1.0"}  # only the last epoch's are kept, the earlier removed as each starts


def test_an_epoch_iterated_again_with_a_capacity_reads_every_sample(data: Path, tmp_path: Path) -> None:
    """Iterating again repeats the epoch; the first time's notes of finished shards (by epoch and local
    rank) were counted for the second, whose stager evicted copies not yet read (it waited out the
    timeout). A reader whose shard the stager has gone past takes the source's."""
    one = max(s.bytes for s in load_manifest(data).shards)
    with ddpipe.EncodedStream(data, 8, shuffle="local", stage_dir=tmp_path / "stage", stage_capacity=2 * one + 100,
                              stage_wait_timeout=60) as stream:
        first = keys(stream)
        with pytest.warns(RepeatedEpochWarning, match="epoch 0 begins again"):  # repeated on purpose, said once
            again = [keys(stream) for _ in range(2)]
        assert again == [first, first] and set(first) == ALL


def test_throttled_source_is_slow(data: Path, tmp_path: Path) -> None:
    nbytes = sum(s.bytes for s in load_manifest(data).shards)
    limits = SourceLimits.parse(f"{nbytes * 4}B/s,20ms")  # a quarter of a second, plus 5 x 20 ms of opens
    assert limits.bandwidth == nbytes * 4 and limits.latency == 0.02
    t0 = time.monotonic()
    list(ddpipe.EncodedStream(data, 8, shuffle="none", source_limits=limits))
    # never faster than the modelled source, less the burst a link may deliver while its reader is busy
    assert time.monotonic() - t0 >= 0.25 - limits.burst + 5 * 0.02 - 0.02


def test_two_jobs_share_a_stage_directory(data: Path, tmp_path: Path) -> None:
    code = ("import sys, ddpipe; l = ddpipe.EncodedStream(sys.argv[1], 8, stage_dir=sys.argv[2], "
            "source_limits='20MB/s'); k = [s['__key__'] for b in l for s in b]; "
            "print(len(set(k)), l.stager.stats['copied'])")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(data), str(tmp_path / "stage")], stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert [o[0] for o in outs] == ["60", "60"]
    assert sum(int(o[1]) for o in outs) == 5  # each shard copied once between the two jobs


@pytest.mark.parametrize(("theirs", "mine"), [(True, False), (False, True), (True, True)])
def test_a_capacity_is_refused_beside_another_job_staging_the_same_dataset(data: Path, tmp_path: Path, theirs: bool,
                                                                           mine: bool) -> None:
    """Its stager would evict the copies the other job's readers wait for (they waited out the timeout)."""
    capacity = 3 * max(s.bytes for s in load_manifest(data).shards)
    code = ("import sys, ddpipe; l = ddpipe.EncodedStream(sys.argv[1], 8, stage_dir=sys.argv[2], "
            f"stage_capacity={capacity if theirs else None}); print('staging', flush=True); sys.stdin.read()")
    other = subprocess.Popen([sys.executable, "-c", code, str(data), str(tmp_path / "stage")], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert other.stdout is not None and other.stdout.readline() == "staging\n"
        with pytest.raises(OptionError, match=r"another job stages this dataset into .*stage now"):
            ddpipe.EncodedStream(data, 8, stage_dir=tmp_path / "stage", stage_capacity=capacity if mine else None)
        if mine:
            proc = run_cli("stage", data, "--local-dir", tmp_path / "stage", "--capacity", str(capacity))
            lines = proc.stderr.splitlines()
            assert proc.returncode == 1 and len(lines) == 1 and "another job stages" in lines[0], proc.stderr
    finally:
        other.communicate("", timeout=60)
    assert other.returncode == 0
    ddpipe.EncodedStream(data, 8, stage_dir=tmp_path / "stage", stage_capacity=capacity if mine else None)  # it ended


def test_streams_of_one_process_share_a_directory_with_a_capacity(data: Path, tmp_path: Path) -> None:
    capacity = 3 * max(s.bytes for s in load_manifest(data).shards)
    train = ddpipe.EncodedStream(data, 8, stage_dir=tmp_path / "stage", stage_capacity=capacity)
    again = ddpipe.EncodedStream(data, 8, stage_dir=tmp_path / "stage")
    assert set(keys(again)) == set(keys(train)) == ALL


def test_full_local_disk_falls_back_to_the_source(data: Path, tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed for the full-disk test")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code = ("import sys, ddpipe; l = ddpipe.EncodedStream(sys.argv[1], 8, stage_dir=sys.argv[2]); "
            "k = [s['__key__'] for b in l for s in b]; print('samples', len(k), len(set(k)), 'fallbacks', "
            "l.stager.stats['fallbacks'])")
    script = f"mount -t tmpfs -o size=40k tmpfs {mnt} || exit 99\n{sys.executable} -c \"{code}\" {data} {mnt}\n"
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "samples 60 60" in proc.stdout and "fallbacks 0" not in proc.stdout
    assert "no space left" in proc.stderr and "use the source" in proc.stderr


def test_stage_command(data: Path, tmp_path: Path) -> None:
    from ..conftest import mpiexec, run_cli

    proc = run_cli("stage", data, "--local-dir", tmp_path / "stage", "--epochs", "2", "--quiet", check=True)
    assert "staged 5 shards" in proc.stdout and "MB/s" in proc.stdout
    again = run_cli("stage", data, "--local-dir", tmp_path / "stage", "--quiet", check=True)
    assert "staged 0 shards" in again.stdout and "5 already staged" in again.stdout
    proc = mpiexec(2, "-m", "ddpipe", "stage", data, "--local-dir", tmp_path / "stage2", "--quiet")
    assert proc.returncode == 0 and proc.stdout.count("staged 5 shards") == 1, proc.stdout + proc.stderr
    loader = ddpipe.EncodedStream(data, 8, stage_dir=tmp_path / "stage2")
    assert set(keys(loader)) == ALL and loader.stager is not None and loader.stager.stats["copied"] == 0


def test_a_copy_evicted_between_its_naming_and_its_opening_is_read_from_the_source(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node short of room takes back the staged copy needed latest in the epoch; a rank reading ahead
    of the stager (the copy left from an earlier epoch) may have been given its path a moment before,
    and failed opening it (tests/mpi/test_nodes_mpi.py's capacity test, once under load). Here the
    eviction comes at that moment every time: the rank reads the source instead, every sample."""
    from ddpipe.shard_copy import remove_staged
    from ddpipe.staging.stager import NodeStager

    stream = ddpipe.EncodedStream(data, 8, shuffle="none", stage_dir=tmp_path / "stage")
    assert set(keys(stream)) == ALL  # every shard staged
    named = NodeStager.path

    def evicted_once_named(self: NodeStager, shard: int) -> Path:
        path = named(self, shard)
        remove_staged(path)  # what _make_room does
        return path

    monkeypatch.setattr(NodeStager, "path", evicted_once_named)
    stream.set_epoch(1)
    assert sorted(keys(stream)) == sorted(ALL)


def test_failure_of_an_earlier_run_is_tried_again(data: Path, tmp_path: Path) -> None:
    local = staged(tmp_path / "stage", data)
    local.mkdir(parents=True)
    (local / ".shard-000001.tar.failed").write_text("no space left (a full disk, last week)")
    assert set(keys(ddpipe.EncodedStream(data, 8, stage_dir=tmp_path / "stage"))) == ALL
    assert not (local / ".shard-000001.tar.failed").exists()
    assert (local / "shard-000001.tar").read_bytes() == (data / "shard-000001.tar").read_bytes()


def test_the_stage_directory_is_resolved_from_what_the_edge_read(data: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream reads neither the environment nor the host name: its communicator carries what
    init_comm read of them, so a communicator built by hand decides alone."""
    from ddpipe.comm import Comm, World

    monkeypatch.setenv("SCRATCH", str(tmp_path / "from-os-environ"))
    comm = Comm(World(host="node-a"))
    comm.environ = {"SCRATCH": str(tmp_path / "from-the-edge")}
    stream = ddpipe.EncodedStream(data, 8, stage_dir="$SCRATCH/{host}", comm=comm)
    assert stream.stager is not None and stream.stager.dir.parent == tmp_path / "from-the-edge" / "node-a"
    assert set(keys(stream)) == ALL and not (tmp_path / "from-os-environ").exists()
    edge = ddpipe.init_comm()  # the edge: this process's environment and host name
    assert edge.environ["SCRATCH"] == str(tmp_path / "from-os-environ") and edge.world.host


def test_stage_ahead_with_a_capacity_stages_what_the_job_reads_first_and_ends(data: Path, tmp_path: Path) -> None:
    """``ddpipe stage --capacity`` under the node's share: no rank reads there to make room, so it
    stages the first epoch's first shards that fit and ends (it waited for ever for readers); the
    job then starts on those copies rather than evicting them."""
    from ..conftest import run_cli

    capacity = 2 * max(s.bytes for s in load_manifest(data).shards) + 100
    proc = run_cli("stage", data, "--local-dir", tmp_path / "stage", "--capacity", str(capacity), "--epochs", "2",
                   "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "3 shard(s) of epoch 0 did not fit in the capacity" in proc.stdout
    assert len(list(staged(tmp_path / "stage", data).glob("*.tar"))) == 2
    job = ddpipe.EncodedStream(data, 8, stage_dir=tmp_path / "stage", stage_capacity=capacity)
    assert len(set(keys(job))) == 60
    assert job.stager is not None and job.stager.stats["reused"] == 2


@pytest.mark.parametrize("change", ["deleted", "rewritten"])
def test_a_copy_that_changes_after_the_stager_passed_it_is_read_from_the_source(
        data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """Without a capacity nothing is taken back, and a reader took a missing copy for one not made
    yet: a copy removed (``rm stage/*`` leaves the hidden stamps) or rewritten after the stager had
    verified it and gone on left the readers waiting out the timeout (a hang bound here). They read
    the source's, and the next epoch stages it again."""
    from ddpipe.staging.stager import NodeStager

    victim = staged(tmp_path / "stage", data) / "shard-000004.tar"
    named = NodeStager.path

    def changed_once_passed(self: NodeStager, shard: int) -> Path:
        if shard == 4 and self._epoch == 0:
            self.wait()  # the stager has made every copy and ended
            if change == "deleted":
                victim.unlink()
            else:
                victim.write_bytes(victim.read_bytes())  # the same bytes, not the file the stamp verified
        return named(self, shard)

    monkeypatch.setattr(NodeStager, "path", changed_once_passed)
    with ddpipe.EncodedStream(data, 8, shuffle="none", stage_dir=tmp_path / "stage", stage_wait_timeout=60) as stream:
        assert sorted(keys(stream)) == sorted(ALL)
        assert stream.stager is not None and stream.stager.stats["fallbacks"] == 1
        stream.set_epoch(1)
        assert sorted(keys(stream)) == sorted(ALL)
        assert stream.stager.stats["copied"] == 6  # the five, and the changed one again
    assert victim.read_bytes() == (data / "shard-000004.tar").read_bytes()


@pytest.mark.parametrize("when", ["copying", "copied"])
def test_a_stage_directory_removed_during_the_run_is_named(tmp_path: Path, when: str) -> None:
    """The copies, the stamps and the notes all went: the stager failed with the OS's error on a
    hidden file's name, and the node's other readers waited out the timeout (a hang bound here),
    then asked whether local rank 0 was alive; a reader once the stager had ended did the same."""
    data = make_dataset(tmp_path / "src", "wds", [12] * 5, payload=20_000)
    # prefetch: the reader no more than a batch ahead, so that the shards after the first two are read once
    # the directory is gone (reading 256 ahead, it once read them all before the removal, on a loaded host)
    with ddpipe.EncodedStream(data, 8, shuffle="none", stage_dir=tmp_path / "stage", stage_wait_timeout=60,
                              stage_limits=SourceLimits(bandwidth=1e6), prefetch=8) as stream:  # ~0.25 s a shard
        batches = iter(stream)
        next(batches)
        if when == "copied":
            assert stream.stager is not None
            stream.stager.wait()
        # gone at once (a removal file by file raced the stager's writes into it: the test's own error)
        removed = staged(tmp_path / "stage", data).rename(tmp_path / "removed")
        shutil.rmtree(removed, ignore_errors=True)
        with pytest.raises(ddpipe.DdpipeError, match="staging directory was removed while this job staged"):
            list(batches)
