"""The decode stage: an encoded stream's batches turned into ``(images, labels)`` on the training
device. Decoding is a pure function of each batch (its bytes, and the crops and flips that seed,
epoch and sample index fix), so it may run in this process, on the GPU, or on decode servers
(``DecodeOptions(service=...)``) with the same result; the decoders stay behind
:func:`ddpipe.decode.output.make_decoder`.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import weakref
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex

from .decode.batches import EncodedBatch
from .decode.spec import DecodeOptions
from .epoch_repeats import EpochRepeats
from .errors import bound_to_its_process
from .loader_stats import DecodeStats, ReadStats, SkippedSample
from .loop import HeldLoop, Loop
from .plan import EpochPlan
from .sample import KEY, Sample, SampleBatch
from .stream import EncodedStream, unreadable

if TYPE_CHECKING:  # torch loads only when something decodes
    import torch

    from .decode.output import Batch, Decoder
    from .epoch_ahead import EpochAhead
    from .read_process import ProcessReader
    from .service.client import ServiceStats


def make_decoder(kind: str, options: DecodeOptions, batch_size: int, device: torch.device) -> Decoder:
    """The decoder ``options`` ask for: the decode service's client, or one of this process."""
    if options.service:
        from .service.client import ServiceDecoder

        return ServiceDecoder(options, batch_size, device, kind)
    from .decode.output import make_decoder as here

    return here(kind, options, batch_size, device)


class DecodeStage:
    """Batches of ``(images, labels)`` from an :class:`~ddpipe.stream.EncodedStream`: images as a
    torch tensor on ``options.device`` (NCHW; float32, float16 or uint8), labels as int64.

    ``options.on_error="fail"`` stops at an image that does not decode, naming its key and shard;
    ``"skip"`` drops it and counts it in ``stats`` (:class:`DecodeStats`). Where either stage skips,
    each batch takes the next samples in place of those dropped, so batches keep the plan's sizes
    and every rank yields the same number (:mod:`ddpipe.decode.refill`); under the plan's
    ``pad=False`` batches shrink instead, and nothing is repeated.

    The state contract is the stream's, counting the batches that reached the caller rather than
    those the decoder has taken ahead."""

    def __init__(self, stream: EncodedStream, options: DecodeOptions | None = None) -> None:
        from .decode.output import resolve

        self.stream = stream
        options = options or DecodeOptions()
        if options.threads == 0:  # the node's cores, shared among the ranks on it
            options = dataclasses.replace(options, threads=stream.comm.world.cores_per_rank)
        self.decoder, self.device = resolve(options.decoder, options.device, stream.comm.world.local_rank,
                                            served=bool(options.service))
        read_in = "process" if options.reads_apart(self.decoder) else "thread"  # "auto" settled
        self.options = options = dataclasses.replace(options, read_in=read_in)
        # DALI reads each sample's bytes where they lie (no_copy) and keeps its batch until done with
        # it: samples read without an exchange reach it as views of their shard, not copies. On an H100
        # machine's 16 cores, reading with views ran at 34,200 samples/s against 20,400 copying each
        # ~130 KB JPEG out, and the dali-gpu loader went from 7,700 to 11,000 images/s (gpu.py --probe).
        # A decode service's client is the same: it hands each sample to ZeroMQ uncopied (copy=False)
        # and keeps the batch until a server answers, so the trainer's core copies no sample at all
        stream.views = self.decoder in ("dali-gpu", "dali-cpu") or bool(options.service)
        self.stats = DecodeStats()
        self._decoder: Decoder | None = None
        self._reader: ProcessReader | None = None  # read_in="process"
        self._ahead: EpochAhead | None = None  # the next epoch's first batches, read by threads (epoch_ahead.py)
        self._asked: int | None = None  # the last epoch asked for
        # the epochs delivered are this stage's to watch: the stream's own reads may be a copy's, or apart
        self.repeats = EpochRepeats("loader")
        stream.repeats.said_elsewhere = True
        self._loop: HeldLoop[Batch] = HeldLoop("loader")
        self._delivered = 0
        closing = weakref.WeakMethod(self.close)  # the job may end while this stage is alive
        stream.comm.at_end(lambda: (close := closing()) is not None and close())
        # a loop still held as the interpreter exits is ended before the exit handlers registered before
        # this one (they run last in, first out): left to the teardown, a reading process's epoch ended
        # in a traceback from the half-gone modules it was receiving with
        end_at_exit = functools.partial(_end_at_exit, weakref.ref(self))
        atexit.register(end_at_exit)
        weakref.finalize(self, atexit.unregister, end_at_exit).atexit = False
        if options.read_in == "process":
            # started now: its interpreter and imports (~0.4 s) pass while the caller builds its model, not
            # before the first batch. It issues no collective before an epoch's exchange rounds
            self._reader = self._reading_process()

    @property
    def service_stats(self) -> ServiceStats | None:
        """With ``DecodeOptions(service=...)``: what the decode servers and this process decoded, and
        where the time went; ``None`` otherwise, or before the first batch."""
        return getattr(self._decoder, "stats", None)

    def close(self) -> None:
        """Release the decoder (its DALI pipeline, threads or processes) and the reading process, if any;
        iterating again makes new ones. A loop still held is ended first (at exit too: left to the
        interpreter's teardown, its reading process's epoch ended in a traceback)."""
        self._loop.end("the loader's close()")
        if self._decoder is not None:
            self._decoder.close()
            self._decoder = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def __enter__(self) -> DecodeStage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)
        self._delivered = 0
        self.repeats.reset()

    def plan(self) -> EpochPlan:
        return self.stream.plan()

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        bound_to_its_process(self)

    def __len__(self) -> int:
        return len(self.stream)

    @property
    def skipping(self) -> bool:
        """Whether a batch may lose samples on the way (either stage skips), to be refilled."""
        return self.options.on_error == "skip" or self.stream.read_options.on_error == "skip"

    def __iter__(self) -> Loop[Batch]:
        """This epoch's batches. One loop at a time (loop.py): a later ``iter()`` ends the loop before it."""
        self._loop.end_before()
        self.repeats.starting(self.stream.epoch, self.stream.options.shuffle)
        return self._loop.start(self._epoch_batches())

    def _epoch_batches(self) -> Generator[Batch, None, None]:
        from .decode.refill import refilled

        plan = self.stream.plan()
        self._delivered = 0
        self.stats = DecodeStats()
        here = self.options.read_in != "process"
        # reading starts first (EncodedStream.__iter__): making the decoder (DALI's import and pipeline) overlaps it
        batches: Generator[Any, None, None] = self._read_here() if here else self._read_apart()
        decoded: Iterator[Batch] = iter(())
        try:
            if self._decoder is None:  # one for every epoch: its pipeline, pools and buffers stay
                self._decoder = make_decoder(self.decoder, self.options, plan.options.batch_size, self.device)
            classes = len(self.stream.dataset.classes)
            required = self.options.require_labels
            encoded = (EncodedBatch.of(b.indices, b.samples, self._on_bad, classes, labels_required=required)
                       for b in batches) if here else batches
            decoded = self._decoder.decode(encoded, self.stream.seed, self.stream.epoch, self._on_bad)
            if self.skipping and plan.options.pad:  # batches keep their size (pad=False: they shrink, nothing repeated)
                rank = self.stream.rank
                decoded = refilled(decoded, [len(plan.batch(rank, b)) for b in range(plan.num_batches)], self.stats)
            for batch in decoded:
                self._delivered += 1  # what the caller has received, not what decoding took ahead
                yield batch
            self.repeats.finished(self.stream.epoch)
        finally:  # left early: the decoder lets go of its batches (and stops any thread reading them),
            # then the stream stops its producer, now rather than when collected
            close = getattr(decoded, "close", None)
            if close is not None:
                close()
            batches.close()

    def _read_here(self) -> Generator[SampleBatch, None, None]:
        """The epoch's batches read by threads, from now on: those read ahead, if they are this epoch's;
        then, the epoch read whole, the next one's first batches read ahead (epoch_ahead.py)."""
        seed, epoch, pending = self.stream.position()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and not ahead.serves(seed, epoch, pending):
            ahead.close()
            ahead = None
        previous, self._asked = self._asked, epoch
        batches = ahead if ahead is not None else iter(self.stream)
        return self._read_then_ahead(batches, ahead, seed, (previous, epoch))

    def _read_then_ahead(self, batches: EpochAhead | Loop[SampleBatch], ahead: EpochAhead | None,
                         seed: int, asked: tuple[int | None, int]) -> Generator[SampleBatch, None, None]:
        from .epoch_ahead import EpochAhead, likely_next, may_read_ahead

        if ahead is not None:  # the copy that reads them counts them
            self.stream.stats = ahead.stream.stats
        try:
            yield from batches
        finally:
            batches.close()
            if ahead is not None:  # its figures object, made as it started reading
                self.stream.stats = ahead.stream.stats
        stream, following = self.stream, likely_next(*asked)
        if may_read_ahead(stream.options, stream.comm.world.size, stream.stager is not None):
            self._ahead = EpochAhead(stream, seed, following)
        else:  # its plan at least: no collective in it
            stream.plan_ahead(following)

    def _read_apart(self) -> Generator[EncodedBatch, None, None]:
        """The epoch's batches from the reading process (read_process.py), prepared for DALI."""
        if self._reader is None:  # closed since: another
            self._reader = self._reading_process()
        self.stream.stats = ReadStats()  # the reading process's, once it has read the epoch whole
        stager = self.stream.stager
        if stager is not None:  # this process copies the node's shards (local rank 0), the reading process reads
            self.stream.start_staging(self.stream.plan())
        previous, self._asked = self._asked, self.stream.epoch
        self.stream.stats = yield from self._reader.epoch(*self.stream.position(), self.stats.skip, stager)
        if stager is not None:  # as a stream read by threads does: its figures final, its errors raised
            stager.wait()
        # the reading process reads the next epoch ahead, or plans it; this process needs its plan too
        from .epoch_ahead import likely_next

        self.stream.plan_ahead(likely_next(previous, self.stream.epoch))

    def _reading_process(self) -> ProcessReader:
        from .read_process import ProcessReader, check_can_read_apart, spec_of

        check_can_read_apart(self.options, self.decoder)
        reader = ProcessReader(*spec_of(self.stream, self.options), self.stream.comm)
        reader.start()
        return reader

    def _on_bad(self, index: int, sample: Sample, reason: str) -> None:
        if self.options.on_error == "fail":
            raise unreadable(self.stream, index, sample, reason)
        self.stats.skip(SkippedSample(str(sample.get(KEY)), self.stream.source_of(index), reason))

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_at(self._delivered)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)
        self._delivered = 0
        self.repeats.reset()


def _end_at_exit(stage: weakref.ref[DecodeStage]) -> None:
    held = stage()
    if held is not None:
        held._loop.end("the interpreter's exit")
