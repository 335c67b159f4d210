"""A slow shared file system on one machine: reads through a bandwidth and latency limit.

A parallel file system read by a whole job gives each node a fraction of its bandwidth and adds
latency to every open; that is what staging hides. ``SourceLimits`` models it so that tests and
benchmarks can measure what staging buys without a cluster: every file opened through it costs
``latency`` seconds, and bytes flow at most at ``bandwidth`` bytes per second (a token bucket shared
by every reader in the process, as a node shares its link).
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass, field

from .errors import OptionError
from .units import parse_size

ENV_VAR = "DDPIPE_SOURCE_THROTTLE"  # read at the edge (the CLI), e.g. "100MB/s,5ms"


@dataclass
class SourceLimits:
    bandwidth: float | None = None  # bytes per second; None: unlimited
    latency: float = 0.0  # seconds added to every open
    # A link keeps streaming into socket and readahead buffers while its reader is busy elsewhere
    # (writing a copy, say): up to this many seconds of bandwidth may be taken late without loss.
    burst: float = 0.1
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _ready_at: float = field(default=0.0, repr=False, compare=False)

    @classmethod
    def parse(cls, text: str) -> SourceLimits:
        """``"100MB/s,5ms"``, ``"1GB/s"``, ``"20ms"``: bandwidth and/or per-open latency."""
        limits = cls()
        for part in (p.strip() for p in text.split(",") if p.strip()):
            if part.endswith("/s"):
                limits.bandwidth = float(parse_size(part[:-2]))
            elif m := re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)", part):
                limits.latency = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
            else:
                raise ValueError(f"cannot parse {part!r} in {text!r}: use e.g. '100MB/s,5ms'")
        return limits

    def __post_init__(self) -> None:
        if not (self.bandwidth is None or 0 < self.bandwidth < math.inf) or not 0 <= self.latency < math.inf \
                or not 0 <= self.burst < math.inf:
            raise OptionError(f"source limits must be a bandwidth more than 0 (or None), a latency and a burst 0 or "
                              f"more, all finite: not {self.bandwidth}, {self.latency} and {self.burst}")

    def __reduce__(self) -> tuple[object, ...]:
        # another process (a reading process) models the same link afresh: its own lock and credit
        return (SourceLimits, (self.bandwidth, self.latency, self.burst))

    def on_open(self) -> None:
        if self.latency:
            time.sleep(self.latency)

    def on_read(self, nbytes: int) -> None:
        """Block until ``nbytes`` may have arrived at the configured bandwidth."""
        if not self.bandwidth:
            return
        with self._lock:
            now = time.monotonic()
            if not self._ready_at:
                self._ready_at = now  # a link starts with no credit
            start = max(now - self.burst, self._ready_at)
            self._ready_at = start + nbytes / self.bandwidth
            wait = self._ready_at - now
        if wait > 0:
            time.sleep(wait)
