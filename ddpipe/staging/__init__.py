"""Node-local staging of shards: one verified copy per node, ahead of the readers."""

from __future__ import annotations

from ..throttle import SourceLimits
from .local_dir import LOCAL_DIR_ENV, default_stage_dir, node_local_dir
from .options import StageOptions
from .stager import NodeStager

__all__ = ["LOCAL_DIR_ENV", "NodeStager", "SourceLimits", "StageOptions", "default_stage_dir", "node_local_dir"]
