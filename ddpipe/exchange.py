"""Carrying out ``partial``'s plan over MPI: each round, send the chosen encoded samples with one
``Alltoallv`` and emit what this rank keeps, then what it received, in the plan's order.

Runs in the loader's producer thread, so the exchange overlaps with the consumer's work. While a rank
waits for the others to arrive at a round, it reads the next round's samples (:class:`ReadsAhead`):
a rank ahead keeps its lead instead of idling, and the rounds' imbalances do not add up. Every rank
runs the same rounds in the same order. A rank whose consumer stopped (a loop broken to checkpoint,
say) goes on reading and exchanging, discarding its own output, for as long as any other rank still
iterates: the others need what it sends. In each round's first message (the sizes each rank will
receive) the ranks also agree whether all of them have stopped, and end together when they have:
one synchronisation per round, not two.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator

import msgpack
import numpy as np

from .comm import Comm
from .comm.base import Part, Segment, Written, copy_bytes, segment_lengths, split_views
from .errors import DdpipeError
from .plan import RankPlan
from .sample import KEY, Sample, owned
from .shufflers import ExchangeRound, ReceiptLifetimes, receipt_lifetimes

# emit([(global index, sample), ...]) -> False once the consumer has stopped
Emit = Callable[[list[tuple[int, Sample]]], bool]
#: Samples handed to the consumer at a time, at most: a queue's put and get, and waking the consumer,
#: cost more than a sample's other handling (one at a time, 4 ranks took 5-8% more processor time
#: an epoch in benchmarks/exchange.py, Q = 0 and Q = 0.3 alike)
EMIT_GROUP = 32


class ExchangeShuffler:
    def __init__(self, comm: Comm, plan: RankPlan, lifetimes: ReceiptLifetimes | None = None,
                 views: bool = False) -> None:
        """``lifetimes``: how long the consumer keeps what this rank receives (:func:`receipt_lifetimes`);
        by default, as its plan says for a consumer that takes each sample as soon as it is emitted.
        ``views``: the samples go on as views, uncopied, those this rank keeps of their shards and
        those it receives of the round's buffer, for a consumer that copies or reads each batch in
        place soon after it comes (DALI, a reading process's buffer): a copy would be one more.
        Otherwise every field is a ``bytes`` of its own, whichever rank read it."""
        self.comm = comm
        self.plan = plan
        self.views = views
        self.lifetimes = lifetimes or receipt_lifetimes(plan.positions, plan.rounds, 0, len(plan.order))
        self.samples_sent = 0
        self.bytes_sent = 0
        # what the exchange costs this rank: packing, moving the bytes once every rank has arrived, and
        # unpacking (compared with raw Alltoallv); waiting for slower ranks to arrive is counted apart
        self.exchange_seconds = 0.0
        self.wait_seconds = 0.0
        # the processor time this thread spent in the exchange (copying sent samples into places, and
        # the rounds themselves, waits included: they sleep), its reads left out: on a node with fewer
        # free cores than threads, the exchange's wall time also holds the other threads' turns
        self.exchange_cpu_seconds = 0.0
        self.round_bytes: list[list[int]] = []  # bytes sent to each rank, per round

    def run(self, samples: Iterator[Sample], emit: Emit, group: int = EMIT_GROUP,
            read_while_waiting: bool = True) -> bool:
        """Read, exchange and emit every round, ``group`` samples at a time; False if every rank
        stopped before the last one. ``samples``: this rank's reads, their fields views of their
        shards or bytes: each is copied once, a sample sent from its shard into its receiver's
        place, one kept into ``bytes`` of its own (none for fields already ``bytes``); a generator
        is closed once the last round has read its samples. ``read_while_waiting``: read the next
        round's samples while waiting for the other ranks (not where reading may wait on them)."""
        reads = self.plan.reads.tolist()  # Python ints once, not a NumPy scalar per sample
        ahead = ReadsAhead(samples)
        stopped = False
        for j, rnd in enumerate(self.plan.rounds):
            following = self.plan.rounds[j + 1] if j + 1 < len(self.plan.rounds) else None
            ahead.limit = following.stop - following.start if following is not None and read_while_waiting else 0
            out = self._round(j, rnd, ahead, reads, wanted=not stopped, last=following is None)
            if out is None:  # every rank has stopped
                return False
            if not stopped:
                # the epoch's last round goes as one group: every rank hands it on at the same moment,
                # and each group put wakes the consumer once more on a node busy with all of them
                n = group if following is not None else max(len(out), 1)
                stopped = not all(emit(out[i : i + n]) for i in range(0, len(out), n))
            # what this round received may go as soon as the consumer is done with it: this thread's
            # references are gone before the next round (whose buffer the receiver takes meanwhile)
            del out
        return not stopped

    def _round(self, j: int, rnd: ExchangeRound, samples: ReadsAhead, reads: list[int], wanted: bool,
               last: bool) -> list[tuple[int, Sample]] | None:
        """Round ``j``: what this rank keeps, then what it received, in the plan's order; None if
        every rank has stopped. The kept samples wait for the round: handed on as they were read,
        one at a time they woke the consumer once a sample (8 ranks of benchmarks/loader.py: 1,029
        images/s against 1,103 without, in paired runs), and in groups they gained nothing measurable,
        while the consumer's shuffle buffer mostly needs the round's received samples to fill a batch."""
        size, start = self.comm.world.size, rnd.start  # a property: read once, not per sample
        length = rnd.stop - start
        dest_of = np.full(length, -1, dtype=np.int64)  # the rank each position goes to; -1: kept
        for positions, dest in zip(rnd.send, rnd.dests, strict=True):
            dest_of[positions - start] = dest
        # each sample sent is copied into its receiver's place as it is read, not all after the round's
        # last read (cold shards: the kernel reads the next shard in meanwhile)
        places = self.comm.places()
        writers = [SegmentWriter(places.get(d)) for d in range(size)]
        # the copies into places are the exchange's time, wall and processor (this thread reads too)
        writing = writing_cpu = 0.0
        read = 0
        out: list[tuple[int, Sample]] = []  # kept samples, then received ones
        # reads first: zip stops there, taking no sample beyond the round
        for g, d, sample in zip(reads[start : rnd.stop], dest_of.tolist(), samples, strict=False):
            read += 1
            if d < 0:  # kept: out of its shard, the one copy a read makes (none for a consumer of views)
                out.append((g, sample if self.views else owned(sample)))
            else:
                t, c = time.perf_counter(), time.thread_time()
                writers[d].add(g, sample)
                writing += time.perf_counter() - t
                writing_cpu += time.thread_time() - c
            # a view of its shard, copied by now: held until the round returns, the last one kept the
            # epoch's last shard mapped, and its unmapping (~0.5 ms) came at the epoch's end, on every
            # rank at once (8 ranks of benchmarks/exchange.py, cold: the epoch's end 2 ms later)
            del sample
        if read != length:
            raise DdpipeError(f"exchange round {j}: the reads ended {length - read} samples early")
        cpu0 = time.thread_time() - writing_cpu
        t0 = time.perf_counter() - writing
        segments = [w.finish() for w in writers]
        counts = segment_lengths(segments, size).tolist()
        t1 = time.perf_counter()
        moved, ahead_seconds, ahead_cpu = self.comm.transfer_seconds, samples.seconds, samples.cpu_seconds
        # the samples received are views into this round's own buffer, handed on uncopied
        # after the last round's reads, the last shard's mapping goes while this rank waits for the
        # others, once its own part is out: not when the epoch's last samples are (every rank at once)
        received = self.comm.alltoallv(segments, f"exchange round {j}", wanted=wanted,
                                       hold=self.lifetimes.rounds_held,
                                       while_waiting=samples.close_when_waiting if last else samples.read_one)
        if last:
            samples.close()  # if the round needed no wait
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
        # samples the consumer keeps long leave the round's buffer, so that it goes once the rest are used;
        # all of them for a consumer of bytes (a decoder of the user's own: json.loads takes no view, and
        # a sample it keeps would keep its round's buffer)
        copied = np.flatnonzero(self.lifetimes.copy_out[j]) if self.views else np.arange(len(out) - arrived)
        for i in copied.tolist():
            g, sample = out[arrived + i]
            out[arrived + i] = (g, owned(sample))
        self.exchange_seconds += (t1 - t0) + moved + (time.perf_counter() - t2)
        self.exchange_cpu_seconds += time.thread_time() - cpu0 - (samples.cpu_seconds - ahead_cpu)
        self.wait_seconds += (t2 - t1) - moved - (samples.seconds - ahead_seconds)  # reading ahead is not waiting
        return out


class ReadsAhead:
    """A rank's reads, taken in order, of which up to ``limit`` may be read ahead, one at a time, while
    the rank waits for a round (4 ranks of benchmarks/exchange.py, cold: a rank that arrived first
    otherwise idled while the others read, and each round's slowest rank set the pace). An error
    raised reading ahead is raised where its sample would have been taken."""

    def __init__(self, samples: Iterator[Sample]) -> None:
        self._samples = samples
        self._ahead: deque[Sample | _Failed] = deque()
        self.limit = 0
        self.seconds = self.cpu_seconds = 0.0  # spent reading ahead, wall and this thread's processor

    def __iter__(self) -> ReadsAhead:
        return self

    def __next__(self) -> Sample:
        if not self._ahead:
            return next(self._samples)
        item = self._ahead.popleft()
        if isinstance(item, _Failed):
            raise item.error
        return item

    def read_one(self) -> bool:
        """Read one sample ahead; False once ``limit`` are (or the reads ended or failed)."""
        if len(self._ahead) >= self.limit:
            return False
        t, c = time.perf_counter(), time.thread_time()
        try:
            self._ahead.append(next(self._samples))
        except StopIteration:
            self.limit = 0
        except Exception as e:  # raised where its sample would have been taken
            self._ahead.append(_Failed(e))
            self.limit = 0
        self.seconds += time.perf_counter() - t
        self.cpu_seconds += time.thread_time() - c
        return bool(self.limit) and len(self._ahead) < self.limit

    def close_when_waiting(self) -> bool:
        """A step to take while waiting: :meth:`close`; False, as there is nothing more to do."""
        self.close()
        return False

    def close(self) -> None:
        """Close the reads if they are a generator (their open shard's mapping goes)."""
        if isinstance(self._samples, Generator):
            self._samples.close()


class _Failed:
    def __init__(self, error: Exception) -> None:
        self.error = error


# A segment: every field's bytes back to back, then a msgpack header, then its length (u64): the
# header last, so that a sender can copy each sample into its receiver's place as it is read, before
# the header is known. The header is [keys joined by newlines (keys hold no whitespace), the
# field-name lists in use, each sample's list (uint16), the samples' global indices (int64), every
# field's length (int64)]: flat arrays rather than lists per sample, since each container alive at
# once counts towards the garbage collector's next pass (per-sample lists made it run 35 times an
# epoch instead of 3, ~5% of an epoch's time). Hand-framed rather than one msgpack object so that the
# fields go from the buffers they were read into (msgpack's packer copies, at about 1 GB/s here).
_LEN = struct.Struct("<Q")


class SegmentWriter:
    """The segment for one rank, built a sample at a time. Given the place its receiver offered
    (:meth:`Comm.places`), each sample's fields are copied there as they come, while the segment
    fits, and no view of them is kept: a view keeps its shard's mapping alive, and a round's views,
    dropped together at its end, unmapped the 3-4 shards it had read (~0.5 ms each here) between
    its exchange and the next round. A segment that outgrows its place goes as parts instead: what
    was written there, then the later fields as views."""

    def __init__(self, place: memoryview | None = None) -> None:
        self._place = place
        self._at = 0  # bytes written to the place
        self._kinds: dict[tuple[str, ...], int] = {}  # a sample's keys, in order -> its field-name list's number
        self._names_of: list[list[str]] = []
        self._keys: list[str] = []
        self._kind_of: list[int] = []
        self._indices: list[int] = []
        self._lengths: list[int] = []  # every field's
        self._fields: list[bytes | memoryview] = []  # the fields not in the place

    def add(self, index: int, sample: Sample) -> None:
        keys = tuple(sample)
        kind = self._kinds.get(keys)
        if kind is None:
            kind = self._kinds[keys] = len(self._names_of)
            self._names_of.append([k for k in keys if k != KEY])
        self._keys.append(sample[KEY])
        self._kind_of.append(kind)
        self._indices.append(index)
        fields = list(map(sample.__getitem__, self._names_of[kind]))
        lengths = list(map(len, fields))
        self._lengths.extend(lengths)
        place, at = self._place, self._at
        if place is not None and at + sum(lengths) > len(place):  # outgrown: parts from now on
            if at:
                self._fields.append(place[:at])
            self._place = place = None
        if place is None:
            self._fields.extend(fields)
            return
        for field, n in zip(fields, lengths, strict=True):
            copy_bytes(place[at : at + n], field)
            at += n
        self._at = at

    def finish(self) -> Segment:
        """The segment: :class:`Written` if it is whole in its place, else its parts (none for no samples)."""
        if not self._indices:
            return []
        trailer = self._trailer()
        place, end = self._place, self._at + len(trailer)
        if place is None or end > len(place):
            return self._parts(trailer)
        place[self._at : end] = trailer
        return Written(end)

    def parts(self) -> list[Part]:
        """The segment as its parts, the header last; none for no samples. Without a place, each
        field as it is (no copy)."""
        return self._parts(self._trailer()) if self._indices else []

    def _parts(self, trailer: bytes) -> list[Part]:
        written = [self._place[: self._at]] if self._place is not None else []
        return [*written, *self._fields, trailer]

    def _trailer(self) -> bytes:
        header: bytes = msgpack.packb(["\n".join(self._keys), self._names_of,
                                       np.array(self._kind_of, dtype=np.uint16).tobytes(),
                                       np.array(self._indices, dtype=np.int64).tobytes(),
                                       np.array(self._lengths, dtype=np.int64).tobytes()],
                                      use_bin_type=True)
        return header + _LEN.pack(len(header))


def segment_parts(items: list[tuple[int, Sample]]) -> list[Part]:
    """The segment carrying ``items`` to one rank, as its parts: each field as it is (no copy), then
    the header; none for no items."""
    writer = SegmentWriter()
    for index, sample in items:
        writer.add(index, sample)
    return writer.parts()


def unpack_segment(segment: memoryview) -> tuple[list[int], list[tuple[int, Sample]]]:
    """The global indices of one segment's samples, and the samples; their fields are views into
    ``segment`` (no copy)."""
    end = len(segment) - _LEN.size
    (header_len,) = _LEN.unpack_from(segment, end)
    keys, names_of, kind_of, indices, lengths = msgpack.unpackb(segment[end - header_len : end], raw=False)
    indices = np.frombuffer(indices, dtype=np.int64).tolist()
    views = split_views(segment, np.frombuffer(lengths, dtype=np.int64))
    items = []
    f = 0
    for g, key, kind in zip(indices, keys.split("\n"), np.frombuffer(kind_of, dtype=np.uint16).tolist(), strict=True):
        names = names_of[kind]
        sample: Sample = {KEY: key}
        sample.update(zip(names, views[f : f + len(names)], strict=True))
        f += len(names)
        items.append((g, sample))
    return indices, items
