"""Sizes as people write them: ``256MB``, ``1GiB``, ``100MB/s``."""

from __future__ import annotations

import math

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_size(text: str) -> int:
    """``"256MB"`` -> 256000000; ``"1GiB"`` -> 1073741824; a bare number is bytes."""
    s = text.strip().upper().replace(" ", "")
    number = s.rstrip("KMGTIB")
    unit = s[len(number):]
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"cannot parse size {text!r}: use e.g. 256MB, 1GiB or 1000000") from None
    if unit not in _UNITS or value < 0 or number.startswith(("-", "+")):
        raise ValueError(f"cannot parse size {text!r}: use e.g. 256MB, 1GiB or 1000000")
    if not math.isfinite(value):  # float() reads 'inf' and 'nan' too: int() of them raised
        raise ValueError(f"size {text!r} is not a number of bytes: use e.g. 256MB, 1GiB or 1000000")
    if value * _UNITS[unit] < 1:
        raise ValueError(f"size {text!r} is less than one byte")
    return int(value * _UNITS[unit])


def size_text(n: int) -> str:
    """``1000`` -> ``"1000 bytes"``; ``140_000_000_000`` -> ``"140.0 GB"``: as ``parse_size`` reads them."""
    for unit in ("TB", "GB", "MB"):
        if n >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.1f} {unit}"
    return f"{n} bytes"
