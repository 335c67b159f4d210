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
from .fields import whole_number
from .manifest import Manifest
from .plan import PlanOptions, plan_epoch

STATE_VERSION = 1
# a field's name in states written before it was renamed
_RENAMED = {"assignment": "shard_assignment"}
MAX_WORLD = 1 << 20  # ranks: more than any job has had
_KEYS = ("epoch", "seed", "batches", "world_size", "options", "pending", "num_samples")


def epoch_state(*, epoch: int, seed: int, batches: int, world_size: int, options: PlanOptions,
                pending: np.ndarray | None, manifest: Manifest) -> dict[str, Any]:
    """The state after the first ``batches`` batches of an epoch planned with these inputs."""
    packed = None if pending is None else np.packbits(pending).tobytes()
    return {"version": STATE_VERSION, "epoch": epoch, "seed": seed, "batches": batches, "world_size": world_size,
            "options": asdict(options), "pending": packed, "num_samples": manifest.num_samples,
            "dataset": manifest.content_id}


def remaining(state: dict[str, Any], manifest: Manifest) -> tuple[int, int, np.ndarray]:
    """(seed, epoch, the samples not yet yielded) of ``state``, for a loader over ``manifest``."""
    _check_of_this_dataset(state, manifest)
    n = manifest.num_samples
    seed, epoch = _whole(state, "seed", None), _whole(state, "epoch", 0)
    batches, world_size = _whole(state, "batches", 0), _whole(state, "world_size", 1)
    if world_size > MAX_WORLD:  # the old epoch is planned again over the old world, rank by rank
        raise DdpipeError(f"the loader state's 'world_size' must be at most {MAX_WORLD}, not {world_size}")
    pending = _pending(state, n)
    old = plan_epoch(manifest, world_size, seed, epoch, _plan_options(state), pending)
    if batches > old.num_batches:
        raise DdpipeError(f"the loader state is {batches} batches into an epoch of {old.num_batches}")
    left = np.zeros(n, dtype=bool)
    for r in old.ranks:
        left[r.order] = True
    left[old.yielded(batches)] = False
    return seed, epoch, left


def _check_of_this_dataset(state: dict[str, Any], manifest: Manifest) -> None:
    """Refuse what is no state_dict() (of this version), or one of another dataset than ``manifest``."""
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
    # absent from states written before it was recorded; the same count of samples in other shards (the
    # same images converted again, say) would resume with other samples than the epoch had left
    if state.get("dataset", manifest.content_id) != manifest.content_id:
        raise DdpipeError(f"the state is of another dataset: as many samples ({n}), in other shards or other "
                          "files; resume over the dataset it was saved from")


def _pending(state: dict[str, Any], n: int) -> np.ndarray | None:
    """The samples the saved epoch had still to yield as it began (itself resumed), if any."""
    if state["pending"] is None:
        return None
    if not isinstance(state["pending"], bytes) or len(state["pending"]) != (n + 7) // 8:
        raise DdpipeError(f"the loader state's 'pending' must be {(n + 7) // 8} bytes (a bit a sample) or None")
    pending: np.ndarray = np.unpackbits(np.frombuffer(state["pending"], dtype=np.uint8), count=n).astype(bool)
    return pending


def _plan_options(state: dict[str, Any]) -> PlanOptions:
    try:
        saved: dict[str, Any] = dict(state["options"])
        return PlanOptions(**{_RENAMED.get(k, k): v for k, v in saved.items()})
    except (TypeError, ValueError) as e:  # an OptionError, for a value no plan takes, is raised as it is
        if isinstance(e, DdpipeError):
            raise
        raise DdpipeError(f"the loader state's 'options' are not a plan's options: {e}") from None


def _whole(state: dict[str, Any], key: str, least: int | None) -> int:
    """``state[key]``, a whole number of at least ``least``; else a DdpipeError naming the key."""
    try:
        return whole_number(state[key], f"the loader state's {key!r}", least)
    except ValueError as e:
        raise DdpipeError(str(e)) from None
