"""One rank of the alltoallv test: rounds of segments of seeded random sizes (some empty, some rounds
many times larger than the ones before, so that the node's send slots grow mid-way and rounds that
do not fit go through MPI), each given as several buffers, each byte a function of (round, source,
destination, position), every segment checked on arrival and kept until the end to check that no
later round overwrote it; then rounds of like sizes whose views are dropped, but for some kept to the
end, so that segments land in their receivers' zones and the zones' places are reused, every other
one written there by its sender before the call (as the exchange does, sample by sample). The
buffers sent are dropped as soon as the call returns."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ddpipe.comm import init_comm
from ddpipe.comm.base import Segment, Written


def segment(turn: int, source: int, dest: int, size: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.int64) * 31 + turn * 7 + source * 13 + dest * 17) % 251).astype(np.uint8)


def sizes(turn: int, world: int) -> np.ndarray:
    rng = np.random.default_rng(turn)
    scale = 10 ** rng.integers(1, 6)  # rounds from tens of bytes to megabytes, in no order
    out = rng.integers(0, scale, size=(world, world))
    out[rng.random((world, world)) < 0.2] = 0
    return out


def parts(data: np.ndarray, turn: int) -> list[bytes]:
    """``data`` cut into pieces of varied sizes (some empty), as bytes objects of their own."""
    cuts = np.sort(np.random.default_rng(turn).integers(0, len(data) + 1, size=3))
    return [data[a:b].tobytes() for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def outgoing(comm: Any, turn: int, counts: list[int], write: bool) -> list[Segment]:
    """This rank's segments of ``turn``; with ``write``, those that fit the places their receivers
    offered written there already."""
    places = comm.places() if write else {}
    segments: list[Segment] = []
    for dest, n in enumerate(counts):
        data = segment(turn, comm.world.rank, dest, n)
        place = places.get(dest)
        if place is not None and 0 < n <= len(place):
            place[:n] = data.data
            segments.append(Written(n))
        else:
            segments.append(parts(data, turn))
    return segments


def waiting_work(comm: Any) -> int:
    """A round in which rank 0 does work of its own while it waits: the last rank arrives only once
    rank 0 has done a step of it (told over COMM_WORLD, not ddpipe's communicator), and the work stops
    when it says it has no more. The steps rank 0 took (0 on the others)."""
    from mpi4py import MPI

    rank, world = comm.world.rank, comm.world.size
    steps = 0

    def step() -> bool:
        nonlocal steps
        if steps == 0:
            MPI.COMM_WORLD.send(b"waiting", dest=world - 1, tag=7)
        steps += 1
        return steps < 3

    if rank == world - 1:
        MPI.COMM_WORLD.recv(source=0, tag=7)
    got = comm.alltoallv([[bytes([rank, d])] for d in range(world)], while_waiting=step if rank == 0 else None)
    assert got is not None and [bytes(v) for v in got] == [bytes([s, rank]) for s in range(world)]
    return steps


def main() -> None:
    out, rounds = Path(sys.argv[1]), int(sys.argv[2])
    if sys.argv[3:] == ["small-shm"]:  # a container's /dev/shm with 64 KB free: no room for slots or zones
        statvfs = os.statvfs

        def small_shm(path: Any) -> Any:
            return SimpleNamespace(f_bavail=16, f_frsize=4096) if str(path) == "/dev/shm" else statvfs(path)

        os.statvfs = small_shm
    comm = init_comm(timeout=120)
    rank, world = comm.world.rank, comm.world.size
    kept = []
    for turn in range(rounds):
        counts = sizes(turn, world)[rank].tolist()
        received = comm.alltoallv([parts(segment(turn, rank, dest, n), turn) for dest, n in enumerate(counts)])
        assert received is not None
        for source, view in enumerate(received):
            expected = segment(turn, source, rank, int(sizes(turn, world)[source][rank]))
            assert np.array_equal(np.frombuffer(view, dtype=np.uint8), expected), (turn, source)
            kept.append((turn, source, view))
    for turn, source, view in kept:
        expected = segment(turn, source, rank, int(sizes(turn, world)[source][rank]))
        assert np.array_equal(np.frombuffer(view, dtype=np.uint8), expected), ("later", turn, source)
    del kept, received, view  # their places in the zones come free
    # rounds of like sizes whose views the caller drops (all but every fourth round's, kept to the
    # end): their segments land in the receivers' zones, which take back the places of dropped views
    steady = []
    written = 0  # segments written in their receivers' places before the call
    for turn in range(rounds, 3 * rounds):
        counts = [20_000 + 1000 * (turn % 3)] * world
        segments = outgoing(comm, turn, counts, write=turn % 2 == 1)
        written += sum(isinstance(s, Written) for s in segments)
        received = comm.alltoallv(segments, hold=2)
        assert received is not None
        for source, view in enumerate(received):
            assert np.array_equal(np.frombuffer(view, dtype=np.uint8), segment(turn, source, rank, len(view)))
            assert len(view) == 20_000 + 1000 * (turn % 3), (turn, source)
            if turn % 4 == 0:
                steady.append((turn, source, view))
        del received, view
    for turn, source, view in steady:
        assert np.array_equal(np.frombuffer(view, dtype=np.uint8), segment(turn, source, rank, len(view))), \
            ("later", turn, source)
    # a round no rank wants moves nothing, on every rank
    assert comm.alltoallv([[] for _ in range(world)], wanted=False) is None
    # one rank still wanting it is enough for every rank to take part
    got = comm.alltoallv([[bytes([rank]) * 5] for _ in range(world)], wanted=rank == world - 1)
    assert got is not None and [bytes(v) for v in got] == [bytes([s]) * 5 for s in range(world)]
    steps = waiting_work(comm)
    slots = getattr(comm, "_slots", None)
    report = comm.allgather({"rank": rank, "node": comm.world.node, "slot_bytes": slots.capacity if slots else 0,
                             "landed_bytes": getattr(comm, "landed_bytes", 0), "written": written,
                             "waiting_steps": steps})
    if rank == 0:
        out.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
