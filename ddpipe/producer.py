"""The encoded stream's producer thread: this rank's reads and, for ``partial``, its exchange rounds,
handed to the consumer in groups through a queue bounded in samples (:class:`ddpipe.handoff.SampleQueue`)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import queue
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from .exchange import EMIT_GROUP, ExchangeShuffler
from .handoff import END, SampleQueue, groups, in_groups, put_unless_stopped, read_ahead
from .loader_stats import ExchangeStats
from .shufflers import receipt_lifetimes

if TYPE_CHECKING:
    from .comm import Comm
    from .options import ReadOptions
    from .plan import EpochPlan
    from .sample import Sample

# stops a running producer, waiting for its thread to end (see Producer.start)
Stopper = Callable[[], None]


class Producer:
    """One epoch's reading (and exchange) on this rank, run on a thread of its own by :meth:`run`.
    ``samples()``: this rank's reads, in the plan's order (:func:`ddpipe.reading.read_samples`);
    ``reads_wait_on_peers``: reading may wait for the node's other ranks (staging with a capacity);
    ``views``: the consumer takes samples as views of their shards (``EncodedStream.views``).
    ``exchange``: the exchange's figures once the epoch is read."""

    def __init__(self, plan: EpochPlan, rank: int, comm: Comm, read: ReadOptions,
                 samples: Callable[[], Generator[Sample, None, None]], reads_wait_on_peers: bool,
                 views: bool = False) -> None:
        self.plan, self.rank, self.comm, self.read = plan, rank, comm, read
        self.samples, self.reads_wait_on_peers, self.views = samples, reads_wait_on_peers, views
        self.exchange: ExchangeStats | None = None

    @property
    def group(self) -> int:
        """Samples handed from the producer to the consumer at a time: never more than ``prefetch``."""
        return max(1, min(EMIT_GROUP, self.read.prefetch))

    @property
    def ahead(self) -> int:
        """Samples the hand-over to the consumer holds: ``prefetch``, or more where the exchange may
        have to run further ahead of the consumer for every rank to finish its batch while this
        rank's caller waits for them (a training step's allreduce: ``RankPlan.lead``)."""
        return max(self.read.prefetch, self.plan.ranks[self.rank].lead)

    def start(self) -> tuple[Generator[list[Any], None, None], Stopper]:
        """Run on a thread of its own: the lists of (global index, sample) it puts, up to ``group``
        long, as they arrive, and what stops it (:func:`stop_now`), which the interpreter's exit
        calls at the latest."""
        out: queue.Queue[Any] = SampleQueue(self.ahead)
        stop = threading.Event()
        thread = threading.Thread(target=self.run, args=(out, stop), daemon=True, name=f"ddpipe-producer-{self.rank}")
        thread.start()
        # stopped at the latest as the interpreter exits, before the exit handlers of the libraries it
        # reads with, registered earlier (handlers run last in, first out): h5py's took its type
        # converters from under a producer still reading, which crashed or hung the exit of a script
        # that left its loader mid-epoch (HDF5 shards: 4 runs in 6 here)
        stopped = functools.partial(_stop, stop, thread, out)
        atexit.register(stopped)
        return groups(out), stopped

    def run(self, out: queue.Queue[Any], stop: threading.Event) -> None:
        rank_plan = self.plan.ranks[self.rank]
        batch_size, options = self.plan.options.batch_size, self.plan.options

        def emit(item: Any) -> bool:
            return put_unless_stopped(out, item, stop)

        try:
            samples = self.samples()
            if not rank_plan.rounds:
                for group in in_groups(zip(rank_plan.reads.tolist(), samples, strict=True), self.group):
                    if not emit(group):
                        return
                emit(END)
                return
            # the exchange reads on this thread: a reading thread of its own, ahead of it, cost more in
            # handing samples over and taking turns with it than it gained by reading during the rounds'
            # waits (benchmarks/exchange.py, warm: Q = 0.3 at 1.04 of Q = 0 on 4 ranks without it, against
            # 1.10 with it; cold and the slow source alike; the kernel reads the next shard ahead
            # meanwhile, Dataset.read's prefetch), except below
            # the consumer runs up to the queue and the batches it holds behind the exchange; samples it
            # keeps past two shuffle buffers are copied out rather than keep their round's buffer
            ahead_of_consumer = self.ahead + self.group + 2 * batch_size
            lifetimes = receipt_lifetimes(rank_plan.positions, rank_plan.rounds, ahead=ahead_of_consumer,
                                          copy_beyond=2 * options.buffer_size + options.round_size)
            shuffler = ExchangeShuffler(self.comm, rank_plan, lifetimes, views=self.views)
            if self.reads_wait_on_peers:
                # where the node's stager may wait for its readers to make room (a capacity), reading has
                # a thread of its own, ahead, so that a rank waiting for its round still moves past the
                # shards it is done with: in step, the ranks' shards in use at a round's end could fill
                # the capacity, the round waiting on a shard the stager waits to make room for
                # (tests/mpi/test_staging_mpi.py: 2 ranks, room for 3 shards)
                samples = read_ahead(samples, max(2 * options.round_size, 1024))
            try:
                # reading the next round while waiting for a round is for reads that never wait on the
                # other ranks' progress (a stalled poll would stall the round for them too)
                shuffler.run(samples, emit, self.group, read_while_waiting=not self.reads_wait_on_peers)
            finally:
                samples.close()  # its shards' mappings and staged copies go now, not when collected
            self.exchange = ExchangeStats(shuffler.samples_sent, shuffler.bytes_sent, shuffler.exchange_seconds,
                                          shuffler.wait_seconds, shuffler.exchange_cpu_seconds,
                                          tuple(tuple(r) for r in shuffler.round_bytes))
            emit(END)
        except BaseException as e:  # reaches the consumer intact
            emit(e)


def stop_now(stopped: Stopper) -> None:
    """Stop a producer now, no longer at exit."""
    atexit.unregister(stopped)
    stopped()


def _stop(stop: threading.Event, thread: threading.Thread, out: queue.Queue[Any]) -> None:
    stop.set()  # the producer notices within one queue timeout, even when the queue is full
    if thread is not threading.current_thread():
        thread.join()
    # at exit, a consumer on another thread (an epoch read ahead) may be waiting for the next group: it ends
    with contextlib.suppress(queue.Full):
        out.put_nowait(END)
