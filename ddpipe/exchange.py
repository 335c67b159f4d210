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

import struct
import time
from collections.abc import Callable, Iterator

import msgpack
import numpy as np

from .comm import Comm
from .errors import DdpipeError
from .plan import RankPlan
from .sample import KEY, Sample

# emit((global index, sample)) -> False once the consumer has stopped
Emit = Callable[[tuple[int, Sample]], bool]


class ExchangeShuffler:
    def __init__(self, comm: Comm, plan: RankPlan) -> None:
        self.comm = comm
        self.plan = plan
        self.samples_sent = 0
        self.bytes_sent = 0
        # what the exchange costs this rank: packing, moving the bytes once every rank has arrived, and
        # unpacking (compared with raw Alltoallv); waiting for slower ranks to arrive is counted apart
        self.exchange_seconds = 0.0
        self.wait_seconds = 0.0
        self.round_bytes: list[list[int]] = []  # bytes sent to each rank, per round

    def run(self, samples: Iterator[Sample], emit: Emit) -> bool:
        """Read, exchange and emit every round; False if every rank stopped before the last one."""
        plan, size = self.plan, self.comm.world.size
        stopped = False
        for j, rnd in enumerate(plan.rounds):
            chunk = [next(samples) for _ in range(rnd.stop - rnd.start)]
            outgoing: list[list[tuple[int, Sample]]] = [[] for _ in range(size)]
            sent: set[int] = set()
            for positions, dest in zip(rnd.send, rnd.dests, strict=True):
                outgoing[dest] = [(int(plan.reads[p]), chunk[p - rnd.start]) for p in positions.tolist()]
                sent.update(positions.tolist())
            t0 = time.perf_counter()
            send, counts = pack_segments(outgoing, self.comm.send_buffer)
            t1 = time.perf_counter()
            moved = self.comm.transfer_seconds
            # keep: the samples received are views into this round's own buffer, handed on uncopied
            received = self.comm.alltoallv(send, counts, f"exchange round {j}", keep=True, wanted=not stopped)
            if received is None:  # every rank has stopped
                return False
            t2 = time.perf_counter()
            self.samples_sent += len(sent)
            self.round_bytes.append(counts)
            self.bytes_sent += sum(counts)
            moved = self.comm.transfer_seconds - moved
            out: list[tuple[int, Sample]] = [(int(plan.reads[p]), chunk[p - rnd.start])
                                             for p in range(rnd.start, rnd.stop) if p not in sent]
            for source, expected in zip(rnd.sources, rnd.recv, strict=True):
                items = unpack_segment(received[source]) if expected.size else []
                if [g for g, _ in items] != expected.tolist():
                    raise DdpipeError(f"exchange round {j}: rank {source} sent samples the plan does not expect; "
                                      "do all ranks run the same ddpipe version, dataset and options?")
                out.extend(items)
            self.exchange_seconds += (t1 - t0) + moved + (time.perf_counter() - t2)
            self.wait_seconds += (t2 - t1) - moved
            if not stopped:
                for item in out:
                    if not emit(item):
                        stopped = True
                        break
        return not stopped


# A segment: u64 header length, a msgpack header [[index, key, [[field, length], ...]], ...], then
# every field's bytes back to back. Hand-framed rather than one msgpack object because the bulk is
# then copied once, straight into the MPI send buffer (msgpack's packer measured about 1 GB/s here).
_LEN = struct.Struct("<Q")


def pack_segments(outgoing: list[list[tuple[int, Sample]]],
                  allocate: Callable[[int], np.ndarray] | None = None) -> tuple[np.ndarray, list[int]]:
    """A send buffer holding a segment per destination rank, and each segment's length. The buffer
    is ``allocate(bytes needed)`` (``Comm.send_buffer``: reused, or shared with the node's ranks),
    or a new one."""
    headers, counts = [], []
    for items in outgoing:
        if not items:
            headers.append(b"")
            counts.append(0)
            continue
        meta = [[g, s[KEY], [[k, len(v)] for k, v in s.items() if k != KEY]] for g, s in items]
        header = msgpack.packb(meta, use_bin_type=True)
        headers.append(header)
        counts.append(_LEN.size + len(header) + sum(length for _, _, f in meta for _, length in f))
    buffer = np.empty(sum(counts), dtype=np.uint8) if allocate is None else allocate(sum(counts))
    view = buffer.data
    at = 0
    for items, header in zip(outgoing, headers, strict=True):
        if not items:
            continue
        view[at : at + _LEN.size] = _LEN.pack(len(header))
        at += _LEN.size
        view[at : at + len(header)] = header
        at += len(header)
        for _, sample in items:
            for k, v in sample.items():
                if k != KEY:
                    view[at : at + len(v)] = v
                    at += len(v)
    return buffer, counts


def unpack_segment(segment: memoryview) -> list[tuple[int, Sample]]:
    """The samples of one segment; their fields are views into ``segment`` (no copy), which must
    therefore outlive them (``alltoallv(..., keep=True)``)."""
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
