"""Every benchmark script runs against this tree's ddpipe, at a small size, and writes its result.

A benchmark is run for the record now and then, so a script that an API change broke stays broken
until the next person who wants its figures: benchmarks/projection.py asked the Loader for
``decode="none"`` for a day after the loader's two stages, hidden by a ``type: ignore``, and
benchmarks/plan.py gave ``ddpipe plan`` neither the shard sizes a manifest must record nor the shard
files whose sizes it checks. Here each runs at a size that measures nothing worth keeping, its data
and results in a scratch directory. The GPU benchmarks need a GPU (tests/bench/test_bench.py runs
their Loader rows on the CPU); benchmarks/report.py runs in ``make test`` itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ..conftest import BIN, launch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

# script -> arguments for a small run (on 2 cores each took a minute at most)
SMALL = {
    "allreduce.py": ["--repeats", "1"],
    "convert.py": ["--n", "120", "--workers", "2", "--repeats", "1"],
    "decode_service.py": ["--images", "128", "--batch-size", "32", "--repeats", "1"],
    "exchange.py": ["--n", "300", "--ranks", "2", "--repeats", "1", "--round-size", "128", "--torchrun-ranks", "2"],
    "feed.py": ["--n", "300", "--repeats", "1", "--epochs", "2", "--kinds", "stream", "loader"],
    "formats.py": ["--n", "300", "--repeats", "1"],
    "global_shuffle.py": ["--n", "300", "--ranks", "2", "--repeats", "1"],
    "heartbeat.py": ["--repeats", "1", "--rounds", "1"],
    "loader.py": ["--n", "300", "--repeats", "1", "--warmup", "1", "--only", "ddpipe lmdb, dali-cpu, none",
                  "DALI file reader"],
    "lmdb_tree.py": ["--n", "300", "--repeats", "1"],
    "object_store.py": ["--n", "120", "--repeats", "1"],
    "overlap.py": ["--n", "128", "--repeats", "1", "--epochs", "1"],
    "peer_staging_soak.py": ["--runs", "1", "--n", "96", "--places", "cliques"],
    "plan.py": ["--world-size", "64", "--batch-size", "32"],
    "plan_time.py": ["--repeats", "1", "--rounds", "1"],
    "projection.py": ["--n", "300", "--repeats", "1"],
    "random_access.py": ["--n", "300", "--repeats", "1"],
    "shuffle_accuracy.py": ["--worlds", "16", "--fractions", "0.3", "--seeds", "1", "--epochs", "1", "--no-real-check",
                            "--per-class", "256"],
    "shuffle_quality.py": ["--classes", "10", "--per-class", "20"],
    "soak.py": ["--n", "200", "--epochs", "6"],
    "staging.py": ["--n", "300", "--repeats", "1"],
}
# the GPU's; report.py (make test runs it); modules the scripts import (feed_runs.py: what feed.py's rows run)
NOT_HERE = {"gpu.py", "gpu_probe.py", "gpu_timing.py", "gpu_train.py", "report.py", "_common.py", "feed_runs.py"}


def recorded() -> dict[Path, int]:
    """The committed results and the docs' pages and plots, each with when it was last written."""
    root = BENCHMARKS.parent
    return {p: p.stat().st_mtime_ns for p in [*(root / "benchmarks" / "results").iterdir(), *(root / "docs").iterdir()]}


def test_every_benchmark_is_run_here_or_said_why_not() -> None:
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    assert scripts == set(SMALL) | NOT_HERE


@pytest.mark.mpi
@pytest.mark.parametrize("script", sorted(SMALL))
def test_the_benchmark_runs_and_writes_its_table(tmp_path: Path, script: str) -> None:
    results = tmp_path / "results"
    before = recorded()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "DDPIPE_BENCH_DATA": str(tmp_path / "data"), "DDPIPE_BENCH_RESULTS": str(results)}
    # a hang bound: nearly five times the slowest run here (shuffle_accuracy.py, 60 s on 2 cores)
    proc = launch([sys.executable, str(BENCHMARKS / script), *SMALL[script]], timeout=280, env=env,
                  cwd=BENCHMARKS.parent)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert recorded() == before, "a trial run wrote over the record the docs show"
    written = sorted(results.glob("*.json"))
    assert written, f"{script} wrote no result under {results}"
    for path in written:
        doc = json.loads(path.read_text())
        assert doc["command"].startswith(f"python benchmarks/{script}"), doc["command"]
        assert "cores" in doc["machine"]
        assert "|---|" in doc["table"]  # a Markdown table, as report.py puts it in the docs
    if script == "exchange.py":
        # node peers' rounds land in each other's landing zones after the first epoch: a share of 0 was
        # the benchmark counting on its own communicator, not the stream's channel that exchanged
        rows = json.loads((results / "exchange.json").read_text())["rows"]
        assert all(row["landed"] > 0 for row in rows), rows
