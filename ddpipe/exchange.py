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
from .shufflers import ExchangeRound, ReceiptLifetimes, receipt_lifetimes

# emit((global index, sample)) -> False once the consumer has stopped
Emit = Callable[[tuple[int, Sample]], bool]


class ExchangeShuffler:
    def __init__(self, comm: Comm, plan: RankPlan, lifetimes: ReceiptLifetimes | None = None) -> None:
        """``lifetimes``: how long the consumer keeps what this rank receives (:func:`receipt_lifetimes`);
        by default, as its plan says for a consumer that takes each sample as soon as it is emitted."""
        self.comm = comm
        self.plan = plan
        self.lifetimes = lifetimes or receipt_lifetimes(plan.stream, plan.order, plan.rounds, 0, len(plan.order))
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
        ``samples``: this rank's reads, as :func:`own_kept` gives them (or all copied out of their
        shards): a sample sent is copied once, from its shard into the segment, and one kept is
        handed on as it comes."""
        reads = self.plan.reads.tolist()  # Python ints once, not a NumPy scalar per sample
        stopped = False
        for j, rnd in enumerate(self.plan.rounds):
            out = self._round(j, rnd, samples, reads, wanted=not stopped)
            if out is None:  # every rank has stopped
                return False
            if not stopped:
                stopped = not _emit_all(out, emit)
            # what this round received may go as soon as the consumer is done with it: this thread's
            # references are gone before the next round (whose buffer the receiver takes meanwhile)
            del out
        return not stopped

    def _round(self, j: int, rnd: ExchangeRound, samples: Iterator[Sample], reads: list[int],
               wanted: bool) -> list[tuple[int, Sample]] | None:
        """Round ``j``: what this rank keeps, then what it received, in the plan's order; None if
        every rank has stopped."""
        size, start = self.comm.world.size, rnd.start  # a property: read once, not per sample
        length = rnd.stop - start
        chunk = list(itertools.islice(samples, length))
        if len(chunk) != length:
            raise DdpipeError(f"exchange round {j}: the reads ended {length - len(chunk)} samples early")
        outgoing: list[list[tuple[int, Sample]]] = [[] for _ in range(size)]
        for positions, dest in zip(rnd.send, rnd.dests, strict=True):
            outgoing[dest] = [(reads[p], chunk[p - start]) for p in positions.tolist()]
        kept = np.ones(length, dtype=bool)
        kept[rnd.sent - start] = False
        # kept samples come copied out of their shards (own_kept, on the reading thread); sent ones go
        # from their shards straight into the segments
        out: list[tuple[int, Sample]] = [(reads[start + i], chunk[i]) for i in np.flatnonzero(kept).tolist()]
        t0, cpu0 = time.perf_counter(), time.thread_time()
        segments = [segment_parts(items) for items in outgoing]
        counts = segment_lengths(segments, size).tolist()
        t1 = time.perf_counter()
        moved = self.comm.transfer_seconds
        # the samples received are views into this round's own buffer, handed on uncopied
        received = self.comm.alltoallv(segments, f"exchange round {j}", wanted=wanted,
                                       hold=self.lifetimes.rounds_held)
        if received is None:
            return None
        t2 = time.perf_counter()
        self.samples_sent += len(rnd.sent)
        self.round_bytes.append(counts)
        self.bytes_sent += sum(counts)
        moved = self.comm.transfer_seconds - moved
        arrived = len(out)
        for source, expected in zip(rnd.sources, rnd.recv, strict=True):
            if expected.size:
                indices, items = unpack_segment(received[source])
                if indices != expected.tolist():
                    raise DdpipeError(f"exchange round {j}: rank {source} sent samples the plan does not "
                                      "expect; do all ranks run the same ddpipe version, dataset and options?")
                out.extend(items)
        # samples the consumer keeps long leave the round's buffer, so that it goes once the rest are used
        for i in np.flatnonzero(self.lifetimes.copy_out[j]).tolist():
            g, sample = out[arrived + i]
            out[arrived + i] = (g, owned(sample))
        self.exchange_seconds += (t1 - t0) + moved + (time.perf_counter() - t2)
        self.exchange_cpu_seconds += time.thread_time() - cpu0
        self.wait_seconds += (t2 - t1) - moved
        return out


def own_kept(samples: Iterator[Sample], plan: RankPlan) -> Iterator[Sample]:
    """``samples``, this rank's reads, with the ones it keeps copied out of their shards as they come
    (the copy every read makes) and the ones it sends left as views, for the segments. Run on the
    reading thread, the copies overlap the reads: done in the exchange's round instead, they were a
    round's worth of copying after its last read, and cold epochs (benchmarks/exchange.py, 4 ranks)
    ended 30-50 ms after those with Q = 0."""
    sent = np.zeros(len(plan.reads), dtype=bool)
    for rnd in plan.rounds:
        sent[rnd.sent] = True
    for sample, is_sent in zip(samples, sent.tolist(), strict=False):
        yield sample if is_sent else owned(sample)


def _emit_all(out: list[tuple[int, Sample]], emit: Emit) -> bool:
    """Emit ``out`` in order; False once the consumer has stopped."""
    return all(emit(item) for item in out)


# A segment: u64 header length, a msgpack header, then every field's bytes back to back. The header
# is [keys joined by newlines (keys hold no whitespace), the field-name lists in use, each sample's
# list (uint16), the samples' global indices (int64), every field's length (int64)]: flat arrays
# rather than lists per sample, since each container alive at once counts towards the garbage
# collector's next pass (per-sample lists made it run 35 times an epoch instead of 3, ~5% of an
# epoch's time). Hand-framed rather than one msgpack object so that the fields go from the buffers
# they were read into (msgpack's packer copies, at about 1 GB/s here).
_LEN = struct.Struct("<Q")


def segment_parts(items: list[tuple[int, Sample]]) -> list[bytes]:
    """The segment carrying ``items`` to one rank, as its parts: the framed header, then each field
    as it is (no copy); none for no items."""
    if not items:
        return []
    kinds: dict[tuple[str, ...], int] = {}  # a sample's keys, in order -> its field-name list's number
    names_of: list[list[str]] = []
    kind_of: list[int] = []
    fields: list[bytes | memoryview] = []
    for _, sample in items:
        keys = tuple(sample)
        kind = kinds.get(keys)
        if kind is None:
            kind = kinds[keys] = len(names_of)
            names_of.append([k for k in keys if k != KEY])
        kind_of.append(kind)
        fields.extend(map(sample.__getitem__, names_of[kind]))
    header = msgpack.packb(["\n".join(s[KEY] for _, s in items), names_of,
                            np.array(kind_of, dtype=np.uint16).tobytes(),
                            np.array([g for g, _ in items], dtype=np.int64).tobytes(),
                            np.array(list(map(len, fields)), dtype=np.int64).tobytes()], use_bin_type=True)
    return [_LEN.pack(len(header)) + header, *fields]


def unpack_segment(segment: memoryview) -> tuple[list[int], list[tuple[int, Sample]]]:
    """The global indices of one segment's samples, and the samples; their fields are views into
    ``segment`` (no copy)."""
    (header_len,) = _LEN.unpack_from(segment)
    at = _LEN.size + header_len
    keys, names_of, kind_of, indices, lengths = msgpack.unpackb(segment[_LEN.size : at], raw=False)
    indices = np.frombuffer(indices, dtype=np.int64).tolist()
    ends = (np.cumsum(np.frombuffer(lengths, dtype=np.int64)) + at).tolist()
    views = [segment[a:b] for a, b in zip([at, *ends[:-1]], ends, strict=True)]
    items = []
    f = 0
    for g, key, kind in zip(indices, keys.split("\n"), np.frombuffer(kind_of, dtype=np.uint16).tolist(), strict=True):
        names = names_of[kind]
        sample: Sample = {KEY: key}
        sample.update(zip(names, views[f : f + len(names)], strict=True))
        f += len(names)
        items.append((g, sample))
    return indices, items
