"""Carrying out ``partial``'s plan over MPI: each round, send the chosen encoded samples with one
``Alltoallv`` and emit what this rank keeps, then what it received, in the plan's order.

Runs in the loader's producer thread, so the exchange overlaps with the consumer's work. Every rank
runs the same rounds in the same order. A rank whose consumer stopped (a loop broken to checkpoint,
say) goes on reading and exchanging, discarding its own output, for as long as any other rank still
iterates: the others need what it sends. In each round's first message (the sizes each rank will
receive) the ranks also agree whether all of them have stopped, and end together when they have:
one synchronisation per round, not two.
"""

from __future__ import annotations

import itertools
import struct
import time
from collections.abc import Callable, Iterator

import msgpack
import numpy as np

from .comm import Comm
from .comm.base import segment_lengths
from .errors import DdpipeError
from .plan import RankPlan
from .sample import KEY, Sample, owned

# emit((global index, sample)) -> False once the consumer has stopped
Emit = Callable[[tuple[int, Sample]], bool]


class ExchangeShuffler:
    def __init__(self, comm: Comm, plan: RankPlan, hold: int = 2) -> None:
        """``hold``: how many rounds' received samples the consumer may keep at once (see Comm.alltoallv)."""
        self.comm = comm
        self.plan = plan
        self.hold = hold
        self.samples_sent = 0
        self.bytes_sent = 0
        # what the exchange costs this rank: packing, moving the bytes once every rank has arrived, and
        # unpacking (compared with raw Alltoallv); waiting for slower ranks to arrive is counted apart
        self.exchange_seconds = 0.0
        self.wait_seconds = 0.0
        # the processor time this thread spent in the exchange, waits included (they sleep): on a node
        # with fewer free cores than threads, its wall time also holds the other threads' turns
        self.exchange_cpu_seconds = 0.0
        self.round_bytes: list[list[int]] = []  # bytes sent to each rank, per round

    def run(self, samples: Iterator[Sample], emit: Emit) -> bool:
        """Read, exchange and emit every round; False if every rank stopped before the last one.
        ``samples`` may hold views of the shards they were read from (``Dataset.read(views=True)``):
        a sample sent is copied once, from its shard into the segment, and one kept once, out of it."""
        plan, size = self.plan, self.comm.world.size
        reads = plan.reads.tolist()  # Python ints once, not a NumPy scalar per sample
        stopped = False
        for j, rnd in enumerate(plan.rounds):
            length = rnd.stop - rnd.start
            chunk = list(itertools.islice(samples, length))
            if len(chunk) != length:
                raise DdpipeError(f"exchange round {j}: the reads ended {length - len(chunk)} samples early")
            outgoing: list[list[tuple[int, Sample]]] = [[] for _ in range(size)]
            for positions, dest in zip(rnd.send, rnd.dests, strict=True):
                outgoing[dest] = [(reads[p], chunk[p - rnd.start]) for p in positions.tolist()]
            kept = np.ones(length, dtype=bool)
            kept[rnd.sent - rnd.start] = False
            # kept samples are copied out of their shards (the copy every read makes, not the
            # exchange's); sent ones go from their shards straight into the segments
            out: list[tuple[int, Sample]] = [(reads[rnd.start + i], owned(chunk[i]))
                                             for i in np.flatnonzero(kept).tolist()]
            t0, cpu0 = time.perf_counter(), time.thread_time()
            segments = [segment_parts(items) for items in outgoing]
            counts = segment_lengths(segments, size).tolist()
            t1 = time.perf_counter()
            moved = self.comm.transfer_seconds
            # the samples received are views into this round's own buffer, handed on uncopied
            received = self.comm.alltoallv(segments, f"exchange round {j}", wanted=not stopped, hold=self.hold)
            if received is None:  # every rank has stopped
                return False
            t2 = time.perf_counter()
            self.samples_sent += len(rnd.sent)
            self.round_bytes.append(counts)
            self.bytes_sent += sum(counts)
            moved = self.comm.transfer_seconds - moved
            for source, expected in zip(rnd.sources, rnd.recv, strict=True):
                items = unpack_segment(received[source]) if expected.size else []
                if [g for g, _ in items] != expected.tolist():
                    raise DdpipeError(f"exchange round {j}: rank {source} sent samples the plan does not expect; "
                                      "do all ranks run the same ddpipe version, dataset and options?")
                out.extend(items)
            self.exchange_seconds += (t1 - t0) + moved + (time.perf_counter() - t2)
            self.exchange_cpu_seconds += time.thread_time() - cpu0
            self.wait_seconds += (t2 - t1) - moved
            if not stopped:
                for item in out:
                    if not emit(item):
                        stopped = True
                        break
        return not stopped


# A segment: u64 header length, a msgpack header [[index, key, [[field, length], ...]], ...], then
# every field's bytes back to back. Hand-framed rather than one msgpack object so that the fields go
# from the buffers they were read into (msgpack's packer copies, at about 1 GB/s here).
_LEN = struct.Struct("<Q")


def segment_parts(items: list[tuple[int, Sample]]) -> list[bytes]:
    """The segment carrying ``items`` to one rank, as its parts: the framed header, then each field
    as it is (no copy); none for no items."""
    if not items:
        return []
    meta = [[g, s[KEY], [[k, len(v)] for k, v in s.items() if k != KEY]] for g, s in items]
    header = msgpack.packb(meta, use_bin_type=True)
    return [_LEN.pack(len(header)) + header, *(v for _, s in items for k, v in s.items() if k != KEY)]


def unpack_segment(segment: memoryview) -> list[tuple[int, Sample]]:
    """The samples of one segment; their fields are views into ``segment`` (no copy)."""
    (header_len,) = _LEN.unpack_from(segment)
    at = _LEN.size + header_len
    meta = msgpack.unpackb(segment[_LEN.size : at], raw=False)
    items = []
    for g, key, fields in meta:
        sample: Sample = {KEY: key}
        for name, length in fields:
            sample[name] = segment[at : at + length]
            at += length
        items.append((int(g), sample))
    return items
