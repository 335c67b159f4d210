"""Whether two nodes of a job stage into one directory: one that a shared file system gives them both.

A staging directory named without ``{node}`` is one directory per node on node-local disks, but one
for the whole job on a shared file system. Without a capacity that is harmless (the nodes share the
copies, each locked while it is made). With one, each node's leader counts the other's copies
against its own capacity and evicts them (they are not in its plan), so the other node's readers
waited for shards its stager had already made: a job of two emulated nodes with a capacity hung in
three of five runs. Names cannot tell (``/tmp/stage`` is node-local on one cluster and shared on
another), so the leaders look: each leaves a marker of its own in its directory, and looks for the
markers of the nodes that name the same directory once every marker is made (nodes whose names
differ, with ``{node}`` in them, are taken to differ). Each marker's name is new (a random one), so
no client of a network file system holds a cached "no such file" for it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from ..comm import Comm
from ..errors import OptionError
from ..formats.atomic import discard


def first_shared(seen: list[tuple[int, int | None]]) -> tuple[int, int] | None:
    """The first pair of nodes (lower first) of which one found the other's marker, from each leader's
    ``(node, the node whose marker it found, or None)``; None if none did."""
    pairs = sorted((min(node, other), max(node, other)) for node, other in seen if other is not None)
    return pairs[0] if pairs else None


def nodes_sharing(comm: Comm, directory: Path, leader: bool) -> tuple[int, int] | None:
    """Two nodes whose leaders see one ``directory`` (see the module); every rank of the job calls it
    and gets the same answer. ``leader``: this rank looks for its node."""
    marker = f".ddpipe-node-{uuid.uuid4().hex}" if leader else None
    if marker is not None:
        (directory / marker).touch()
    try:
        markers = comm.allgather((comm.world.node, str(directory), marker))  # once gathered, every marker is made
        # a leader looks only for the markers of nodes that name the same directory, and stops at the
        # first it finds: on a shared file system, one lookup rather than one per node of the job
        others = [(node, theirs) for node, named, theirs in markers
                  if leader and theirs is not None and node != comm.world.node and named == str(directory)]
        sharer = next((node for node, theirs in others if (directory / theirs).exists()), None)
        seen = comm.allgather((comm.world.node, sharer))  # once gathered, every leader has looked
    finally:
        if marker is not None:
            discard(directory / marker)
    return first_shared(seen)


def refuse_a_shared_capacity(comm: Comm, stage_dir: Path, directory: Path, leader: bool) -> None:
    """Refuse, on every rank at once, a capacity for a directory two nodes share. ``stage_dir``: the
    staging directory as named (``directory`` is the dataset's own under it)."""
    shared = nodes_sharing(comm, directory, leader)
    if shared is not None:
        raise OptionError(f"nodes {shared[0]} and {shared[1]} stage into one directory, {stage_dir} (a file system "
                          "they share), where a staging capacity has each node evict the other's copies: give each "
                          "node its own directory ({node} in the name: "
                          f"{stage_dir / 'node{node}'}), or give no capacity").everywhere()
