"""Which node-local directory a node stages into: one name for the whole job, resolved per node.

A job names its local directory once, for every node; on a real cluster that is usually a path in
the node's environment (``$SLURM_TMPDIR``, ``$TMPDIR``) or the same path on every node's own disk.
Where several nodes share one file system (emulated nodes on one machine, or a shared scratch
directory) they need different directories: ``{node}`` in the name gives each its own.
"""

from __future__ import annotations

import glob
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
    its host name, ``$VAR`` or ``${VAR}`` the variable from the node's environment, a leading ``~``
    its ``$HOME``, and ``"auto"`` the environment's choice (:func:`default_stage_dir`)."""
    return Path(_expanded(template, environ, f"node {node}").format(node=node, host=host))


def visible_local_dirs(template: str | os.PathLike[str], host: str, environ: Mapping[str, str]) -> list[Path]:
    """The directories ``template`` names that exist on this machine (``host``, ``environ``), for
    checking a stage after the job: every node's where the name has ``{node}`` (on a shared file
    system, or emulated nodes), in node order; else the one this machine's node would use."""
    text = _expanded(template, environ, "this machine")
    if "node" not in _fields(text, template):
        return [p for p in [Path(text.format(host=host))] if p.is_dir()]
    pieces = text.format(node=_NodeMark(), host=host).split(_NodeMark.MARK)
    found: dict[int, Path] = {}
    named = re.compile("(.+?)".join(re.escape(p) for p in pieces))
    for match in glob.glob("*".join(glob.escape(p) for p in pieces)):
        m = named.fullmatch(match)
        nodes = {g for g in m.groups() if g.isdecimal()} if m else set()
        for node in map(int, nodes):  # the name read back: a directory the template would not make is not a node's
            if str(node_local_dir(template, node, host, environ)) == match and Path(match).is_dir():
                found[node] = Path(match)
    return [found[n] for n in sorted(found)]


class _NodeMark:
    """Stands for ``{node}`` whatever its format spec, so a template can be turned into a pattern."""

    MARK = "\x00"

    def __format__(self, spec: str) -> str:
        return self.MARK


def _expanded(template: str | os.PathLike[str], environ: Mapping[str, str], where: str) -> str:
    """``template`` with ``"auto"``, ``~`` and ``$VAR`` replaced and its ``{fields}`` checked, still to be
    formatted."""
    text = str(default_stage_dir(environ) if str(template) == "auto" else template)
    if text == "~" or text.startswith("~/"):
        text = "$HOME" + text[1:]

    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in environ:
            raise DdpipeError(f"the local directory {text!r} names ${name}, which is not set on {where}")
        return environ[name]

    text = _VAR.sub(var, text)
    _fields(text, template)
    return text


def _fields(text: str, template: str | os.PathLike[str]) -> set[str]:
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
    except ValueError as e:
        raise DdpipeError(f"the local directory {str(template)!r} is not a valid template: {e}") from None
    unknown = sorted(fields - set(FIELDS))
    if unknown:
        raise DdpipeError(f"the local directory {str(template)!r} names {{{unknown[0]}}}; "
                          f"it may name {', '.join('{' + f + '}' for f in FIELDS)} and $VARIABLES")
    return fields
