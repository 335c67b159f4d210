"""Decoding with NVIDIA DALI: ``mixed`` (GPU JPEG decoding) where CUDA is present, ``cpu`` otherwise.

The pipeline is fed by ``fn.external_source`` with this rank's encoded batches (after exchange and
local shuffle) and each sample's crop window (chosen in augment.py from the seed, the epoch and the
sample), decodes only that region, resizes, flips and normalises, and hands back torch tensors on
the training device. On the CPU the resizing is torch's (resample.py). DALI runs a few batches
ahead (its prefetch queue) while the caller trains on the current one, and one pipeline serves
every epoch that runs to its end (reset for the next).

A corrupt image stops a DALI pipeline without saying which sample it was. The decoder keeps the
batches DALI has taken but not returned; on an error it finds the bad samples of the failing batch
(a full PIL decode of each), reports them through ``on_bad``, and rebuilds the pipeline fed with
the rest of that batch, then the batches that were in flight, then the stream.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.dlpack

from ..errors import DdpipeError
from ..handoff import Ahead
from .batches import EncodedBatch, KnownSizes, OnBad, checked_headers, with_crops
from .resample import Resampler
from .ring import TORCH_DTYPES
from .spec import DecodeOptions, decode_check


def _import_dali() -> Any:
    try:
        import nvidia.dali as dali
    except ImportError as e:
        raise DdpipeError("decode='dali-*' needs NVIDIA DALI: pip install 'ddpipe[dali]' (or use decode='pil')") from e
    return dali


class _Feed:
    """The external source: encoded batches in, each remembered until its output comes back.

    DALI calls a source on the thread that runs the pipeline (on the GPU path a thread of the
    decoder's, :class:`DaliDecoder`). On the GPU path (``gpu``: DALI flips too) the work on each
    batch (reading its headers, choosing its crops, the columns DALI reads) is done ahead, on a
    thread of its own (``ddpipe-feed``), and the call only takes a prepared batch; the thread also
    starts the epoch's reading while the pipeline is being built. On the CPU path the cores decoding
    are the bottleneck: there the thread measured no faster (docs/performance-notes.md) and only
    contends with them, so the call prepares its batch itself. (DALI's ``parallel=True`` sources run
    per-sample callbacks in worker processes: the samples here are views of this process's shard
    mappings and exchange buffers, which they cannot see.)

    A batch's samples whose header cannot be read are reported through ``on_bad`` first. An error
    on the way in (``on_error="fail"``, a damaged shard) ends the feed: the batches before it come
    out, then the decoder raises it as it was, not wrapped in DALI's own."""

    AHEAD = 2  # batches prepared ahead of DALI's prefetch queue: enough to hide one slow batch

    def __init__(self, options: DecodeOptions, gpu: bool, dali: Any) -> None:
        self.dali = dali  # the module: each batch is wrapped in its tensor types
        self.options = options
        self.gpu = gpu
        self.inflight: deque[EncodedBatch] = deque()
        self.error: BaseException | None = None
        self._batches: Ahead[EncodedBatch] | Generator[EncodedBatch, None, None] | None = None
        self._front: deque[EncodedBatch] = deque()  # fed again before the rest, after a failed pipeline
        self._seed = self._epoch = 0
        self._on_bad: OnBad | None = None
        self._sizes = KnownSizes()  # each image's, read once for every epoch

    def attach(self, batches: Iterator[EncodedBatch], seed: int, epoch: int, on_bad: OnBad) -> None:
        """Feed ``batches`` from now on (preparing them ahead starts now)."""
        self.detach()
        self._seed, self._epoch, self._on_bad = seed, epoch, on_bad
        self.inflight.clear()
        self._front.clear()
        self.error = None
        prepared = (self._prepared(b) for b in batches)
        self._batches = Ahead(prepared, self.AHEAD, "ddpipe-feed") if self.gpu else prepared

    def detach(self) -> None:
        """Stop preparing (after the batch being prepared ahead): the batches are the caller's again."""
        if self._batches is not None:
            self._batches.close()
            self._batches = None

    def requeue(self, batches: list[EncodedBatch]) -> None:
        """Feed ``batches`` again before the rest (to a new pipeline, after a failed one)."""
        self._front = deque(self._prepared(b) for b in batches)
        self.inflight.clear()

    def _prepared(self, batch: EncodedBatch) -> EncodedBatch:
        """``batch`` less its unreadable samples, with its crops, and the arrays DALI reads."""
        if not batch.datas:
            return batch
        if not batch.checked:  # else the reading process did it
            batch = with_crops(batch, self._seed, self._epoch, self.options, self._on_bad, self._sizes) \
                if self.options.train else checked_headers(batch, self.options, self._on_bad, self._sizes)[0]
        if not batch.datas:
            return batch
        # one array of each sample's numbers (label, then its crop window and flip): DALI gives each
        # external source output a worker thread of its own, idle between batches
        columns = [np.asarray(batch.labels, dtype=np.int64)]
        if self.options.train:
            c = batch.crops
            assert c is not None
            columns += [c.left, c.top, c.width, c.height] + ([c.flip] if self.gpu else [])
        numbers = np.stack([np.asarray(col, dtype=np.int64) for col in columns], axis=1)
        # wrapped here, on the thread that prepares batches, not per sample by DALI's own Python on the
        # thread that runs the pipeline (the training loop's), and straight from each sample's buffer,
        # without a numpy array between (half the cost): zero-copy either way. DALI reads the bytes in
        # place (no_copy): they stay with the batch (its datas), in flight until its output is out
        tensors = self.dali.tensors
        encoded = tensors.TensorListCPU([tensors.TensorCPU(d) for d in batch.datas], None, False)
        batch.fed = encoded, tensors.TensorListCPU(numbers)
        return batch

    def __iter__(self) -> _Feed:
        return self

    def _next_batch(self) -> EncodedBatch:
        if self.error is not None:
            raise StopIteration
        if self._front:
            return self._front.popleft()
        try:
            assert self._batches is not None, "attach() first"
            return next(self._batches)
        except StopIteration:
            raise
        except Exception as e:  # a bad sample or shard: raised by the decoder after the batches before it
            self.error = e
            raise StopIteration from e

    def __next__(self) -> tuple[Any, ...]:
        batch = self._next_batch()
        while not batch.datas:  # every sample of it was skipped: it still counts as a batch
            self.inflight.append(batch)
            batch = self._next_batch()
        self.inflight.append(batch)
        assert isinstance(batch.fed, tuple)
        return batch.fed


class DaliDecoder:
    """``gpu_decode``: DALI's ``mixed`` decoder, and DALI's resize, flip and normalisation after it.
    ``transform_in_dali`` (default: the same as ``gpu_decode``) runs that same transform graph, fed
    the same way (batches prepared ahead, :class:`_Feed`), on DALI's CPU operators after a CPU
    decode, so that the GPU path is tested without a GPU.

    DALI is run by a thread of its own (``ddpipe-dali``), one batch ahead of the caller: each batch's
    Python on its way (the feed's call, DALI's own, the hand-over to torch, the batch's release) then
    runs while the training thread waits for its device, not between two of its steps. A step with AMP
    ends waiting for the GPU (GradScaler reads whether a gradient overflowed), and what the decoder
    then did on the training thread, the GPU waited for: ResNet-50 fed read apart on an H200 (887db6d,
    results/gpu-train.json) waited a median 3.1 ms a step with DALI on the training thread, under
    0.1 ms with it on this one. On the CPU path the thread also runs the Resampler after DALI: on the
    caller's thread, the crops of the next batch waited, resized by no one, through each step
    (benchmarks/overlap.py)."""

    # batches DALI runs ahead of the caller (its prefetch queue). On an H200 the graph alone ran faster
    # at 3 than at 2 in one probe and slower in the next (results/gpu-probe.log), within the spread of
    # its runs; 1 was much slower in both. 2 is kept, using less device memory
    QUEUE_DEPTH = 2
    # DALI run by a thread of its own (above). The GPU benchmark turns it off in a process of its own to
    # measure, in the same run, the training thread running DALI (before 53639df)
    RUN_AHEAD = True

    def __init__(self, options: DecodeOptions, batch_size: int, device: torch.device, gpu_decode: bool,
                 transform_in_dali: bool | None = None) -> None:
        self.dali = _import_dali()
        self.options = options
        self.batch_size = batch_size
        self.device = device
        self.gpu_decode = gpu_decode
        self.transform_in_dali = gpu_decode if transform_in_dali is None else transform_in_dali
        if gpu_decode and device.type != "cuda":
            raise DdpipeError("decode='dali-gpu' needs a CUDA device")
        self._resampler = None if self.transform_in_dali else Resampler(options, options.workers, device)
        self._feed = _Feed(options, gpu=self.transform_in_dali, dali=self.dali)
        self._pipe: Any = None  # the epoch's pipeline
        self._reusable = False  # the last epoch ran to its end: its pipeline can serve the next

    @property
    def _prefetch_depth(self) -> int:
        """Batches a new or reset pipeline runs at once. Where the Resampler follows DALI, one: the rest of
        the queue (:meth:`_run`) only once that batch is resampled. Run together, decoding the second batch
        took half the cores from resampling the first: a warm epoch's first 256 images came in 0.31-0.42 s
        so, and in 0.22-0.27 s now, on 2 cores. (The dynamic executor queues any number of runs.)"""
        return 1 if self._resampler is not None else self.QUEUE_DEPTH

    def close(self) -> None:
        self._feed.detach()
        self._pipe = None
        if self._resampler is not None:
            self._resampler.close()

    def _pipeline(self) -> Any:
        dali, o, feed = self.dali, self.options, self._feed
        fn, types = dali.fn, dali.types
        out_dtype = {"float32": types.FLOAT, "float16": types.FLOAT16, "uint8": types.UINT8}[o.dtype]
        device_id = (self.device.index or 0) if self.gpu_decode else None
        where = "mixed" if self.gpu_decode else "cpu"

        # the dynamic executor keeps an output alive while anything refers to it, so outputs are handed
        # to torch without a copy (a copy of each float32 batch cost 14% of CPU decoding throughput)
        @dali.pipeline_def(batch_size=self.batch_size, num_threads=o.workers, device_id=device_id, seed=0,
                           prefetch_queue_depth=self._prefetch_depth, exec_dynamic=True)
        def pipe():  # type: ignore[no-untyped-def]
            # no_copy: DALI reads the encoded bytes where they are (the shard's mapping, the exchange's
            # landing zone), kept alive with their batch (_Feed); copying each batch in cost the calling
            # thread a quarter of what feeding a graph that decodes nothing costs (12,300-12,900 against
            # 16,500-17,100 images/s on one core)
            encoded, numbers = fn.external_source(source=feed, num_outputs=2, batch=True, cycle="raise",
                                                  no_copy=True, dtype=[types.UINT8, types.INT64])
            labels = numbers[0:1]
            if o.train:  # decode only the crop window, as EXIF-blind as the window's choice
                window = fn.cast(numbers[1:5], dtype=types.INT32)  # left, top, width, height
                images = fn.decoders.image_slice(encoded, device=where, output_type=types.RGB, start=window[0:2],
                                                 shape=window[2:4], axis_names="WH", adjust_orientation=False)
            else:
                images = fn.decoders.image(encoded, device=where, output_type=types.RGB, adjust_orientation=False)
            if not self.transform_in_dali:  # the Resampler resizes, flips and normalises (see resample.py)
                return images, labels
            if o.train:
                images = fn.resize(images, resize_x=o.size, resize_y=o.size, antialias=o.antialias)
                mirror, crop = fn.cast(numbers[5], dtype=types.INT32), None
            else:
                images = fn.resize(images, resize_shorter=o.resize_shorter, antialias=o.antialias)
                mirror, crop = 0, (o.size, o.size)
            # uint8 output leaves normalisation to the training device; DALI's mean and std are in pixels
            norm = {} if o.dtype == "uint8" else {"mean": [m * 255 for m in o.mean], "std": [s * 255 for s in o.std]}
            layout = "HWC" if o.channels_last else "CHW"
            # truncate: the centre crop's corner as the Resampler and the PIL workers place it (DALI's default
            # rounding put it one pixel off for odd margins: 3% of the range apart on the device, 0.2% now)
            images = fn.crop_mirror_normalize(images, dtype=out_dtype, output_layout=layout, crop=crop,
                                              mirror=mirror, rounding="truncate", **norm)
            if self.gpu_decode:
                # on the device from DALI, in DALI's stream order: a copy of CPU labels from pageable memory
                # waits for everything queued on the stream first (CUDA's rule), the last training step too
                labels = labels.gpu()
            return images, labels

        p = pipe()
        p.build()
        return p

    def _to_torch(self, images: Any, labels: Any, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        with self.device:
            target = torch.utils.dlpack.from_dlpack(labels.as_tensor()).reshape(-1)
        if self._resampler is not None:  # into pinned memory, bound for a CUDA device
            flips = batch.crops.flip if batch.crops is not None else np.zeros(len(images), dtype=bool)
            out = self._resampler([np.asarray(images[i]) for i in range(len(images))], flips)
            return out, self._resampler.ring.labels_out(target)
        with self.device:
            out = torch.utils.dlpack.from_dlpack(images.as_tensor())
        if self.options.channels_last:
            out = out.permute(0, 3, 1, 2)  # NCHW shape with NHWC memory: torch's channels_last
        # on the GPU, DALI's outputs are on the device already; only the tests' CPU transform moves
        return out.to(self.device, non_blocking=True), target.to(self.device, non_blocking=True)

    def _empty(self) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.options.size
        shape = (0, s, s, 3) if self.options.channels_last else (0, 3, s, s)
        images = torch.empty(shape, dtype=TORCH_DTYPES[self.options.dtype], device=self.device)
        if self.options.channels_last:
            images = images.permute(0, 3, 1, 2)
        return images, torch.empty(0, dtype=torch.int64, device=self.device)

    def decode(self, batches: Iterator[EncodedBatch], seed: int, epoch: int,
               on_bad: OnBad) -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
        """This epoch's batches, decoded. Crops and flips follow (seed, epoch, sample)."""
        reuse, self._reusable = self._pipe is not None and self._reusable, False
        # the feed starts preparing the epoch's first batches (and its reading) while the pipeline is made
        self._feed.attach(batches, seed, epoch, on_bad)
        try:
            # one pipeline for every epoch that ends: on an H100, while each epoch built its own (its decoders,
            # the hardware decoder, buffers grown over its first batches), an 8,000-image epoch took ~2.5 s
            # more than its decoding at DALI's own rate (gpu.py --probe times a first epoch against later
            # ones); on the CPU a reset one now keeps no more memory than a new one (benchmarks/soak.py)
            if reuse:
                self._pipe.reset()  # the source is iterated afresh: this epoch's batches
            else:
                self._pipe = None
                self._pipe = self._pipeline()
            if self.RUN_AHEAD:
                yield from self._run_ahead(on_bad)
            else:
                yield from self._run(on_bad)
            self._reusable = True
        finally:
            self._feed.detach()  # before the caller closes the batches the feed's thread was reading
            if not self._reusable:  # left mid-epoch or failed: what DALI prefetched belongs to no later epoch
                self._pipe = None

    def _run_ahead(self, on_bad: OnBad) -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
        """:meth:`_run` on the ``ddpipe-dali`` thread, one batch ahead of the caller. Its tensors are handed to
        torch on the caller's current CUDA stream (the stream that waits for DALI's work is named there),
        not the thread's own default one."""
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        run = self._run(on_bad, stream)
        ahead = Ahead(run, 1, "ddpipe-dali")
        try:
            yield from ahead
        finally:
            ahead.close()  # after the batch being run: DALI is then this thread's again
            run.close()

    def _run(self, on_bad: OnBad,
             stream: torch.cuda.Stream | None = None) -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
        if stream is not None:
            torch.cuda.set_stream(stream)
        feed, inflight = self._feed, self._feed.inflight
        held_back = self.QUEUE_DEPTH - self._prefetch_depth  # runs a new pipeline's first batch holds back
        deferred = held_back
        while True:
            try:
                # run() is these two; apart, the deferred runs can be scheduled after the first batch's resampling
                self._pipe.schedule_run()
                images, labels = self._pipe.outputs()
            except StopIteration:
                while inflight:  # trailing batches whose samples were all skipped
                    _done(inflight.popleft())
                    yield self._empty()
                if feed.error is not None:
                    raise feed.error from None
                return
            except RuntimeError as e:
                while inflight and not inflight[0].datas:
                    _done(inflight.popleft())
                    yield self._empty()
                if not inflight:
                    raise
                failing = inflight.popleft()
                bad = _find_bad(failing, str(e), on_bad)
                rest = [failing.without(bad), *inflight]
                # a pipeline that has failed is not run again: a new one takes over from the failing batch
                feed.requeue(rest)
                self._pipe = self._pipeline()
                deferred = held_back
                continue
            while inflight and not inflight[0].datas:
                _done(inflight.popleft())
                yield self._empty()
            batch = inflight.popleft()
            out = self._to_torch(images, labels, batch)
            _done(batch)  # DALI has read its bytes: its outputs are out
            for _ in range(deferred):
                self._pipe.schedule_run()
            deferred = 0
            yield out


def _done(batch: EncodedBatch) -> None:
    if batch.release is not None:
        batch.release()


def _find_bad(batch: EncodedBatch, dali_error: str, on_bad: OnBad) -> set[int]:
    """The samples of a batch that DALI failed on, found by decoding each fully with PIL."""
    bad: set[int] = set()
    for g, sample, data in zip(batch.indices, batch.samples, batch.datas, strict=True):
        try:
            decode_check(data)
        except (OSError, ValueError, SyntaxError) as e:
            on_bad(g, sample, f"does not decode: {e}")
            bad.add(g)
    if not bad:
        first = dali_error.strip().splitlines()[-1] if dali_error.strip() else dali_error
        raise DdpipeError(f"DALI failed on a batch whose images all decode with PIL ({first}); "
                          f"keys: {[s['__key__'] for s in batch.samples][:8]}")
    return bad
