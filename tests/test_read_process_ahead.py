"""The next epoch read ahead in the reading process: read before it is asked for, its errors raised
when it is, samples it left out counted in it, and past epochs' files forgotten."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddpipe
from ddpipe.errors import CorruptShardError
from tests.reading_apart import (
    BATCH,
    epoch_of,
    make,
    natural_samples,
    same,
)

pytest.importorskip("nvidia.dali")


def test_samples_left_out_of_an_epoch_read_ahead_count_in_that_epoch(tmp_path: Path) -> None:
    """Under on_error="skip", a read-ahead epoch's skipped samples are told with its own batches."""
    root = tmp_path / "wds"
    ddpipe.write_dataset(root, iter(natural_samples(32, bad={10: b"not a jpeg at all"})), samples_per_shard=16,
                         classes=["a", "b", "c"])
    threads, apart = make(root, "thread", on_error="skip"), make(root, "process", on_error="skip")
    for epoch in range(3):
        assert same(epoch_of(apart, epoch), epoch_of(threads, epoch))
        assert [s.key for s in apart.stats.decode.skipped_samples] == ["n/010"]
    threads.close()
    apart.close()


class InThisProcess:
    """The reading process's server, driven here, one call at a time, over a real socket pair: what it
    holds between two epochs can be looked at, and the files changed, at a known point."""

    def __init__(self, root: Path) -> None:
        import mmap
        import socket
        from multiprocessing.connection import Connection

        from ddpipe.read_process import spec_of
        from ddpipe.read_server import _Server
        from ddpipe.shard_places import PlaceViews

        ours, theirs = socket.socketpair()
        self.conn, server_end = Connection(ours.detach()), Connection(theirs.detach())
        stream = ddpipe.EncodedStream(root, BATCH, shuffle="local", seed=5)
        spec, size, _ = spec_of(stream, ddpipe.DecodeOptions(decoder="dali-cpu", size=32, resize_shorter=40))
        self.conn.send(spec)
        self.server = _Server(server_end, memoryview(mmap.mmap(-1, size)), None)
        self.places = PlaceViews()
        self.root = root

    def epoch(self, epoch: int) -> tuple[list[list[int]], tuple[object, ...]]:
        """Epoch ``epoch`` served (and the next read ahead, where the server does): the indices of each
        batch, and how it ended (``end`` or ``error``)."""
        self.server.epoch(5, epoch, None)
        batches: list[list[int]] = []
        while True:
            message = self.conn.recv()
            if self.places.receive(message, self.conn):
                continue
            if message[0] != "batch":
                return batches, message
            batches.append([int(i) for i in message[5]])

    def planned(self, epoch: int) -> list[list[int]]:
        stream = ddpipe.EncodedStream(self.root, BATCH, shuffle="local", seed=5)
        stream.set_epoch(epoch)
        return [b.indices.tolist() for b in stream]


def test_an_epoch_read_ahead_was_read_before_it_was_asked_for(tmp_path: Path) -> None:
    """Epoch 1's first batches are held as epoch 0 ends: with the shards gone by the time it is asked
    for, epoch 1 still comes whole (a local shuffle's first batch needs all 60 samples read into its
    buffer), where a server that does not read ahead finds them missing."""
    from ddpipe.epoch_ahead import READ_AHEAD_BATCHES

    for reads_ahead in (True, False):
        root = tmp_path / f"wds-{reads_ahead}"
        ddpipe.write_dataset(root, iter(natural_samples(60)), samples_per_shard=16, classes=["a", "b", "c"])
        here = InThisProcess(root)
        here.server.may_read_ahead = reads_ahead
        planned = here.planned(1)
        batches, end = here.epoch(0)
        assert batches == here.planned(0) and end[0] == "end"
        ahead = here.server.ahead
        assert (ahead is not None and ahead.epoch == 1 and len(ahead.held) == READ_AHEAD_BATCHES) == reads_ahead
        for shard in root.glob("*.tar"):
            shard.unlink()
        batches, end = here.epoch(1)
        if reads_ahead:
            assert batches == planned and end[0] == "end"
        else:
            assert batches == [] and end[0] == "error" and isinstance(end[1], FileNotFoundError)


def test_what_reading_ahead_raised_is_raised_when_that_epoch_is_asked_for(tmp_path: Path) -> None:
    """A shard damaged after epoch 0 was read: reading epoch 1 ahead meets it, and says nothing until
    epoch 1 is asked for; then the error comes, naming the shard, as it would have unread ahead. An
    epoch asked for instead is read afresh."""
    root = tmp_path / "wds"
    ddpipe.write_dataset(root, iter(natural_samples(60)), samples_per_shard=16, classes=["a", "b", "c"])
    here = InThisProcess(root)
    here.server.may_read_ahead = False
    assert here.epoch(0)[1][0] == "end"
    shard = sorted(root.glob("*.tar"))[2]
    data = bytearray(shard.read_bytes())
    data[-2000] ^= 0xFF
    shard.write_bytes(bytes(data))
    here.server.ahead = here.server.read_ahead(5, 1)
    assert not here.conn.poll()  # nothing told yet
    batches, end = here.epoch(1)
    assert batches == [] and end[0] == "error" and isinstance(end[1], CorruptShardError)
    assert end[1].path == str(shard)


def mappings_here(root: Path) -> int:
    """How many mappings of files under ``root`` this process holds (a file mapped twice counts twice)."""
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if len(line.split(maxsplit=5)) == 6
                   and line.split(maxsplit=5)[5].startswith(str(root)))


def test_the_files_of_past_epochs_are_forgotten(tmp_path: Path) -> None:
    """Each epoch the reading process maps the shards again, and the training process with it; it tells
    the training process to forget the last epoch's mappings after the next epoch's first batches (the
    unmapping would hold them up), but it does tell it: the mappings here do not pile up."""
    root = tmp_path / "wds"
    ddpipe.write_dataset(root, iter(natural_samples(60)), samples_per_shard=8, classes=["a", "b", "c"])
    shards = len(list(root.glob("*.tar")))
    loader = make(root, "process")
    held = []
    for epoch in range(6):
        epoch_of(loader, epoch)
        held.append(mappings_here(root))
    assert max(held) <= 2 * shards  # at most the files of two epochs: the last one's and the next's
    loader.close()
    assert mappings_here(root) == 0
