"""Node-local staging of shards: one verified copy per node, ahead of the readers."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..throttle import SourceLimits
from .stager import NodeStager, StageOptions

LOCAL_DIR_ENV = "DDPIPE_LOCAL_DIR"


def default_stage_dir() -> Path:
    """``$DDPIPE_LOCAL_DIR``, else a directory under ``$TMPDIR``."""
    return Path(os.environ.get(LOCAL_DIR_ENV) or Path(tempfile.gettempdir()) / "ddpipe-stage")


__all__ = ["LOCAL_DIR_ENV", "NodeStager", "SourceLimits", "StageOptions", "default_stage_dir"]
