"""Reading in a process of its own, when things go wrong: a damaged shard or a bad image raised at
its batch's turn, batches without room in the buffer, the reading process dying or signalled, and
its parent's death ending it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ddpipe
from ddpipe.errors import CorruptShardError, DdpipeError, SampleError
from tests.helpers import alive
from tests.reading_apart import (
    BATCH,
    epoch_of,
    make,
    natural_samples,
    reading_process,
    same,
    write_images,
)

pytest.importorskip("nvidia.dali")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_images(tmp_path_factory.mktemp("rp") / "wds")


def test_a_damaged_shard_is_raised_at_its_turn_naming_it(tmp_path: Path) -> None:
    """As threads raise it, after as many batches; the error is the reading process's, whole; the
    next epoch still has a reading process to serve it."""
    root = tmp_path / "wds"
    ddpipe.write_dataset(root, iter(natural_samples(40)), samples_per_shard=16, classes=["a", "b", "c"])
    shard = sorted(root.glob("*.tar"))[1]
    data = bytearray(shard.read_bytes())
    data[-2000] ^= 0xFF  # inside the last sample's image: the checksum finds it
    shard.write_bytes(bytes(data))
    seen = {}
    for read_in in ("thread", "process"):
        loader = make(root, read_in, shuffle="none")
        got = []
        with pytest.raises(CorruptShardError) as info:
            for x, _ in loader:
                got.append(x)
        seen[read_in] = (len(got), str(info.value))
        assert info.value.path == str(shard) and "checksum mismatch" in str(info.value)
    assert seen["process"] == seen["thread"]
    pid = reading_process(loader)
    with pytest.raises(CorruptShardError):
        list(loader)
    assert reading_process(loader) == pid
    loader.close()
    assert not alive(pid)
    # skipped instead: the same batches, and the reading process's figures name the shard
    threads, apart = make(root, "thread", on_error="skip"), make(root, "process", on_error="skip")
    assert same(epoch_of(apart, 0), epoch_of(threads, 0))
    assert apart.stats.read.corrupt_shards == threads.stats.read.corrupt_shards == [shard.name]
    assert apart.stats.read.skipped == threads.stats.read.skipped == 16
    threads.close()
    apart.close()


def test_a_sample_that_does_not_decode_fails_or_is_skipped(tmp_path: Path) -> None:
    """Its header is read in the reading process: under "fail" the error names it; under "skip" it is
    counted as threads count it, and the batches keep their sizes."""
    root = tmp_path / "wds"
    ddpipe.write_dataset(root, iter(natural_samples(32, bad={10: b"not a jpeg at all"})), samples_per_shard=16,
                         classes=["a", "b", "c"])
    loader = make(root, "process", shuffle="none")
    with pytest.raises(SampleError) as info:
        list(loader)
    assert info.value.key == "n/010"
    loader.close()
    threads, apart = make(root, "thread", on_error="skip"), make(root, "process", on_error="skip")
    want, got = epoch_of(threads, 0), epoch_of(apart, 0)
    assert same(want, got) and [len(y) for _, y in got] == [BATCH] * 4  # refilled
    assert apart.stats.decode.skipped_samples == threads.stats.decode.skipped_samples
    assert [s.key for s in apart.stats.decode.skipped_samples] == ["n/010"]
    threads.close()
    apart.close()


@pytest.mark.parametrize("small", [False, True])
def test_batches_that_find_no_room_in_the_buffer_still_come(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           small: bool) -> None:
    """Images of a format adopted in place (an LMDB another tool wrote) are copies, which travel in
    the buffer (ddpipe's own shards' as places in their files). A buffer of about one batch: the
    parent holds more than that in flight before it releases any (DALI's queue, the batches prepared
    ahead), so batches that wait for room in vain, and those larger than the buffer, go through the
    connection; nothing hangs, nothing differs."""
    from ddpipe import read_process
    from ddpipe.convert.adopt_lmdb import index_lmdb
    from tests.convert.foreign_data import lmdb_msgpack

    root = lmdb_msgpack(tmp_path / "foreign", n=60)
    index_lmdb(root)
    if small:
        monkeypatch.setattr(read_process, "BUFFER_BATCHES", 1)
        monkeypatch.setattr(read_process, "MIN_BUFFER_BYTES", 1)
    threads, apart = make(root, "thread"), make(root, "process")
    for epoch in range(2):
        assert same(epoch_of(apart, epoch), epoch_of(threads, epoch))
    threads.close()
    apart.close()


def test_a_reading_process_that_dies_is_an_error_not_a_hang(images: Path) -> None:
    """Killed mid-epoch (a slow source keeps it reading), it is named; the next epoch starts another."""
    loader = make(images, "process", source_limits="100KB/s", shuffle="none")
    it = iter(loader)
    next(it)
    os.kill(reading_process(loader), signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(DdpipeError, match="reading process ended unexpectedly"):
        for _ in it:
            pass
    assert time.monotonic() - t0 < 60  # a hang bound: it is noticed within a second or two
    assert len(epoch_of(loader, 1)) == 60 // BATCH + 1  # the next epoch starts another
    loader.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_to_the_process_group_leaves_the_reading_process_reading(images: Path, sig: int) -> None:
    """A terminal's Ctrl-C, or a launcher's, reaches the reading process too, and only the rank may
    decide what it means: one that took it as its own died with a traceback, and its rank's epoch with
    "the reading process ended unexpectedly" in place of the rank's own answer to Ctrl-C. So does a
    scheduler's stop (SIGTERM, SIGUSR1 to every process of a Slurm step), which the rank answers after
    its step."""
    loader = make(images, "process", source_limits="100KB/s", shuffle="none")
    it = iter(loader)
    seen = len(next(it)[1])
    child = reading_process(loader)
    os.kill(child, sig)
    seen += sum(len(labels) for _, labels in it)
    assert seen == 60
    assert alive(child)
    loader.close()


PARENT = """
import sys, ddpipe, torch
from tests.reading_apart import make
from pathlib import Path
loader = make(Path(sys.argv[1]), "process")
it = iter(loader)
next(it)
print(loader.decoding._reader._proc.pid, flush=True)
sys.stdin.read()  # until the test kills this process
"""


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_the_reading_process_ends_with_its_parent(images: Path, how: int) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(images)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert alive(child)
    parent.send_signal(how)
    parent.wait(timeout=60)
    deadline = time.monotonic() + 60  # a hang bound: it goes as soon as its connection closes
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)
