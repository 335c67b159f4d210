"""Run under mpiexec as 2 nodes by test_nodes_mpi.py: rank 1 serves files, rank 0 asks for them.

argv: DIR  (DIR/shard.bin is served as item 0 and, once rank 0 has given up on it, as item 2; item 1
is one rank 1 no longer has)"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from ddpipe.checksum import file_checksum
from ddpipe.comm import init_comm
from ddpipe.manifest import ShardInfo
from ddpipe.staging.peers import fetch_from_peer


def main() -> None:
    root = Path(sys.argv[1])
    comm = init_comm(timeout=60)
    link = comm.peer_link()
    assert link is not None
    served = root / "shard.bin"
    given_up = threading.Event()

    def lookup(item: int) -> str | None:
        if item == 2:  # answer only once the requester has stopped waiting
            given_up.wait(60)
        return str(served) if item in (0, 2) else None

    if comm.world.rank == 1:
        link.serve(lookup)
    comm.barrier()
    if comm.world.rank == 0:
        info = ShardInfo(file="shard.bin", samples=1, bytes=served.stat().st_size, checksum=file_checksum(served))
        got = root / "got" / "shard.bin"
        got.parent.mkdir()
        assert fetch_from_peer(link, 1, 0, got, info) and got.read_bytes() == served.read_bytes()
        print("fetched", flush=True)
        assert not fetch_from_peer(link, 1, 1, root / "got" / "missing.bin", info)
        assert not (root / "got" / "missing.bin").exists()
        print("refused", flush=True)
        other = ShardInfo(file="shard.bin", samples=1, bytes=info.bytes, checksum="xxh3_64:0000000000000000")
        wrong = root / "got" / "wrong.bin"
        wrong.write_bytes(b"kept")
        assert not fetch_from_peer(link, 1, 0, wrong, other) and wrong.read_bytes() == b"kept"
        print("checked", flush=True)
        import ddpipe.staging.peers as peers

        patience, peers.PEER_TIMEOUT = peers.PEER_TIMEOUT, 0.5
        assert not fetch_from_peer(link, 1, 2, root / "got" / "abandoned.bin", info)
        peers.PEER_TIMEOUT = patience
    comm.barrier()
    if comm.world.rank == 1:
        given_up.set()  # the answer to the abandoned request goes out now, to no one
    else:  # and the server still serves the next request
        again = root / "got" / "again.bin"
        assert fetch_from_peer(link, 1, 0, again, info) and again.read_bytes() == served.read_bytes()
        print("abandoned", flush=True)
    comm.barrier()
    if comm.world.rank == 1:
        link.close()  # a peer that has stopped answering
    comm.barrier()
    if comm.world.rank == 0:
        import ddpipe.staging.peers as peers

        peers.PEER_TIMEOUT = 0.5
        assert not fetch_from_peer(link, 1, 0, root / "got" / "late.bin", info)
        print("gone", flush=True)
    comm.barrier()


if __name__ == "__main__":
    main()
