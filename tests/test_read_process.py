"""Batches read and prepared for DALI in a process of their own (``read_in="process"``): the same
batches as threads give, where images are read, resumption, leaving an epoch early, one loop at a
time, staged copies, and the shared buffer's placement."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ddpipe
from ddpipe import DecodeOptions
from ddpipe.errors import DdpipeError, OptionError
from ddpipe.read_server import _Ring
from tests.helpers import alive
from tests.reading_apart import (
    BATCH,
    Batches,
    epoch_of,
    make,
    mapped_here,
    natural_samples,
    reading_process,
    reading_processes,
    same,
    write_images,
)

pytest.importorskip("nvidia.dali")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_images(tmp_path_factory.mktemp("rp") / "wds")


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
    loader.set_epoch(1)
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
    # an earlier test's loader, left to the collector, may still have its own (make test met one once)
    before = set(reading_processes())
    loader = make(source, "process", shuffle="none", stage_dir=tmp_path / "stage", stage_wait_timeout=300.0)
    (source / "shard-000002.tar").unlink()
    with pytest.raises(MissingShardError, match=r"shard-000002\.tar"):
        list(loader)
    assert set(reading_processes()) - before == set()  # gone with the error, not left waiting for the copy
    loader.close()


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
