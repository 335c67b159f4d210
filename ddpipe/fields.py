"""Fields of plain documents that reach ddpipe from files (``index.json``, an adopted dataset's
``layout``, a loader state in a checkpoint), each checked to be what it must be before it is used:
a ValueError naming the field otherwise, which each reader turns into its own error."""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
import os
from pathlib import Path
from typing import Any

from .errors import OptionError

MISSING: Any = object()  # no default: the field must be there


def kind_of(value: object) -> str:
    """JSON's name for ``value``'s kind where it has one (null), else Python's."""
    return "null" if value is None else type(value).__name__


def checked(doc: dict[str, Any], key: str, kind: type, what: str | None = None, default: Any = MISSING) -> Any:
    """``doc[key]``, which must be a ``kind`` and not a boolean (JSON's booleans are no numbers or
    names here); ``default`` where it is absent, if given. The error says it must be ``what``,
    quoting the value, or, without ``what``, a ``kind``, naming the value's kind."""
    if key not in doc:
        if default is MISSING:
            raise ValueError(f"no {key!r}")
        return default
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        must = what if what is not None else f"a {kind.__name__}"
        raise ValueError(f"{key!r} must be {must}, not {repr(value) if what is not None else kind_of(value)}")
    return value


def whole_number(value: Any, what: str, least: int | None = 0, below: int | None = None) -> int:
    """``value`` as an int: a whole number (numpy's integers too, as a document loaded again may hold;
    not a boolean or a fraction) of at least ``least`` (None: any) and below ``below`` (None: any)."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or (least is not None and number < least) or (below is not None and number >= below):
        at_least = f" of at least {least}" if least is not None else ""
        raise ValueError(f"{what} must be a whole number{at_least}, not {value!r}")
    return number


def whole_option(value: Any, name: str, least: int | None = None) -> int:
    """An option that counts: :func:`whole_number`, refused as an :class:`OptionError` (a fraction
    or a string reached deep inside before: a fractional size, shared memory's size, which leaked it)."""
    try:
        return whole_number(value, name, least)
    except ValueError as e:
        raise OptionError(str(e)) from None


def seed_option(value: Any, name: str = "seed") -> int:
    """A seed: a whole number of numpy's and torch's int64 range, where each draws streams of its own
    (past it, seeds were folded onto others: 2**63 drew seed 0's shard order)."""
    from .seeding import SEED_BELOW, SEED_LEAST

    seed = whole_option(value, name)
    if not SEED_LEAST <= seed < SEED_BELOW:
        raise OptionError(f"{name} must be a whole number from -2**63 to 2**63 - 1, not {seed}")
    return seed


def bytes_option(value: Any, name: str) -> int:
    """An option that is a number of bytes: a whole number, or a size's text as the command line
    takes it ("100GB": :func:`ddpipe.units.parse_size`), at least one byte; an :class:`OptionError`
    naming ``name`` otherwise (a string or a list was compared deep inside: TypeError's traceback)."""
    from .units import parse_size

    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as e:
            raise OptionError(f"{name}: {e}") from None
    if isinstance(value, float) and 1 <= value < math.inf:  # a share of a disk, 0.8 * its bytes
        return int(value)
    try:
        return whole_number(value, name, least=1)
    except ValueError:
        raise OptionError(f"{name} must be a whole number of bytes, at least 1, or a size such as '100GB', "
                          f"not {value!r}") from None


def local_path_option(value: Any, name: str, what: str, unset: str = "None") -> Path:
    """An option naming ``what`` on this machine (a file, a node-local directory), as a Path: a number
    was pathlib's TypeError, "" became "." (the working directory) and a URL a local "s3:/bucket/x"
    (made in the working directory); each is refused naming ``name``. ``unset``: what to give for none."""
    from .storage.location import is_remote

    if not isinstance(value, (str, os.PathLike)):
        raise OptionError(f"{name} must be a path, not {type(value).__name__} {value!r}")
    if isinstance(value, str) and not value.strip():
        raise OptionError(f"{name} is empty: name {what}, or {unset}")
    if is_remote(value):
        raise OptionError(f"{name} is {what}, not an object store's URL: {value}")
    return Path(value)


def refuse_non_boolean_flags(options: Any, prefix: str = "") -> None:
    """Each field of the dataclass ``options`` declared ``bool`` must hold True or False: a string
    from a configuration file ("no", "false") was taken as true (verify="no" verified), None as
    false. ``prefix``: what the keyword adds to the field's name (staging's ``stage_``)."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if f.type in ("bool", bool) and not isinstance(value, bool):
            raise OptionError(f"{prefix}{f.name} must be True or False, not {value!r}")


def is_real(value: object) -> bool:
    """A real number, and not a boolean (an int to Python, never a rate or a share here)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def number_option(value: Any, name: str) -> float:
    """An option that is a real number: a boolean, a string or None is refused naming ``name`` (each
    was compared with a number deep inside: TypeError's traceback)."""
    if not is_real(value):
        raise OptionError(f"{name} must be a number, not {value!r}")
    return float(value)

