"""How a job stages its shards (:class:`StageOptions`), and where a dataset's copies live under a
stage directory."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import xxhash

from ..dataset import Dataset
from ..errors import OptionError
from ..fields import bytes_option, local_path_option, number_option, refuse_non_boolean_flags
from ..throttle import SourceLimits
from .local_dir import node_local_dir


def stage_dir_option(stage_dir: str | os.PathLike[str]) -> Path:
    """``stage_dir`` as a Path, refused where it names no local directory (:func:`local_path_option`)."""
    return local_path_option(stage_dir, "stage_dir", "a node-local directory", unset="None for no staging")


@dataclass(frozen=True)
class StageOptions:
    """Node-local staging. ``stage_dir``: one name for the whole job, which each node resolves to its
    own directory (``"auto"``, ``{node}``, ``{host}``, ``$VAR``: :mod:`ddpipe.staging.local_dir`)."""

    stage_dir: Path
    capacity: int | None = None  # bytes on the node's local storage (or their text, "100GB"); None: the whole share
    limits: SourceLimits | None = None  # a slow source, for tests and benchmarks
    wait_timeout: float = 600.0  # how long a reader waits for one shard's copy
    peers: bool = True  # fetch a shard another node holds from that node rather than the source

    def __post_init__(self) -> None:
        refuse_non_boolean_flags(self, prefix="stage_")
        object.__setattr__(self, "stage_dir", stage_dir_option(self.stage_dir))  # a str given is kept as a Path
        if self.capacity is not None:
            object.__setattr__(self, "capacity", bytes_option(self.capacity, "stage_capacity"))
        if not number_option(self.wait_timeout, "stage_wait_timeout") > 0:  # NaN too
            raise OptionError(f"stage_wait_timeout must be positive, not {self.wait_timeout}")

    def on_node(self, node: int, host: str, environ: Mapping[str, str], limits: SourceLimits | None) -> StageOptions:
        """These options as one node takes them: its own directory, and the source's ``limits`` where
        none are given here."""
        return dataclasses.replace(self, stage_dir=node_local_dir(self.stage_dir, node, host, environ),
                                   limits=self.limits or limits)


def dataset_stage_dir(root: Path, dataset: Dataset) -> Path:
    """Where a dataset's copies live under a stage directory: named by its shard checksums, so two
    jobs staging the same dataset share copies and different datasets never mix."""
    h = xxhash.xxh3_64("".join(s.checksum for s in dataset.manifest.shards).encode()).hexdigest()
    return root / f"ddpipe-{h}"
