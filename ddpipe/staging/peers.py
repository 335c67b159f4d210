"""Peer staging: a shard that another node has staged is fetched from that node, over the job's
network, instead of from the shared file system.

At the start of each epoch's staging the node leaders share what their local directories hold, one
bit per shard (a few hundred bytes for ImageNet): one collective, and it tells every node who holds
what whatever put it there (this job's earlier epochs with ``rotate`` assignment, eviction under a
capacity, or an earlier job on another node count). Deriving it from plans alone would miss copies
made by earlier jobs and those evicted since. Fetched bytes are hashed on the way and checked against
the manifest, as copies from the source are; a peer that no longer has the shard, does not answer,
or sends bytes that fail the check leaves the shard to be copied from the source.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..comm.base import PeerLink
from ..errors import ChecksumMismatchError
from ..manifest import ShardInfo
from ..shard_copy import write_verified

# how long a node waits for a peer to start answering before copying from the source instead
PEER_TIMEOUT = 10.0


def inventory_bits(held: Sequence[int], num_shards: int) -> bytes:
    """The shards a node holds, one bit each."""
    bits = np.zeros(num_shards, dtype=bool)
    bits[list(held)] = True
    return np.packbits(bits).tobytes()


def holders(inventories: Sequence[bytes | None], node_of_rank: Sequence[int], my_node: int,
            num_shards: int) -> dict[int, int]:
    """For each shard some other node holds, the leader rank to fetch it from. ``inventories[r]`` is
    rank ``r``'s :func:`inventory_bits`, None for ranks that lead no node. Among several holders, the
    choice rotates with the shard and the asking node, so that nodes refilling at once spread their
    requests over the holders."""
    held_by: dict[int, list[int]] = {}
    for rank, bits in enumerate(inventories):
        if bits is None or node_of_rank[rank] == my_node:
            continue
        mask = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), count=num_shards).astype(bool)
        for shard in np.flatnonzero(mask).tolist():
            held_by.setdefault(shard, []).append(rank)
    return {shard: ranks[(shard + my_node) % len(ranks)] for shard, ranks in held_by.items()}


def fetch_from_peer(link: PeerLink, rank: int, shard: int, dest: Path, info: ShardInfo) -> bool:
    """Fetch ``shard`` from ``rank`` into ``dest`` (renamed into place once its checksum matches the
    manifest's); False, leaving ``dest`` as it was, if the peer could not give it or gave other bytes."""
    try:
        return write_verified(dest, info, lambda write: link.fetch(rank, shard, write, PEER_TIMEOUT), named=dest)
    except ChecksumMismatchError as error:
        print(f"ddpipe: warning: the copy from rank {rank}: {error}; copying from the source instead",
              file=sys.stderr, flush=True)
        return False
    except OSError:  # a full disk, say: the copy from the source meets it too, and says so
        return False
