"""The encoded stream: this rank's batches of encoded samples, in the plan's order, with the plan's
decisions. Which bytes, in which order, on this rank; turning them into tensors is the decode
stage's (:mod:`ddpipe.decoding`).

Stages, each behind a bounded queue: a producer thread reads this rank's samples (sequential scans,
or random access for ``global``) and, for ``partial``, exchanges a fraction of them with the other
ranks round by round; the consumer (the caller's thread) puts them in the plan's yield order. The
plan already fixes that order (the shuffle buffer is simulated on indices), so the consumer only
holds samples that arrived before their turn: at most about one buffer plus one round.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
import weakref
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex

import numpy as np

from .comm import Comm, init_comm
from .dataset import Dataset, dataset_at
from .epoch_repeats import EpochRepeats
from .errors import (
    CorruptShardError,
    DdpipeError,
    DigestMismatchError,
    NoBatchWarning,
    OptionError,
    SampleError,
    bound_to_its_process,
)
from .fields import seed_option, whole_option
from .handoff import Ahead
from .loader_stats import ReadStats, SkippedSample
from .loop import HeldLoop, Loop
from .options import STREAM_STAGES, ReadOptions, apply_keywords
from .plan import EpochPlan, PlanOptions, plan_epoch
from .producer import Producer, Stopper, stop_now
from .rank_agreement import RankView, check_ranks_agree
from .reading import read_samples
from .reorder import batches_in_order
from .resume import epoch_state, remaining
from .sample import BAD, KEY, Sample, SampleBatch
from .shufflers import get_shuffler
from .staging import NodeStager, StageOptions
from .staging.order import node_shard_order
from .throttle import SourceLimits

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .options import StreamKeywords


class EncodedStream:
    """Batches of this rank's encoded samples, the same number on every rank, as :class:`SampleBatch`.

    ``path`` may be a directory, ``s3://bucket/prefix`` or ``http(s)://host/prefix`` (see
    :func:`ddpipe.open_dataset`, which takes the store's options), or a :class:`Dataset`. Options:
    ``plan`` (:class:`ddpipe.PlanOptions`), ``read`` (:class:`ReadOptions`), ``stage``
    (:class:`ddpipe.StageOptions`: node-local staging), or their fields as keywords
    (:mod:`ddpipe.options`), which win over the objects'.

    Call :meth:`set_epoch` before each epoch (a shuffled epoch begun again without it is said, once:
    :class:`~ddpipe.errors.RepeatedEpochWarning`); :meth:`state_dict` mid-epoch and
    :meth:`load_state_dict` in a fresh stream (any world size) continue with exactly the samples not
    yet yielded. ``stats`` (:class:`ReadStats`) is the epoch's.

    What constructing one asks of the other ranks, and why: without ``comm``, it calls
    :func:`ddpipe.init_comm` (the job's world: MPI's own set-up, under MPI); with staging on more
    than one rank, one ``allgather`` of each rank's staging directory (the ranks of a node must share
    one, or they would wait on each other's copies: refused on every rank at once), one of whether
    another job's staging there refuses this one (staging/job_lock.py), with a capacity on several
    nodes two of whether they share a directory (staging/shared_dir.py), and on several nodes one
    communicator duplicated for the peers' copies. Nothing else: each epoch's collectives happen
    while it is iterated.
    """

    def __init__(self, path: str | os.PathLike[str] | Dataset, batch_size: int | None = None, *,
                 plan: PlanOptions | None = None, read: ReadOptions | None = None, stage: StageOptions | None = None,
                 seed: int = 0, comm: Comm | None = None, **keywords: Unpack[StreamKeywords]) -> None:
        size: dict[str, Any] = {} if batch_size is None else {"batch_size": batch_size}
        options = apply_keywords({PlanOptions: plan, ReadOptions: read, StageOptions: stage}, {**keywords, **size},
                                 STREAM_STAGES, type(self).__name__)
        if comm is not None and not isinstance(comm, Comm):  # mpi4py's COMM_WORLD, say: AttributeError 'channel'
            raise OptionError(f"comm must be a ddpipe Comm (ddpipe.init_comm(), which under MPI spans COMM_WORLD), "
                              f"not {type(comm).__module__}.{type(comm).__qualname__}")
        self.options: PlanOptions = options[PlanOptions] or PlanOptions()
        self.read_options: ReadOptions = options[ReadOptions] or ReadOptions()
        if isinstance(path, Dataset):
            self.dataset: Dataset = path
        else:  # skipping damaged shards: one of another size is dropped as it is read, not refused here
            self.dataset = dataset_at(path)
            self.dataset.check_files(corrupt_ok=self.read_options.on_error == "skip")
        if len(self.dataset) == 0:
            raise DdpipeError("the dataset holds no samples: nothing to load", path=self.dataset.where)
        self.seed = seed_option(seed)
        # the stream's threads issue its collectives on a channel of its own, apart from the caller's
        self.comm = comm.channel() if comm is not None else init_comm()
        self.epoch = 0
        self.stats = ReadStats()
        #: samples may reach the consumer as views (of their shard's mapping, or of the exchange round's
        #: receive buffer) rather than bytes of their own: for a consumer that keeps each batch until it
        #: is done with it (the decode stage sets it for DALI)
        self.views = False
        # the samples this epoch plans over: None for all, or what a resumed epoch had left; it changes
        # only with set_epoch, so iterating again repeats the same stream and a state taken after the
        # last batch resumes to nothing
        self._pending: np.ndarray | None = None
        self._batches_done = 0
        self._plan: EpochPlan | None = None
        self._planned_ahead: tuple[tuple[int, int], Ahead[EpochPlan]] | None = None  # (seed, epoch), its plan
        self._finished_an_epoch = False
        self._said_no_batch = False  # NoBatchWarning, once
        self.repeats = EpochRepeats("stream")  # a shuffled epoch begun again without set_epoch: said
        self._loop: HeldLoop[SampleBatch] = HeldLoop("stream")
        limits = self.read_options.source_limits
        if limits is not None and limits.bandwidth and self.comm.world.local_size > 1:
            # the modelled link is the node's: ranks reading the source directly share it
            limits = SourceLimits(limits.bandwidth / self.comm.world.local_size, limits.latency)
        self._source_limits = limits
        stage = options[StageOptions]
        if stage is not None:  # the job names one local directory; each node resolves it to its own
            stage = stage.on_node(self.comm.world.node, self.comm.world.host, self.comm.environ,
                                  self.read_options.source_limits)
        manifest, world = self.dataset.manifest, self.comm.world
        check_ranks_agree(self.comm, RankView(world.node, world.host, manifest.content_id, manifest.num_samples,
                                              len(manifest.shards), self.options, self.seed,
                                              str(Path(stage.stage_dir).resolve()) if stage is not None else None),
                          self.dataset.where)
        self.stager = self._stager(stage)

    def _stager(self, stage: StageOptions | None) -> NodeStager | None:
        if stage is None:
            return None
        if stage.capacity is not None and get_shuffler(self.options.shuffle).random_access:
            raise DdpipeError("a staging capacity needs sequential reading: use shuffle='partial' or 'local' "
                              "with stage_capacity, or stage the whole share (no capacity) for 'global'")
        return NodeStager(self.dataset, stage, self.comm)

    @property
    def rank(self) -> int:
        return self.comm.world.rank

    def set_epoch(self, epoch: int) -> None:
        epoch = whole_option(epoch, "epoch", least=0)
        if epoch != self.epoch:
            self._pending = None
        self.epoch = epoch
        self._batches_done = 0
        self._plan = None
        self.repeats.reset()

    def position(self) -> tuple[int, int, np.ndarray | None]:
        """(seed, epoch, the samples it plans over: None for all): what :meth:`go_to` takes."""
        return self.seed, self.epoch, self._pending

    def go_to(self, seed: int, epoch: int, pending: np.ndarray | None) -> None:
        """Stand where another stream's :meth:`position` says (a reading process follows its parent)."""
        self.seed, self.epoch, self._pending = seed, epoch, pending
        self._batches_done = 0
        self._plan = None
        self.repeats.reset()

    def __copy__(self) -> EncodedStream:
        """A stream on the same dataset and comm, to stand at an epoch of its own (epoch_ahead.py); a plan
        being made ahead stays this one's."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other._planned_ahead = None
        other._loop = HeldLoop("stream")  # its loops are its own
        other.repeats = EpochRepeats("stream", said_elsewhere=True)  # placed by go_to: its caller watches
        return other

    def plan(self) -> EpochPlan:
        """This epoch's plan (the same on every rank)."""
        if self._plan is None:
            # another epoch's plan made ahead is let go of, not waited for: its thread ends once it is made
            ahead, self._planned_ahead = self._planned_ahead, None
            if ahead is not None and ahead[0] == (self.seed, self.epoch) and self._pending is None:
                self._plan = next(ahead[1])
            else:
                self._plan = self._planned(self.seed, self.epoch, self._pending)
            if self._plan.num_batches == 0 and self._pending is None and not self._said_no_batch:
                self._said_no_batch = True
                warnings.warn(self._no_batch(), NoBatchWarning, stacklevel=3)
        return self._plan

    def _no_batch(self) -> str:
        """Why a whole epoch yields no batch on this rank: what the caller can change."""
        n, size = len(self.dataset), self.comm.world.size
        share, batch = n // size, self.options.batch_size
        if n == 0:
            return f"{self.dataset.where}: the dataset holds no samples, so an epoch has no batch"
        return (f"{self.dataset.where}: batch_size {batch} is more than a rank's share of the dataset ({share} of "
                f"{n} samples on {size} rank(s)) and drop_last is set, so an epoch has no batch: use a smaller "
                "batch size or fewer ranks")

    def plan_ahead(self, epoch: int) -> None:
        """Start making the plan of ``epoch`` (this seed, every sample) on a thread of its own, for
        :meth:`plan` to take when that epoch is asked for. At ImageNet scale a plan takes 0.06-0.16 s
        on one core (benchmarks/plan_time.py), which every epoch's first batch would otherwise wait for
        on every rank; it is pure, so it may be made while the last epoch's batches are decoded."""
        seed = self.seed  # one made ahead already, for another epoch, is let go of (see plan())
        one = (self._planned(seed, epoch, None) for _ in range(1))
        self._planned_ahead = (seed, epoch), Ahead(one, 1, "ddpipe-plan-ahead")

    def _planned(self, seed: int, epoch: int, pending: np.ndarray | None) -> EpochPlan:
        return plan_epoch(self.dataset.manifest, self.comm.world.size, seed, epoch, self.options, pending)

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        bound_to_its_process(self)

    def close(self) -> None:
        """End the loop held (its next ``next()`` says so) and stop staging: a copy under way is given up
        at its next chunk, and removed. Iterating again starts both afresh."""
        self._loop.end("the stream's close()")
        if self.stager is not None:
            self.stager.close()

    def __enter__(self) -> EncodedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        """Batches this epoch yields (what is left of it, after :meth:`load_state_dict`)."""
        return self.plan().num_batches

    @property
    def batches_per_epoch(self) -> int:
        """Batches a whole epoch yields on this many ranks, resumed or not: what learning-rate
        schedules count in (``len()`` counts what is left of a resumed epoch)."""
        if self._pending is None:
            return len(self)
        return plan_epoch(self.dataset.manifest, self.comm.world.size, self.seed, self.epoch, self.options).num_batches

    def source_of(self, index: int) -> str:
        """The shard (file or object) that sample ``index`` comes from, as messages name it."""
        shard, _ = self.dataset.locate(np.array([index]))
        return self.dataset.source_name(self.dataset.shard_path(int(shard[0])))

    def __iter__(self) -> Loop[SampleBatch]:
        """This epoch's batches. Reading starts here, not at the first ``next()``: what the caller does
        before it takes the first batch (importing DALI and building its pipeline, ~0.5 s) overlaps
        reading it from a cold disk (~0.4 s for 2 ranks' first batches on 2 cores). One loop at a
        time (loop.py): a later ``iter()`` ends the loop before it, its producer stopped first."""
        self._loop.end_before()
        self.repeats.starting(self.epoch, self.options.shuffle)
        plan = self.plan()
        if self.stager is not None:
            self.start_staging(plan)
        self._batches_done = 0
        self.stats = ReadStats()
        return self._loop.start(self._yielded(plan, self._in_order(plan)))

    def _yielded(self, plan: EpochPlan, batches: Generator[tuple[np.ndarray, list[Sample]], None, None]
                 ) -> Generator[SampleBatch, None, None]:
        skipping = self.read_options.on_error == "skip"
        mine, size = plan.ranks[self.rank], plan.options.batch_size
        try:
            for number, (indices, samples) in enumerate(batches):
                if mine.copies is not None:  # pad=False: padding copies were read (the plan's shape), not yielded
                    keep = ~mine.copies[number * size : (number + 1) * size]
                    indices, samples = indices[keep], [s for s, k in zip(samples, keep.tolist(), strict=True) if k]
                if skipping:  # placeholders come only from shards skipped as corrupt
                    indices, samples = self._without_placeholders(indices, samples)
                self._batches_done += 1
                yield SampleBatch(self.epoch, self.seed, number, indices, samples)
            if self.stager is not None:
                # a whole epoch was read: its staging is done, bar the stager's own bookkeeping, which
                # is waited for so that its figures (stats) are final when the epoch ends
                self.stager.wait()
            if self.comm.allocator is not None:  # the epochs' high-water mark is not the next one's floor
                self.comm.allocator.epoch_done(loaders_first=not self._finished_an_epoch)
            self._finished_an_epoch = True
            self.repeats.finished(self.epoch)
        finally:
            batches.close()

    def start_staging(self, plan: EpochPlan) -> None:
        """Start copying this node's shards for ``plan`` (``stream.plan()``) to the stage directory;
        iterating does this itself, ``ddpipe stage`` calls it ahead of a job."""
        if self.stager is None:
            raise DdpipeError("this stream has no stage_dir")
        starts = self.dataset.manifest.shard_starts()
        order, readers = node_shard_order(plan, self.comm.node_ranks(), starts)
        shards, _ = self.dataset.locate(plan.ranks[self.rank].reads)
        runs = np.concatenate([[True], np.diff(shards) != 0]) if len(shards) else np.zeros(0, dtype=bool)
        my_runs: dict[int, int] = {}
        for s in shards[runs].tolist():
            my_runs[s] = my_runs.get(s, 0) + 1
        self.stager.start(self.epoch, order, readers, my_runs)

    def _without_placeholders(self, indices: np.ndarray, samples: list[Sample]) -> tuple[np.ndarray, list[Sample]]:
        """A batch less the placeholders of a corrupt shard's samples, each counted and named."""
        if not any(BAD in s for s in samples):
            return indices, samples
        keep = []
        for i, (g, sample) in enumerate(zip(indices.tolist(), samples, strict=True)):
            if BAD in sample:
                self.stats.skip(SkippedSample(str(sample.get(KEY)), self.source_of(g),
                                                     bytes(sample[BAD]).decode()))
            else:
                keep.append(i)
        return indices[keep], [samples[i] for i in keep]

    def _on_corrupt(self, shard: int, error: CorruptShardError) -> None:
        """Under ``on_error="skip"``, on the producer's thread: a shard failed its checksum (its samples
        come as placeholders), or a sample of an adopted file its digest (that sample does)."""
        self.stats.corrupt_shards.append(self.dataset.manifest.shards[shard].file)
        what = "a sample" if isinstance(error, DigestMismatchError) else "the samples of a shard"
        print(f"ddpipe: warning: skipping {what} that index.json does not match: {error}", file=sys.stderr,
              flush=True)

    def _in_order(self, plan: EpochPlan) -> Generator[tuple[np.ndarray, list[Sample]], None, None]:
        """This rank's batches of encoded samples, in the plan's order, with their global indices: read
        from now on by the producer, which stops when the batches are closed or let go of, taken or not."""
        rank_plan = plan.ranks[self.rank]
        # the exchange copies each sample once: a kept one out of its shard (unless the consumer takes
        # views), a sent one into its receiver's landing zone or a send slot (views until then)
        samples = functools.partial(read_samples, self.dataset, rank_plan.reads, random_access=plan.random_access,
                                    store=self.stager, limits=self._source_limits, verify=self.read_options.verify,
                                    keep_mapped=self.read_options.keep_mapped,
                                    on_corrupt=self._on_corrupt if self.read_options.on_error == "skip" else None,
                                    views=bool(rank_plan.rounds) or self.views,
                                    node_ranks=self.comm.world.local_size)
        waits = self.stager is not None and self.stager.options.capacity is not None
        producer = Producer(plan, self.rank, self.comm, self.read_options, samples, reads_wait_on_peers=waits,
                            views=self.views)
        arrivals, stopped = producer.start()
        ordered = self._ordered(plan, producer, arrivals, stopped)
        # a generator closed before its first next() never runs its body, so its finally neither
        weakref.finalize(ordered, stop_now, stopped).atexit = False  # the producer's exit handler does
        return ordered

    def _ordered(self, plan: EpochPlan, producer: Producer, arrivals: Generator[list[Any], None, None],
                 stopped: Stopper) -> Generator[tuple[np.ndarray, list[Sample]], None, None]:
        rank_plan = plan.ranks[self.rank]
        try:
            yield from batches_in_order(arrivals, rank_plan.order, rank_plan.positions, plan.options.batch_size,
                                        plan.num_batches, self.stats)
        finally:
            arrivals.close()
            stop_now(stopped)
        self.stats.exchange = producer.exchange  # the epoch was read whole: its figures are final

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands: enough to continue, on any number of ranks, with exactly the rest."""
        return self.state_at(self._batches_done)

    def state_at(self, batches: int) -> dict[str, Any]:
        """The state after this epoch's first ``batches`` batches: for a consumer that runs ahead of its
        caller (a decoder's queue), which says how many batches reached the caller."""
        return epoch_state(epoch=self.epoch, seed=self.seed, batches=batches, world_size=self.comm.world.size,
                           options=self.options, pending=self._pending, manifest=self.dataset.manifest)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed, self.epoch, self._pending = remaining(state, self.dataset.manifest)
        self._batches_done = 0
        self._plan = None
        self.repeats.reset()


def unreadable(stream: EncodedStream, index: int, sample: Sample, reason: str) -> SampleError:
    """The error for sample ``index`` of ``stream`` that cannot be used, naming its key and shard."""
    return SampleError(reason, key=sample.get(KEY), path=stream.source_of(index))
