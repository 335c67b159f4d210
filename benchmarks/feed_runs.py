"""What each row of ``benchmarks/feed.py`` runs, in a process of its own (``feed.py --run KIND DIR``,
under mpiexec with ``--ranks``): the Loader with a DALI graph that decodes nothing, DALI's own
webdataset reader with the same graph, the encoded stream alone, and the training steps they run
beside (Python holding the interpreter lock, launches letting go of it, a wait for the device);
each measured over its epochs after the first. ``feed.py`` says what each row shows."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ddpipe.bench.harness import median

# DALI's own pipeline (tar shards only; measured in this tree only: it runs no ddpipe), and the kind each of the
# Loader's is set against
DALI_KINDS = {"loader": "dali-wds", "loader-process": "dali-wds", "launches": "launches-dali-wds",
              "launches-process": "launches-dali-wds", "device": "device-dali-wds",
              "device-process": "device-dali-wds"}
# the kinds --ranks runs: the Loader's and DALI's own
LOADER_KINDS = {*DALI_KINDS, *DALI_KINDS.values()}
BATCH = 256
# a training step that holds the interpreter lock as a model's Python does (its forward and backward
# dispatched op by op): the Loader's threads get the lock back only when the step's thread lets go
STEP_S = 0.1
# a step of launches: this many calls that let go of the lock, a hash of LAUNCH_BYTES each (about 16 ms in
# all on the 2-core machine this was written on: about three times the Loader's time per batch there)
LAUNCHES, LAUNCH_BYTES = 4000, 8192
# a step that waits for its device: a quarter as many launches (the ops dispatched), then the wait for the
# device, the lock let go (about 34 ms in all on the 2-core machine: twice the Loader's time per batch there)
DEVICE_LAUNCHES, DEVICE_S = 1000, 0.030


def null_decoder() -> Any:
    """ddpipe's DALI decoder, its feed as the dali-gpu path runs it, with a graph that decodes nothing."""
    import torch

    from ddpipe.decode.dali import DaliDecoder
    from ddpipe.decode.spec import DecodeOptions

    class DecodesNothing(DaliDecoder):
        def _pipeline(self) -> Any:
            dali, feed = self.dali, self._feed
            fn, types = dali.fn, dali.types

            @dali.pipeline_def(batch_size=self.batch_size, num_threads=2, device_id=None, seed=0,
                               prefetch_queue_depth=2, exec_dynamic=True)
            def pipe():  # type: ignore[no-untyped-def]
                encoded, numbers = fn.external_source(source=feed, num_outputs=2, batch=True, cycle="raise",
                                                      no_copy=True, dtype=[types.UINT8, types.INT64])
                return fn.slice(encoded, 0, 16, axes=[0]), numbers[0:1]

            p = pipe()
            p.build()
            return p

    return DecodesNothing(DecodeOptions(), BATCH, torch.device("cpu"), gpu_decode=False, transform_in_dali=True)


class DaliOwnReader:
    """DALI's own pipeline over the same tar shards, as a DALI user would run it: its webdataset reader
    (shuffling at random as the Loader's local shuffle does, each rank its share of the shards),
    the same graph decoding nothing as :func:`null_decoder`'s, batches handed to torch by DALI's
    iterator. The host-side work a GPU run's reference (DALI's pipeline, gpu_train.py) does; it
    checks no checksum, where the Loader checks every shard."""

    def __init__(self, root: Path, rank: int, ranks: int) -> None:
        from nvidia.dali import fn, pipeline_def
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        tars = sorted(root.glob("*.tar"))

        @pipeline_def(batch_size=BATCH, num_threads=2, device_id=None, seed=0, prefetch_queue_depth=2,
                      exec_dynamic=True)
        def pipe():  # type: ignore[no-untyped-def]
            read = fn.readers.webdataset(paths=[str(t) for t in tars],
                                         index_paths=[str(t.with_suffix(".idx")) for t in tars], ext=["jpg"],
                                         random_shuffle=True, shard_id=rank, num_shards=ranks, name="r")
            encoded = read[0] if isinstance(read, list) else read
            return fn.slice(encoded, 0, 16, axes=[0])

        p = pipe()
        p.build()
        self._batches = DALIGenericIterator(p, ["images"], reader_name="r", last_batch_policy=LastBatchPolicy.PARTIAL,
                                            auto_reset=True, prepare_first_batch=False)

    def set_epoch(self, epoch: int) -> None:
        """Each pass is the reader's next epoch (its shuffle moves on by itself)."""

    def __iter__(self) -> Iterator[Any]:
        return (b[0]["images"] for b in self._batches)


def loader_decoding_nothing(root: Path, read_in: str = "thread", comm: Any = None, stage: Path | None = None,
                            shuffle: str | None = None) -> Any:
    """The Loader (every shard checked) with :func:`null_decoder` as its decoder: a local shuffle on
    one rank, on several a partial one (the default), exchanging samples with the others, unless
    ``shuffle`` says another; ``stage``: reading the copies it stages there (no capacity: each epoch
    after the first reads copies)."""
    import ddpipe

    extra: dict[str, Any] = {} if read_in == "thread" else {"read_in": read_in}  # not known to a reference before it
    if stage is not None:
        extra["stage_dir"] = stage
    shuffle = shuffle or ("local" if comm is None or comm.world.size == 1 else "partial")
    loader = ddpipe.Loader(root, BATCH, decoder="dali-cpu", device="cpu", shuffle=shuffle, comm=comm, **extra)
    loader.decoding._decoder = null_decoder()  # the stage's decoder, made before its first epoch
    return loader


def python_step(seconds: float) -> None:
    """``seconds`` of Python on this thread, holding the interpreter lock but for its switch interval."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def launch_step(launches: int = LAUNCHES) -> None:
    """A step of ``launches`` calls that let go of the interpreter lock (hashlib does, over 2 KB)."""
    data = bytes(LAUNCH_BYTES)
    for _ in range(launches):
        hashlib.sha256(data)


def device_step() -> None:
    """:data:`DEVICE_LAUNCHES` launches, then :data:`DEVICE_S` waiting for the device, the lock let go."""
    launch_step(DEVICE_LAUNCHES)
    time.sleep(DEVICE_S)


def beside_launches(make: Callable[[], Any], epochs: int, step: Callable[[], None] = launch_step) -> dict[str, float]:
    """The caller's time per batch (its step ``step``), waiting included, over its step's time alone, and the share of
    it spent waiting; each without each epoch's first batch, the median of the epochs after the first;
    the wait for that first batch (``first_ms``: an epoch's start, which its reading waits for); and
    the time per batch over the step's alone with that first batch in (``slowdown_all``).
    The step alone is timed before ``make()`` makes the loader: a loader starts work as it is made (a
    reading process, DALI's prefetching), which would slow the step timed alone."""
    t0 = time.perf_counter()
    for _ in range(20):
        step()
    alone = (time.perf_counter() - t0) / 20
    loader = make()
    slowed, stalls, firsts, slowed_all = [], [], [], []
    for e in range(epochs):
        loader.set_epoch(e)
        waits, steps, t = [], [], time.perf_counter()
        for _ in loader:
            t1 = time.perf_counter()
            waits.append(t1 - t)
            step()
            t = time.perf_counter()
            steps.append(t - t1)
        waited, stepped = sum(waits[1:]), sum(steps[1:])
        slowed.append((waited + stepped) / (len(steps) - 1) / alone)
        stalls.append(waited / (waited + stepped))
        firsts.append(1000 * waits[0])
        slowed_all.append((waited + waits[0] + stepped + steps[0]) / len(steps) / alone)
    return {"slowdown": median(slowed[1:]), "stall_steady": median(stalls[1:]), "first_ms": median(firsts[1:]),
            "slowdown_all": median(slowed_all[1:])}


def child(kind: str, root: Path, epochs: int, stage: Path | None, shuffle: str | None) -> dict[str, float] | None:
    """``kind``'s figures on ``root``: samples/s (``samples_s``), or for ``stall`` the fraction of the
    time spent waiting for batches (``stall``; ``stall_steady`` without each epoch's first batch), or
    for the launches :func:`beside_launches`'s; each the median of its epochs after the first. Under
    mpiexec, each rank measures its own, and rank 0 returns the slowest rank's (the job goes at its
    pace), the others None."""
    from ddpipe.comm import init_comm

    comm = init_comm()
    mine = measure(kind, root, epochs, comm, stage, shuffle)
    if comm.world.size == 1:
        return mine
    ranks = comm.allgather(mine)
    if comm.world.rank != 0:
        return None
    return {key: (min if key == "samples_s" else max)(r[key] for r in ranks) for key in mine}


def measure(kind: str, root: Path, epochs: int, comm: Any, stage: Path | None, shuffle: str | None) -> dict[str, float]:
    """:func:`child`'s figures on this rank (the Loader's kinds reading the copies staged in ``stage``, if given;
    the stream's and the Loader's shuffling as ``shuffle`` says, if given)."""
    import ddpipe
    from ddpipe.decode.batches import EncodedBatch

    def on_bad(index: int, sample: Any, reason: str) -> None:
        raise RuntimeError(f"sample {index}: {reason}")

    step = device_step if kind.startswith("device") else launch_step  # the step a kind "beside a step" runs
    if comm.world.size > 1 and kind not in LOADER_KINDS:
        raise SystemExit(f"--ranks measures the Loader's kinds, not {kind!r}")
    if kind == "stream":
        stream = ddpipe.EncodedStream(root, BATCH, shuffle=shuffle or "local", comm=comm)
        stream.views = True  # as the DALI decoders read it

        def epoch(e: int) -> int:
            stream.set_epoch(e)
            return sum(len(b.indices) for b in stream)
    elif kind == "memory":
        batches = [(b.indices, b.samples) for b in ddpipe.EncodedStream(root, BATCH, shuffle="local", comm=comm)]
        decoder = null_decoder()

        def epoch(e: int) -> int:
            encoded = (EncodedBatch.of(i, s, on_bad) for i, s in batches)
            return sum(len(labels) for _, labels in decoder.decode(encoded, 0, e, on_bad))
    elif kind == "stall":
        loader = loader_decoding_nothing(root, stage=stage, shuffle=shuffle)
        stalls, steady = [], []
        for e in range(epochs):
            loader.set_epoch(e)
            waits, t = [], time.perf_counter()
            for _ in loader:
                waits.append(time.perf_counter() - t)
                python_step(STEP_S)
                t = time.perf_counter()
            stepped = len(waits) * STEP_S
            stalls.append(sum(waits) / (sum(waits) + stepped))
            # an epoch here is a dozen batches, a training epoch thousands: its first batch's wait (the
            # pipeline reset, the first shard read) weighs hundreds of times more here than there
            steady.append(sum(waits[1:]) / (sum(waits[1:]) + stepped))
        return {"stall": median(stalls[1:]), "stall_steady": median(steady[1:])}
    elif kind in ("launches-dali-wds", "device-dali-wds"):
        return beside_launches(lambda: DaliOwnReader(root, comm.world.rank, comm.world.size), epochs, step)
    elif kind == "dali-wds":
        reader = DaliOwnReader(root, comm.world.rank, comm.world.size)

        def epoch(e: int) -> int:
            return sum(len(images) for images in reader)
    elif kind in ("launches", "launches-process", "device", "device-process"):
        read_in = "process" if kind.endswith("process") else "thread"
        return beside_launches(lambda: loader_decoding_nothing(root, read_in, comm, stage, shuffle), epochs, step)
    else:
        loader = loader_decoding_nothing(root, "process" if kind.endswith("process") else "thread", comm, stage,
                                         shuffle)

        def epoch(e: int) -> int:
            loader.set_epoch(e)
            return sum(len(labels) for _, labels in loader)

    rates, samples = [], 0
    for e in range(epochs):
        if e == 1:
            cpu0 = processor_seconds()
        t0 = time.perf_counter()
        n = epoch(e)
        rates.append(n / (time.perf_counter() - t0))
        samples += n if e else 0
    figures = {"samples_s": median(rates[1:])}
    if kind in ("loader", "loader-process", "dali-wds"):  # the step's own processor time would swamp the others'
        figures["cpu_us"] = (processor_seconds() - cpu0) / samples * 1e6
    return figures


def processor_seconds() -> float:
    """The processor time this process and its child processes (a reading process) have used so far,
    the children counted while they run."""
    t = os.times()
    total = t.user + t.system
    tick = os.sysconf("SC_CLK_TCK")
    for listing in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        try:
            children = listing.read_text().split()
        except OSError:  # a thread that ended since the listing
            continue
        for pid in children:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total
