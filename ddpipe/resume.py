"""The state contract of every loader stage: where an epoch stands, as a plain dict, and what is left.

A state names the plan an epoch was iterated under (seed, epoch, world size, plan options, and the
samples a resumed epoch had left) and how many batches reached the caller. Loading it plans the
samples not yet yielded afresh, over however many ranks the job now has: pure, like the plan.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from .errors import DdpipeError
from .manifest import Manifest
from .plan import PlanOptions, plan_epoch

STATE_VERSION = 1
# a field's name in states written before it was renamed
_RENAMED = {"assignment": "shard_assignment"}
_KEYS = ("epoch", "seed", "batches", "world_size", "options", "pending", "num_samples")


def epoch_state(*, epoch: int, seed: int, batches: int, world_size: int, options: PlanOptions,
                pending: np.ndarray | None, num_samples: int) -> dict[str, Any]:
    """The state after the first ``batches`` batches of an epoch planned with these inputs."""
    packed = None if pending is None else np.packbits(pending).tobytes()
    return {"version": STATE_VERSION, "epoch": epoch, "seed": seed, "batches": batches, "world_size": world_size,
            "options": asdict(options), "pending": packed, "num_samples": num_samples}


def remaining(state: dict[str, Any], manifest: Manifest) -> tuple[int, int, np.ndarray]:
    """(seed, epoch, the samples not yet yielded) of ``state``, for a loader over ``manifest``."""
    if not isinstance(state, dict):
        raise DdpipeError(f"a loader state is the dict that state_dict() gives, not {type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise DdpipeError(f"loader state version {state.get('version')!r} is not supported")
    lacking = [k for k in _KEYS if k not in state]
    if lacking:
        raise DdpipeError(f"the loader state lacks {', '.join(map(repr, lacking))}: not one state_dict() gave")
    n = manifest.num_samples
    if state["num_samples"] != n:
        raise DdpipeError(f"the state is of a dataset of {state['num_samples']} samples; this one has {n}")
    old_pending = None
    if state["pending"] is not None:
        old_pending = np.unpackbits(np.frombuffer(state["pending"], dtype=np.uint8), count=n).astype(bool)
    options = PlanOptions(**{_RENAMED.get(k, k): v for k, v in state["options"].items()})
    old = plan_epoch(manifest, state["world_size"], state["seed"], state["epoch"], options, old_pending)
    left = np.zeros(n, dtype=bool)
    for r in old.ranks:
        left[r.order] = True
    left[old.yielded(state["batches"])] = False
    return int(state["seed"]), int(state["epoch"]), left
