"""Which node-local directory a node stages into: one name for the whole job, resolved per node.

A job names its local directory once, for every node; on a real cluster that is usually a path in
the node's environment (``$SLURM_TMPDIR``, ``$TMPDIR``) or the same path on every node's own disk.
Where several nodes share one file system (emulated nodes on one machine, or a shared scratch
directory) they need different directories: ``{node}`` in the name gives each its own.
"""

from __future__ import annotations

import os
import re
import string
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..errors import DdpipeError

LOCAL_DIR_ENV = "DDPIPE_LOCAL_DIR"
FIELDS = ("node", "host")
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def default_stage_dir(environ: Mapping[str, str]) -> Path:
    """``$DDPIPE_LOCAL_DIR``, else a directory under ``$TMPDIR``."""
    return Path(environ.get(LOCAL_DIR_ENV) or Path(tempfile.gettempdir()) / "ddpipe-stage")


def node_local_dir(template: str | os.PathLike[str], node: int, host: str, environ: Mapping[str, str]) -> Path:
    """``template`` for one node: ``{node}`` becomes the node's index in the job (0, 1, ...), ``{host}``
    its host name, ``$VAR`` or ``${VAR}`` the variable from the node's environment, and a leading ``~``
    its ``$HOME``."""
    text = str(template)
    if text == "~" or text.startswith("~/"):
        text = "$HOME" + text[1:]

    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in environ:
            raise DdpipeError(f"the local directory {text!r} names ${name}, which is not set on node {node}")
        return environ[name]

    text = _VAR.sub(var, text)
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as e:
        raise DdpipeError(f"the local directory {str(template)!r} is not a valid template: {e}") from None
    unknown = sorted({f for f in fields if f not in FIELDS})
    if unknown:
        raise DdpipeError(f"the local directory {str(template)!r} names {{{unknown[0]}}}; "
                          f"it may name {', '.join('{' + f + '}' for f in FIELDS)} and $VARIABLES")
    return Path(text.format(node=node, host=host))
