"""The one benchmark harness, shared by ``ddpipe bench`` and ``benchmarks/``: the machine a figure
was measured on, page-cache eviction for cold reads, untimed passes, timing, medians, Markdown
tables, and what a run is doing while it runs."""

from __future__ import annotations

import collections
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any


def machine() -> dict[str, Any]:
    """Cores, CPU model, memory, GPU and the versions that matter, for every result file."""
    info: dict[str, Any] = {"cores": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()}
    try:
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    versions: dict[str, str] = {}
    for name, module in (("numpy", "numpy"), ("torch", "torch"), ("dali", "nvidia.dali"), ("mpi4py", "mpi4py"),
                         ("simplejpeg", "simplejpeg")):
        try:
            versions[name] = __import__(module, fromlist=["__version__"]).__version__
        except ImportError:
            continue
    info["versions"] = versions
    try:
        import torch

        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        info["gpu"] = None
    return info


def evict_page_cache(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Drop files from the page cache, so that the next read comes from the device (a cold read)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def drain(batches: Iterable[Any]) -> None:
    """Run through an untimed (warm-up) epoch holding nothing: a loop variable would keep its last
    batch alive into the timed epoch, and a loader that reuses its batch buffers would pay for a
    fresh one there (150 MB of page faults per rank: a third of an 8-rank epoch on 2 cores), as no
    training loop does."""
    collections.deque(batches, maxlen=0)


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    """Seconds that ``fn(*args, **kwargs)`` took, and what it returned."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, out


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """A Markdown table: columns are (key, header, format spec); a missing value prints as '-'."""
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(format(r[k], f) if r.get(k) is not None else "-" for k, _, f in columns) + " |"
            for r in rows]
    return "\n".join([head, rule, *body])


def phase_bar(phases: list[str], show: bool) -> Any:
    """What the bench is doing: a bar at a terminal; elsewhere (under a launcher, whose output is a
    pipe) a line as each phase starts, so that a long run is not silent until its report."""
    from tqdm import tqdm

    terminal = sys.stderr.isatty()

    class Phases(tqdm):  # type: ignore[misc]
        """Names the phase under way."""

        done = 0  # phases done (a disabled bar counts nothing)

        def update(self, n: float | None = 1) -> bool | None:
            out: bool | None = super().update(n)
            self.done += 1
            if self.done < len(phases):
                self.set_description(f"bench: {phases[self.done]}")
                if show and not terminal:
                    print(f"bench: {phases[self.done]} ({self.done + 1}/{len(phases)})", file=sys.stderr, flush=True)
            return out

    bar = Phases(total=len(phases), disable=not (show and terminal), unit="phase", dynamic_ncols=True, leave=False)
    bar.set_description(f"bench: {phases[0]}")
    if show and not terminal:
        print(f"bench: {phases[0]} (1/{len(phases)})", file=sys.stderr, flush=True)
    return bar
