"""What every rank of a job must hold alike before it plans an epoch. Each rank plans the whole job's
epoch for itself (:func:`ddpipe.plan.plan_epoch`), so ranks given different datasets, plan options or
seeds plan apart: samples are read twice or never, with no error, or ranks wait for each other. A
node-local copy of a dataset that is stale or partial on one node did that silently. The ranks of a
node must also share one staging directory (they share one staged copy of each shard)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from .comm import Comm
from .errors import DdpipeError
from .plan import PlanOptions


@dataclass(frozen=True)
class RankView:
    """What one rank was given: its node and host, its dataset (:attr:`Manifest.content_id` and counts
    to name it by), its plan options and seed, and its staging directory (None: none)."""

    node: int
    host: str
    dataset: str
    samples: int
    shards: int
    plan: PlanOptions
    seed: int
    stage_dir: str | None

    def where(self, rank: int) -> str:
        return f"rank {rank} on {self.host or f'node {self.node}'}"


def disagreement(views: list[RankView]) -> str:
    """Why the ranks whose views these are (by rank) cannot plan one epoch together; "" if they can."""
    first = views[0]
    for rank, view in enumerate(views):
        if view.dataset != first.dataset:
            return (f"the ranks read different datasets: {first.where(0)} has {first.samples} samples in "
                    f"{first.shards} shards, {view.where(rank)} has {view.samples} in {view.shards}"
                    f"{' (other contents)' if (view.samples, view.shards) == (first.samples, first.shards) else ''}; "
                    "give every rank the same dataset (a node-local copy must be whole and current)")
        differ = [f.name for f in dataclasses.fields(PlanOptions)
                  if getattr(view.plan, f.name) != getattr(first.plan, f.name)]
        if differ or view.seed != first.seed:
            name = differ[0] if differ else "seed"
            ours, theirs = ((getattr(v.plan, name) if differ else v.seed) for v in (first, view))
            return (f"the ranks were given different options: {name} {ours!r} on {first.where(0)}, {theirs!r} on "
                    f"{view.where(rank)}; give every rank the same")
    named: dict[int, set[str | None]] = {}  # by node, in rank order: one pass over thousands of ranks
    for view in views:
        named.setdefault(view.node, set()).add(view.stage_dir)
    for node, dirs in named.items():
        if len(dirs) > 1:
            a, b = sorted(dirs, key=str)[:2]
            return (f"ranks of node {node} were given different staging directories: {a or 'none'} and "
                    f"{b or 'none'}; give every rank of a node the same one")
    return ""


def check_ranks_agree(comm: Comm, mine: RankView, dataset: str | Path) -> None:
    """Refuse, on every rank at once, a job whose ranks were given what :func:`disagreement` refuses."""
    if comm.world.size == 1:
        return
    why = disagreement(comm.allgather(mine))
    if why:
        raise DdpipeError(why, path=dataset).everywhere()
