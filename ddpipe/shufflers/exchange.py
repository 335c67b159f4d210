"""Carrying out ``partial``'s plan over MPI: each round, send the chosen encoded samples with one
``Alltoallv`` and emit what this rank keeps, then what it received, in the plan's order.

Runs in the loader's producer thread, so the exchange overlaps with the consumer's work. Every rank
runs the same rounds in the same order; before each round the ranks agree whether any of them has
stopped iterating, so a loop broken on every rank (to checkpoint, say) never leaves one waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import msgpack

from ..comm import Comm
from ..errors import DdpipeError
from ..plan import RankPlan
from ..sample import Sample

# emit((global index, sample)) -> False once the consumer has stopped
Emit = Callable[[tuple[int, Sample]], bool]


class ExchangeShuffler:
    def __init__(self, comm: Comm, plan: RankPlan) -> None:
        self.comm = comm
        self.plan = plan
        self.samples_sent = 0
        self.bytes_sent = 0
        self.exchange_seconds = 0.0  # inside the collectives, for comparison with raw Alltoallv
        self.round_bytes: list[list[int]] = []  # bytes sent to each rank, per round

    def run(self, samples: Iterator[Sample], emit: Emit) -> bool:
        """Read, exchange and emit every round; False if the epoch was stopped early on some rank."""
        plan, size = self.plan, self.comm.world.size
        stopped = False
        for j, rnd in enumerate(plan.rounds):
            if self.comm.allreduce_max(int(stopped), f"exchange round {j} (agreement)"):
                return False
            chunk = [next(samples) for _ in range(rnd.stop - rnd.start)]
            payloads = [b""] * size
            sent: set[int] = set()
            for positions, dest in zip(rnd.send, rnd.dests, strict=True):
                # one msgpack array per destination: one copy of the bytes, one object to unpack
                payloads[dest] = msgpack.packb([(int(plan.reads[p]), chunk[p - rnd.start]) for p in positions.tolist()],
                                               use_bin_type=True)
                sent.update(positions.tolist())
            self.samples_sent += len(sent)
            self.round_bytes.append([len(p) for p in payloads])
            self.bytes_sent += sum(self.round_bytes[-1])
            t0 = time.perf_counter()
            received = self.comm.alltoall_bytes(payloads, f"exchange round {j}")
            self.exchange_seconds += time.perf_counter() - t0
            out: list[tuple[int, Sample]] = [(int(plan.reads[p]), chunk[p - rnd.start])
                                             for p in range(rnd.start, rnd.stop) if p not in sent]
            for source, expected in zip(rnd.sources, rnd.recv, strict=True):
                items = [(int(g), s) for g, s in msgpack.unpackb(received[source], raw=False)] if expected.size else []
                if [g for g, _ in items] != expected.tolist():
                    raise DdpipeError(f"exchange round {j}: rank {source} sent samples the plan does not expect; "
                                      "do all ranks run the same ddpipe version, dataset and options?")
                out.extend(items)
            if not stopped:
                for item in out:
                    if not emit(item):
                        stopped = True
                        break
        return not stopped
