"""The loader: this rank's batches of the epoch, as the plan says, with reading and exchange in the
background.

Stages, each behind a bounded queue: a producer thread reads this rank's samples (sequential scans,
or random access for ``global``) and, for ``partial``, exchanges a fraction of them with the other
ranks round by round; the consumer (the caller's thread) puts them in the plan's yield order. The
plan already fixes that order (the shuffle buffer is simulated on indices), so the consumer only
holds samples that arrived before their turn: at most about one buffer plus one round.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import socket
import sys
import threading
import weakref
from collections.abc import Generator, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .comm import Comm, init_comm
from .dataset import Dataset, open_dataset
from .decode.batches import EncodedBatch
from .decode.spec import DecodeOptions
from .errors import CorruptShardError, DdpipeError, DigestMismatchError, SampleError
from .exchange import EMIT_GROUP, ExchangeShuffler
from .handoff import END, groups, in_groups, put_unless_stopped, read_ahead
from .loader_options import LoaderKeywords, ReadOptions, loader_options
from .plan import EpochPlan, PlanOptions, plan_epoch
from .reorder import batches_in_order
from .sample import BAD, KEY, Sample
from .shufflers import get_shuffler, receipt_lifetimes
from .staging import NodeStager, StageOptions, default_stage_dir, node_local_dir
from .staging.order import node_shard_order
from .throttle import SourceLimits

if TYPE_CHECKING:  # torch loads only when something decodes
    from typing_extensions import Unpack

    from .decode.output import Decoder
    from .service.client import ServiceStats

STATE_VERSION = 1


class Loader:
    """Batches of this rank's samples, the same number on every rank.

    Each batch is ``(images, labels)``: images as a torch tensor on ``device`` (NCHW; float32,
    float16 or uint8 per ``decode_options``), labels as int64. ``decode`` picks the decoder
    (``"auto"``, ``"dali-gpu"``, ``"dali-cpu"``, ``"pil"``); with ``decode="none"`` each batch is a
    list of encoded sample dicts instead. ``on_error="fail"`` stops at an image that does not decode,
    naming its key and shard; ``"skip"`` drops it from its batch and counts it in ``stats``, so every
    rank still yields the same number of batches. The same holds for a shard whose bytes fail the
    manifest's checksum: an error naming it, or under ``"skip"`` its samples dropped and counted and
    the shard listed in ``stats["corrupt_shards"]``.

    Call :meth:`set_epoch` before each epoch; :meth:`state_dict` mid-epoch and
    :meth:`load_state_dict` in a fresh loader (any world size) continue with exactly the samples
    not yet yielded.

    ``path`` may be a directory, ``s3://bucket/prefix`` or ``http(s)://host/prefix`` (see
    :func:`ddpipe.open_dataset`, which takes the store's options), or a :class:`Dataset`.

    What constructing a loader asks of the other ranks, and why: without ``comm``, it calls
    :func:`ddpipe.init_comm` (the job's world: MPI's own set-up, under MPI); with staging on more
    than one rank, one ``allgather`` of each rank's staging directory (the ranks of a node must share
    one, or they would wait on each other's copies: refused on every rank at once), and on several
    nodes one communicator duplicated for the peers' copies. Nothing else: each epoch's collectives
    happen while it is iterated.
    """

    def __init__(self, path: str | os.PathLike[str] | Dataset, batch_size: int | None = None, *,
                 plan: PlanOptions | None = None, decode: DecodeOptions | str | None = None,
                 stage: StageOptions | None = None, read: ReadOptions | None = None, seed: int = 0,
                 comm: Comm | None = None, **keywords: Unpack[LoaderKeywords]) -> None:
        options = loader_options(batch_size, plan, decode, stage, read, **keywords)
        self.dataset: Dataset = path if isinstance(path, Dataset) else open_dataset(path)
        if len(self.dataset) == 0:
            raise DdpipeError("the dataset holds no samples: nothing to load", path=self.dataset.where)
        self.options, self.read_options = options.plan, options.read
        self.seed = seed
        self.comm = comm or init_comm()
        self.decode_options = options.decode
        if self.decode_options.threads == 0:  # the node's cores, shared among the ranks on it
            self.decode_options = dataclasses.replace(self.decode_options, threads=self.comm.world.cores_per_rank)
        self.on_error = self.decode_options.on_error
        self.decode, self.device = "none", None
        if self.decode_options.decoder != "none":
            from .decode.output import resolve

            self.decode, self.device = resolve(self.decode_options.decoder, self.decode_options.device,
                                               self.comm.world.local_rank, served=bool(self.decode_options.service))
        self.epoch = 0
        # the samples this epoch plans over: None for all, or what a resumed epoch had left; it changes
        # only with set_epoch, so iterating again repeats the same stream and a state taken after the
        # last batch resumes to nothing
        self._pending: np.ndarray | None = None
        self._batches_done = 0
        self._plan: EpochPlan | None = None
        self.stats: dict[str, Any] = {}
        limits = options.read.source_limits
        if limits is not None and limits.bandwidth and self.comm.world.local_size > 1:
            # the modelled link is the node's: ranks reading the source directly share it
            limits = SourceLimits(limits.bandwidth / self.comm.world.local_size, limits.latency)
        self._source_limits = limits
        self.stager: NodeStager | None = None
        stage = options.stage
        if stage is not None:  # the job names one local directory; each node resolves it to its own
            template = default_stage_dir(os.environ) if str(stage.stage_dir) == "auto" else stage.stage_dir
            stage = dataclasses.replace(stage, stage_dir=node_local_dir(template, self.comm.world.node,
                                                                        socket.gethostname(), os.environ))
        self._check_one_stage_dir_per_node(stage)
        if stage is not None:
            if stage.capacity is not None and get_shuffler(self.options.shuffle).random_access:
                raise DdpipeError("a staging capacity needs sequential reading: use shuffle='partial' or 'local' "
                                  "with stage_capacity, or stage the whole share (no capacity) for 'global'")
            self.stager = NodeStager(self.dataset, stage, self.comm)
        self.skipped: list[tuple[str, str, str]] = []  # (key, shard, reason) of skipped samples, first 1,000
        self._decoder: Decoder | None = None
        self._finished_an_epoch = False
        closing = weakref.WeakMethod(self.close)  # the job may end while this loader is alive
        self.comm.at_end(lambda: (close := closing()) is not None and close())

    def _check_one_stage_dir_per_node(self, stage: StageOptions | None) -> None:
        """The ranks of a node share one staged copy of each shard: refuse, on every rank at once, a job
        whose ranks on one node name different staging directories (they would wait on each other)."""
        if self.comm.world.size == 1:
            return
        mine = str(Path(stage.stage_dir).resolve()) if stage is not None else None
        named = [d for n, d in self.comm.allgather((self.comm.world.node, mine)) if n == self.comm.world.node]
        if len(set(named)) > 1:
            a, b = sorted(set(named), key=str)[:2]
            error = DdpipeError(f"ranks of node {self.comm.world.node} were given different staging directories: "
                                f"{a or 'none'} and {b or 'none'}; give every rank of a node the same one")
            error.job_wide = True  # every rank raises it: none need end the others
            raise error

    @property
    def service_stats(self) -> ServiceStats | None:
        """With ``DecodeOptions(service=...)``: what the decode servers and this process decoded, and
        where the time went; ``None`` otherwise, or before the first batch."""
        return getattr(self._decoder, "stats", None)

    def close(self) -> None:
        """Release the decoder (its DALI pipeline, threads or processes); iterating again makes a new one."""
        if self._decoder is not None:
            self._decoder.close()
            self._decoder = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def rank(self) -> int:
        return self.comm.world.rank

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._pending = None
        self.epoch = epoch
        self._batches_done = 0
        self._plan = None

    def plan(self) -> EpochPlan:
        """This epoch's plan (the same on every rank)."""
        if self._plan is None:
            self._plan = plan_epoch(self.dataset.manifest, self.comm.world.size, self.seed, self.epoch,
                                    self.options, self._pending)
        return self._plan

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

    def __iter__(self) -> Iterator[Any]:
        plan = self.plan()
        if self.stager is not None:
            self.start_staging(plan)
        self._batches_done = 0
        self.stats["skipped"] = 0
        self.stats["corrupt_shards"] = []
        stream = self._encoded(plan)
        try:
            if self.decode == "none":
                # placeholders come only from shards skipped as corrupt (on_error="skip")
                skipping = self.on_error == "skip"
                for indices, samples in stream:
                    self._batches_done += 1
                    yield self._without_placeholders(indices, samples) if skipping else samples
            else:
                from .decode.output import make_decoder

                assert self.device is not None  # set with every decode but "none"
                if self._decoder is None:  # one for every epoch: its pipeline, pools and buffers stay
                    self._decoder = make_decoder(self.decode, self.decode_options, self.options.batch_size,
                                                 self.device)
                encoded = (EncodedBatch.of(indices, samples, self._on_bad) for indices, samples in stream)
                decoded = self._decoder.decode(encoded, self.seed, self.epoch, self._on_bad)
                if self.on_error == "skip":  # batches keep their size: see decode/refill.py
                    from .decode.refill import refilled

                    sizes = [len(plan.batch(self.rank, b)) for b in range(plan.num_batches)]
                    decoded = refilled(decoded, sizes, self.stats)
                for batch in decoded:
                    self._batches_done += 1  # what the caller has received, not what decoding prefetched
                    yield batch
            if self.stager is not None:
                # a whole epoch was read: its staging is done, bar the stager's own bookkeeping, which
                # is waited for so that its figures (stats) are final when the epoch ends
                self.stager.wait()
            # the epochs' high-water mark is not the next one's floor
            self.comm.freed_memory.epoch_done(loaders_first=not self._finished_an_epoch)
            self._finished_an_epoch = True
        finally:
            stream.close()

    def start_staging(self, plan: EpochPlan) -> None:
        """Start copying this node's shards for ``plan`` (``loader.plan()``) to the stage directory;
        iterating does this itself, ``ddpipe stage`` calls it ahead of a job."""
        if self.stager is None:
            raise DdpipeError("this loader has no stage_dir")
        starts = self.dataset.manifest.shard_starts()
        order, readers = node_shard_order(plan, self.comm.node_ranks(), starts)
        shards, _ = self.dataset.locate(plan.ranks[self.rank].reads)
        runs = np.concatenate([[True], np.diff(shards) != 0]) if len(shards) else np.zeros(0, dtype=bool)
        my_runs: dict[int, int] = {}
        for s in shards[runs].tolist():
            my_runs[s] = my_runs.get(s, 0) + 1
        self.stager.start(self.epoch, order, readers, my_runs)

    def _on_bad(self, index: int, sample: Sample, reason: str) -> None:
        shard, _ = self.dataset.locate(np.array([index]))
        where = self.dataset.source_name(self.dataset.shard_path(int(shard[0])))
        if self.on_error == "fail":
            raise SampleError(reason, key=sample.get(KEY), path=where)
        self.stats["skipped"] += 1
        if len(self.skipped) < 1000:
            self.skipped.append((str(sample.get(KEY)), where, reason))

    def _without_placeholders(self, indices: np.ndarray, samples: list[Sample]) -> list[Sample]:
        """Encoded samples as yielded (``decode="none"``): those of a corrupt shard dropped and counted."""
        kept = []
        for g, sample in zip(indices.tolist(), samples, strict=True):
            if BAD in sample:
                self._on_bad(g, sample, bytes(sample[BAD]).decode())
            else:
                kept.append(sample)
        return kept

    def _on_corrupt(self, shard: int, error: CorruptShardError) -> None:
        """Under ``on_error="skip"``: a shard failed its checksum (its samples come as placeholders), or
        a sample of an adopted file its digest (that sample does)."""
        self.stats["corrupt_shards"].append(self.dataset.manifest.shards[shard].file)
        what = "a sample" if isinstance(error, DigestMismatchError) else "the samples of a shard"
        print(f"ddpipe: warning: skipping {what} that index.json does not match: {error}", file=sys.stderr,
              flush=True)

    @property
    def _group(self) -> int:
        """Samples handed from the producer to the consumer at a time: never more than ``prefetch``."""
        return max(1, min(EMIT_GROUP, self.read_options.prefetch))

    def _encoded(self, plan: EpochPlan) -> Generator[tuple[np.ndarray, list[Sample]], None, None]:
        """This rank's batches of encoded samples, in the plan's order, with their global indices."""
        # the producer puts lists of (global index, sample), ``_group`` long: ``prefetch`` samples queued
        out: queue.Queue[Any] = queue.Queue(maxsize=max(1, self.read_options.prefetch // self._group))
        stop = threading.Event()
        producer = threading.Thread(target=self._produce, args=(plan, out, stop), daemon=True,
                                    name=f"ddpipe-producer-{self.rank}")
        producer.start()
        arrivals = groups(out)
        try:
            rank_plan = plan.ranks[self.rank]
            yield from batches_in_order(arrivals, rank_plan.stream, rank_plan.order, plan.options.batch_size,
                                        plan.num_batches, self.stats)
        finally:
            arrivals.close()
            stop.set()  # the producer notices within one queue timeout, even when the queue is full
            producer.join()

    @property
    def _decoder_reads_in_place(self) -> bool:
        """The decoder reads each sample's bytes where they lie and keeps its batch until it is done
        with it (DALI, no_copy): samples read without an exchange reach it as views of their shard, not
        copies. On an H100 machine's 16 cores, reading with views ran at 34,200 samples/s against 20,400
        copying each ~130 KB JPEG out (the interpreter held for each copy, beside DALI's own feeding),
        and the dali-gpu loader went from 7,700 to 11,000 images/s (gpu.py --probe). A view keeps its
        shard mapped while the shuffle buffer and DALI's queue hold it."""
        return self.decode in ("dali-gpu", "dali-cpu") and not self.decode_options.service

    def _produce(self, plan: EpochPlan, out: queue.Queue[Any], stop: threading.Event) -> None:
        rank_plan = plan.ranks[self.rank]

        def emit(item: Any) -> bool:
            return put_unless_stopped(out, item, stop)

        try:
            # the exchange copies each sample once: a kept one out of its shard, a sent one into its
            # receiver's landing zone or a send slot (views until then)
            samples = self.dataset.read(rank_plan.reads, random_access=plan.random_access, store=self.stager,
                                        limits=self._source_limits, verify=self.read_options.verify,
                                        on_corrupt=self._on_corrupt if self.on_error == "skip" else None,
                                        views=bool(rank_plan.rounds) or self._decoder_reads_in_place)
            if rank_plan.rounds:
                # the exchange reads on this thread: a reading thread of its own, ahead of it, cost more
                # in handing samples over and taking turns with it than it gained by reading during the
                # rounds' waits (benchmarks/exchange.py, warm: Q = 0.3 at 1.04 of Q = 0 on 4 ranks
                # without it, against 1.10 with it; cold and the slow source alike; the kernel reads
                # the next shard ahead meanwhile, Dataset.read's prefetch), except below
                # the consumer runs up to the queue and the batches it holds behind the exchange; samples
                # it keeps past two shuffle buffers are copied out rather than keep their round's buffer
                ahead_of_consumer = self.read_options.prefetch + self._group + 2 * self.options.batch_size
                lifetimes = receipt_lifetimes(rank_plan.stream, rank_plan.order, rank_plan.rounds,
                                              ahead=ahead_of_consumer,
                                              copy_beyond=2 * self.options.buffer_size + self.options.round_size)
                shuffler = ExchangeShuffler(self.comm, rank_plan, lifetimes)
                reads_wait_on_peers = self.stager is not None and self.stager.options.capacity is not None
                if reads_wait_on_peers:
                    # where the node's stager may wait for its readers to make room (a capacity), reading
                    # has a thread of its own, ahead, so that a rank waiting for its round still moves
                    # past the shards it is done with: in step, the ranks' shards in use at a round's
                    # end could fill the capacity, the round waiting on a shard the stager waits to
                    # make room for (tests/mpi/test_staging_mpi.py: 2 ranks, room for 3 shards)
                    samples = read_ahead(samples, max(2 * self.options.round_size, 1024))
                try:
                    # reading the next round while waiting for a round is for reads that never wait on
                    # the other ranks' progress (a stalled poll would stall the round for them too)
                    finished = shuffler.run(samples, emit, self._group, read_while_waiting=not reads_wait_on_peers)
                finally:
                    samples.close()  # its shards' mappings and staged copies go now, not when collected
                # update, not replace: the consumer may still be counting skipped samples in stats
                self.stats.update({"samples_sent": shuffler.samples_sent, "bytes_sent": shuffler.bytes_sent,
                                   "exchange_seconds": shuffler.exchange_seconds,
                                   "exchange_wait_seconds": shuffler.wait_seconds,
                                   "exchange_cpu_seconds": shuffler.exchange_cpu_seconds,
                                   "round_bytes": shuffler.round_bytes})
                if not finished:
                    emit(END)
                    return
            else:
                for group in in_groups(zip(rank_plan.reads.tolist(), samples, strict=True), self._group):
                    if not emit(group):
                        return
            emit(END)
        except BaseException as e:  # reaches the consumer intact
            emit(e)

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands: enough to continue, on any number of ranks, with exactly the rest."""
        pending = None if self._pending is None else np.packbits(self._pending).tobytes()
        return {"version": STATE_VERSION, "epoch": self.epoch, "seed": self.seed, "batches": self._batches_done,
                "world_size": self.comm.world.size, "options": asdict(self.options), "pending": pending,
                "num_samples": len(self.dataset)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise DdpipeError(f"loader state version {state.get('version')!r} is not supported")
        n = len(self.dataset)
        if state["num_samples"] != n:
            raise DdpipeError(f"the state is of a dataset of {state['num_samples']} samples; this one has {n}")
        old_pending = None
        if state["pending"] is not None:
            old_pending = np.unpackbits(np.frombuffer(state["pending"], dtype=np.uint8), count=n).astype(bool)
        old = plan_epoch(self.dataset.manifest, state["world_size"], state["seed"], state["epoch"],
                         PlanOptions(**state["options"]), old_pending)
        remaining = np.zeros(n, dtype=bool)
        for r in old.ranks:
            remaining[r.order] = True
        remaining[old.yielded(state["batches"])] = False
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        self._pending = remaining
        self._batches_done = 0
        self._plan = None
