"""Batches read and prepared for DALI in a process of their own (``read_in="process"``): the same
batches as threads give, resumption, leaving an epoch early, errors at their batch's turn, either
process ending, and the shared buffer's placement."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ddpipe
from ddpipe import DecodeOptions
from ddpipe.errors import CorruptShardError, DdpipeError, OptionError, SampleError
from ddpipe.read_server import _Ring
from ddpipe.synth import encode_jpeg, render_image
from tests.helpers import alive

pytest.importorskip("nvidia.dali")

BATCH = 8


def natural_samples(n: int, bad: dict[int, bytes] | None = None) -> list[dict[str, object]]:
    bad = bad or {}
    return [{"__key__": f"n/{i:03d}", "jpg": bad.get(i) or encode_jpeg(render_image(i, seed=7, long_side=96)),
             "cls": b"%d" % (i % 3)} for i in range(n)]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rp") / "wds"
    ddpipe.write_dataset(root, iter(natural_samples(60)), samples_per_shard=16, classes=["a", "b", "c"])
    return root


def gpu_path(loader: ddpipe.Loader) -> ddpipe.Loader:
    """The loader with the dali-gpu path's decoder (its transform in DALI, its batches prepared on the
    feed's thread), run on DALI's CPU operators."""
    from ddpipe.decode.dali import DaliDecoder

    options = loader.decoding.options
    loader.decoding._decoder = DaliDecoder(options, BATCH, torch.device("cpu"), gpu_decode=False,
                                           transform_in_dali=True)
    return loader


def make(root: Path, read_in: str, gpu: bool = True, **kw: object) -> ddpipe.Loader:
    options: dict[str, object] = {"decoder": "dali-cpu", "device": "cpu", "shuffle": "local", "size": 32,
                                  "resize_shorter": 40, "dtype": "uint8", "threads": 1, "seed": 5, **kw}
    loader = ddpipe.Loader(root, BATCH, read_in=read_in, **options)  # type: ignore[arg-type]
    return gpu_path(loader) if gpu else loader


Batches = list[tuple[torch.Tensor, torch.Tensor]]


def epoch_of(loader: ddpipe.Loader, epoch: int, stop_after: int | None = None) -> Batches:
    loader.set_epoch(epoch)
    out = []
    for x, y in loader:
        out.append((x.clone(), y.clone()))
        if stop_after is not None and len(out) == stop_after:
            break
    return out


def same(a: Batches, b: Batches) -> bool:
    pairs = zip(a, b, strict=False)
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in pairs)


def reading_process(loader: ddpipe.Loader) -> int:
    reader = loader.decoding._reader
    assert reader is not None and reader._proc is not None
    return reader._proc.pid


@pytest.mark.parametrize("gpu", [True, False])
@pytest.mark.parametrize("train", [True, False])
def test_the_same_batches_as_threads_give(images: Path, gpu: bool, train: bool) -> None:
    """Pixels and labels, epoch after epoch (a local shuffle differs from one to the next), on the GPU
    path's feed and on the CPU path's."""
    threads, apart = make(images, "thread", gpu, train=train), make(images, "process", gpu, train=train)
    for epoch in range(2):
        want, got = epoch_of(threads, epoch), epoch_of(apart, epoch)
        assert same(want, got)
        assert len(got) == 60 // BATCH + 1
    assert apart.stats.read.held_peak == threads.stats.read.held_peak > 0  # the reading process's figures
    pid = reading_process(apart)
    apart.close()
    assert not alive(pid)
    threads.close()


def mapped_here(root: Path) -> set[str]:
    """The files under ``root`` this process maps."""
    with open("/proc/self/maps") as maps:
        return {line.split(maxsplit=5)[5].strip() for line in maps
                if len(line.split(maxsplit=5)) == 6 and line.split(maxsplit=5)[5].startswith(str(root))}


@pytest.mark.parametrize("fmt", ["wds", "hdf5", "lmdb"])
def test_images_are_read_where_the_reading_process_found_them(tmp_path: Path, fmt: str) -> None:
    """Tar's, HDF5's and LMDB's images are handed over as places in their shard files, which the
    training process maps (it reads no shard otherwise), not copied: the same batches as threads give."""
    root = tmp_path / fmt
    ddpipe.write_dataset(root, iter(natural_samples(60)), format=fmt, samples_per_shard=16, classes=["a", "b", "c"])
    threads, apart = make(root, "thread"), make(root, "process")
    assert mapped_here(root) == set()
    apart.set_epoch(0)
    got = []
    for x, y in apart:
        got.append((x.clone(), y.clone()))
        if len(got) == 1:
            assert mapped_here(root) and mapped_here(root) <= {str(p) for p in root.glob("*") if p.suffix != ".json"}
    assert same(got, epoch_of(threads, 0))
    threads.close()
    apart.close()


@pytest.mark.parametrize("layout", ["caffe", "hdf5"])
def test_adopted_images_are_read_where_the_reading_process_found_them(tmp_path: Path, layout: str) -> None:
    """Data another tool wrote, adopted in place (Caffe's encoded datums in an LMDB, variable-length
    rows of HDF5 files): its images cross as places in its files too, which the training process
    maps; the same batches as threads give."""
    from ddpipe.convert.adopt_hdf5 import index_hdf5
    from ddpipe.convert.adopt_lmdb import index_lmdb
    from tests.convert.foreign_data import h5_vlen, lmdb_caffe

    if layout == "caffe":
        root = lmdb_caffe(tmp_path / layout, n=60)
        index_lmdb(root)
    else:
        root = h5_vlen(tmp_path / layout, files=2, per_file=30)
        index_hdf5(root)
    data_files = {str(p) for p in root.iterdir() if p.suffix in (".mdb", ".h5")} - {str(root / "lock.mdb")}
    threads, apart = make(root, "thread"), make(root, "process")
    for epoch in range(2):
        assert same(epoch_of(apart, epoch), epoch_of(threads, epoch))
        assert mapped_here(root) and mapped_here(root) <= data_files
    threads.close()
    apart.close()


def test_the_reading_process_imports_its_parents_ddpipe_wherever_it_starts(
        images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Started in a directory that holds another ddpipe (a checkout beside an installed one), it still
    speaks its parent's protocol."""
    other = tmp_path / "ddpipe"
    other.mkdir()
    (other / "__init__.py").write_text("raise SystemExit('another ddpipe was imported')\n")
    monkeypatch.chdir(tmp_path)
    threads, apart = make(images, "thread"), make(images, "process")
    assert same(epoch_of(apart, 0), epoch_of(threads, 0))
    threads.close()
    apart.close()


def test_the_reading_process_starts_with_the_loader(images: Path) -> None:
    """Made with the Loader, so that its start passes while the caller builds its model; the first
    epoch uses that one, and closing the Loader ends it."""
    loader = make(images, "process")
    pid = reading_process(loader)
    assert alive(pid)
    assert sum(len(y) for _, y in epoch_of(loader, 0)) == 60
    assert reading_process(loader) == pid
    loader.close()
    assert not alive(pid)


def test_left_early_then_the_next_epoch_and_a_resumed_one(images: Path) -> None:
    """A caller that leaves an epoch after two batches gets the next epoch whole; a state taken after
    three batches resumes (in a loader reading with threads) as the threads' own state does."""
    threads, apart = make(images, "thread"), make(images, "process")
    assert same(epoch_of(apart, 0, stop_after=2), epoch_of(threads, 0, stop_after=2))
    assert same(epoch_of(apart, 1), epoch_of(threads, 1))

    def resumed_after_three(loader: ddpipe.Loader) -> Batches:
        loader.set_epoch(2)
        it = iter(loader.decoding)  # closed, the epoch is left
        first = [(x.clone(), y.clone()) for x, y in (next(it) for _ in range(3))]
        state = loader.state_dict()
        it.close()
        resumed = make(images, "thread")
        resumed.load_state_dict(state)
        rest = [(x.clone(), y.clone()) for x, y in resumed]
        resumed.close()
        return first + rest

    got, want = resumed_after_three(apart), resumed_after_three(threads)
    assert same(got, want) and sum(len(y) for _, y in got) == 60
    threads.close()
    apart.close()


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
from tests.test_read_process import make
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


@pytest.mark.parametrize("read_in", ["thread", "process"])
def test_a_later_loop_over_the_loader_ends_the_one_before(images: Path, read_in: str) -> None:
    """A loader's decoder and reading serve one loop at a time. A second ``iter()`` while the first
    is still held (kept in a variable, or ``zip(loader, loader)``) starts the epoch afresh, whole; the
    first then says it was ended, where it gave nothing more (threads) or the second's batches while
    the second ended short of the epoch (read in a process: 6 batches of 8, not the epoch's)."""
    whole = epoch_of(make(images, read_in, gpu=False), 0)
    loader = make(images, read_in, gpu=False)
    first = iter(loader)
    next(first)
    again = [(x.clone(), y.clone()) for x, y in loader]
    assert same(again, whole)
    with pytest.raises(DdpipeError, match=r"^this loop over the loader was ended by a later iter\(\) of it"):
        next(first)
    assert same(epoch_of(loader, 0), whole)  # and the loader goes on
    held = iter(loader)
    next(held)
    loader.close()
    with pytest.raises(DdpipeError, match=r"^this loop over the loader was ended by the loader's close\(\)$"):
        next(held)


def test_auto_reads_apart_for_the_gpu_decoder_alone(images: Path) -> None:
    """The default settles as the loader is made: a process of its own for dali-gpu, where the GPU
    measurements had it faster; threads for the CPU decoders, and for a decode service's batches,
    which its servers prepare."""
    assert DecodeOptions().read_in == "auto"
    assert DecodeOptions().reads_apart("dali-gpu")
    assert not DecodeOptions(service=("tcp://a:1",)).reads_apart("dali-gpu")
    for decoder in ("dali-cpu", "pil"):
        assert not DecodeOptions().reads_apart(decoder)
    assert not DecodeOptions(read_in="thread").reads_apart("dali-gpu")
    assert DecodeOptions(read_in="process").reads_apart("dali-cpu")
    loader = ddpipe.Loader(images, BATCH, decoder="dali-cpu", device="cpu", size=32, resize_shorter=40)
    try:
        assert loader.decoding.options.read_in == "thread" and loader.decoding._reader is None
        assert len(list(loader)) == len(loader)
    finally:
        loader.close()
    loader = ddpipe.Loader(images, BATCH, decoder="dali-cpu", device="cpu", size=32, resize_shorter=40,
                           read_in="process")
    try:
        assert loader.decoding.options.read_in == "process" and loader.decoding._reader is not None
    finally:
        loader.close()


def test_refused_where_it_cannot_serve(images: Path) -> None:
    """Before anything is read: a decoder that is not DALI's."""
    with pytest.raises(OptionError, match="a DALI decoder"):
        list(ddpipe.Loader(images, BATCH, decoder="pil", device="cpu", read_in="process"))
    with pytest.raises(OptionError, match="read_in"):
        ddpipe.Loader(images, BATCH, read_in="elsewhere")


@pytest.mark.parametrize("capacity", [None, 2])
def test_staged_shards_are_read_from_the_nodes_copies(tmp_path: Path, capacity: int | None) -> None:
    """This process stages (local rank 0), the reading process reads the copies: the threads'
    batches, every shard copied once; with room for two shards of four, copies are evicted once
    read (which the reading process says) and made again the next epoch. Without a capacity, the
    source may go once staged: the next epoch is read from the copies."""
    import shutil

    source = tmp_path / "src"
    ddpipe.write_dataset(source, iter(natural_samples(60)), samples_per_shard=16, classes=["a", "b", "c"])
    largest = max(f.stat().st_size for f in source.glob("*.tar"))
    room = None if capacity is None else capacity * largest
    threads = make(source, "thread", stage_dir=tmp_path / "by-threads", stage_capacity=room)
    apart = make(source, "process", stage_dir=tmp_path / "apart", stage_capacity=room)
    for epoch in range(2):
        assert same(epoch_of(apart, epoch), epoch_of(threads, epoch))
    stats = apart.stager.stats  # type: ignore[union-attr]
    assert stats["fallbacks"] == 0
    if capacity is None:
        assert stats["copied"] == 4 and stats["reused"] == 4
        want = epoch_of(threads, 2)
        shutil.rmtree(source)
        assert same(epoch_of(apart, 2), want)
    else:
        assert stats["copied"] > 4 and stats["evicted"] > 0
    threads.close()
    apart.close()


def test_a_shard_the_node_cannot_stage_is_named_by_the_training_process(tmp_path: Path) -> None:
    """The copying is this process's: a source shard gone is its error, raised while the reading
    process waits for that shard's copy, not after the copy's wait times out."""
    from ddpipe.errors import MissingShardError

    source = tmp_path / "src"
    ddpipe.write_dataset(source, iter(natural_samples(40)), samples_per_shard=10, classes=["a", "b", "c"])
    loader = make(source, "process", shuffle="none", stage_dir=tmp_path / "stage", stage_wait_timeout=300.0)
    (source / "shard-000002.tar").unlink()
    with pytest.raises(MissingShardError, match=r"shard-000002\.tar"):
        list(loader)
    assert not reading_processes()  # gone with the error, not left waiting for the copy
    loader.close()


def reading_processes() -> list[int]:
    """This process's reading processes still running."""
    mine = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields.get("PPid", "0")) == os.getpid() and b"ddpipe.read_server" in cmdline:
            mine.append(int(status.parent.name))
    return mine


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 3)), min_size=1, max_size=60))
def test_the_buffer_never_places_a_batch_over_a_live_one(steps: list[tuple[int, int]]) -> None:
    """Each batch is placed inside the buffer, over no batch not yet released, once releases (in
    order, as DALI returns batches) make room; with nothing live there is always room."""
    ring = _Ring(memoryview(bytearray(100)))
    for seq, (nbytes, releases) in enumerate(steps):
        while (start := ring.place(nbytes)) is None:
            assert ring.live, "no room in an empty buffer"
            ring.release(ring.live[0][0])
        assert start >= 0 and start + nbytes <= 100
        for _, a, b in ring.live:
            assert start + nbytes <= a or b <= start, (start, nbytes, list(ring.live))
        ring.live.append((seq, start, start + nbytes))
        for _ in range(releases):
            if ring.live:
                ring.release(ring.live[0][0])
    ring.release(None)
    assert ring.place(100) == 0


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
