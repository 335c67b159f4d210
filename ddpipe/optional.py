"""Optional dependencies: whether one is installed, asked without importing it."""

from __future__ import annotations

import importlib.util


def installed(module: str) -> bool:
    """``module`` (dotted) can be imported. ``find_spec("nvidia.dali")`` raises, rather than answer
    no, where the parent package ``nvidia`` itself is missing."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
