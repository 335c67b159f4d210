"""What benchmarks/ adds to ddpipe's benchmark harness (ddpipe/bench/harness.py: the machine, eviction,
timing, medians, tables): the cached synth data they read, an epoch timed across ranks, JSON results,
and launching a script on MPI ranks."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ddpipe.bench.harness import evict_page_cache
from ddpipe.errors import RepeatedEpochWarning

# benchmarks repeat an epoch on purpose (a warm-up, then the same epoch timed)
warnings.filterwarnings("ignore", category=RepeatedEpochWarning)

ROOT = Path(__file__).resolve().parents[1]
# a trial run (DDPIPE_BENCH_RESULTS) writes its results and plots there, not over the record the docs show
TRIAL = os.environ.get("DDPIPE_BENCH_RESULTS")
RESULTS = Path(TRIAL) if TRIAL else ROOT / "benchmarks" / "results"
FIGURES = Path(TRIAL) if TRIAL else ROOT / "docs"
DATA = Path(os.environ.get("DDPIPE_BENCH_DATA", ROOT / "bench-data"))


def synth_images(n: int, classes: int = 100, seed: int = 0) -> Path:
    """An ImageNet-like ImageFolder of ``n`` JPEGs, generated once and reused by later runs."""
    from ddpipe.synth import SynthOptions, synth

    classes = min(classes, n)  # a trial run's few images: a class each (synth refuses a class without one)
    root = DATA / f"synth-{n}-{classes}-{seed}"
    done = root / ".complete"
    if not done.exists():
        synth(root, SynthOptions(n=n, classes=classes, seed=seed, workers=os.cpu_count() or 1,
                                  progress=sys.stderr.isatty()))
        done.write_text("ok\n")
    return root


def synth_shards(n: int, name: str, fmt: str = "wds", shard_bytes: int = 16_000_000, seed: int | None = None) -> Path:
    """The synth set converted to ``fmt`` shards under ``DATA/<name>-<n>/<fmt>``, made once and reused."""
    import shutil

    import ddpipe

    root = DATA / f"{name}-{n}" / fmt
    if not (root / "index.json").exists():
        shutil.rmtree(root, ignore_errors=True)
        ddpipe.convert(synth_images(n), root, ddpipe.ConvertOptions(format=fmt, shard_bytes=shard_bytes, seed=seed,
                                                                    progress=False))
    return root


def timed_epoch(loader: Any, evict_first: Iterable[Path] = ()) -> float:
    """One epoch of ``loader`` on every rank, after evicting ``evict_first`` (once per node); the
    slowest rank's seconds."""
    files = list(evict_first)
    if files and loader.comm.world.local_rank == 0:
        evict_page_cache(files)
    loader.comm.barrier()
    t0 = time.perf_counter()
    for _ in loader:
        pass
    return float(max(loader.comm.allgather(time.perf_counter() - t0)))


def raw_read(files: list[Path]) -> int:
    """The reference for reading: plain reads of the files into one reused 8 MB buffer (no per-read
    allocation, which would make the reference slower than the subject); the bytes read."""
    buf = bytearray(8 << 20)
    n = 0
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while k := f.readinto(buf):
                n += k
    return n


def commit_of(tree: Path) -> str | None:
    """The short commit a checkout (a ``--reference``) stands at."""
    import subprocess

    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=tree).stdout.strip() or None


def trees_to_measure(references: Iterable[Path]) -> dict[str, Path]:
    """This checkout (``"this"``) and each ``--reference`` checkout, named by its commit (the rows say
    which tree they measured): the trees a benchmark runs side by side, each in processes of its own."""
    return {"this": ROOT} | {commit_of(ref.resolve()) or str(ref): ref.resolve() for ref in references}


def env_of(tree: Path) -> dict[str, str]:
    """This process's environment with ``tree`` first on the import path: a child started with it
    measures that tree's ddpipe."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}


def save(name: str, doc: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def torchrun(ranks: int, *args: str | os.PathLike[str], timeout: float = 1800) -> None:
    """Run ``python ARGS`` as ``ranks`` processes of one node under ``torchrun``; raise on failure."""
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(ranks), *map(str, args)], timeout=timeout, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"torchrun --nproc-per-node {ranks} {' '.join(map(str, args))} failed with {proc.returncode}")


def mpiexec(ranks: int, *args: str | os.PathLike[str], timeout: float = 1800, nodes: int | None = None) -> None:
    """Run ``python ARGS`` on ``ranks`` real MPI ranks (the mpich wheel's mpiexec); raise on failure.
    ``nodes``: as that many nodes, as MPI sees them (MPICH's cliques: rank r on node r % nodes)."""
    import shutil
    import subprocess

    exe = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if exe is None:
        raise SystemExit("mpiexec not found: pip install 'ddpipe[mpi]' (make setup does)")
    env = {**os.environ, **({"MPIR_CVAR_NUM_CLIQUES": str(nodes)} if nodes else {})}
    proc = subprocess.run([exe, "-n", str(ranks), sys.executable, *map(str, args)], timeout=timeout, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"mpiexec -n {ranks} {' '.join(map(str, args))} failed with {proc.returncode}")


def read_ahead_kb(path: Path) -> int | None:
    """The kernel's read-ahead window for the disk holding ``path`` (what one fault on a mapped file
    may read around its page), where /sys tells it."""
    dev = path.stat().st_dev
    block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for queue in (block / "queue", block / ".." / "queue"):  # a whole disk's, or a partition's disk's
        if (queue / "read_ahead_kb").exists():
            return int((queue / "read_ahead_kb").read_text())
    return None


def disk_read() -> int:
    """Bytes this process has had read from storage (the kernel's count, read-ahead included)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def cold(files: list[Path], work: Callable[[], object]) -> tuple[float, int]:
    """Seconds and bytes read from the disk for ``work`` with ``files`` out of the page cache."""
    gc.collect()  # a mapping of the files still alive would keep its pages in the cache
    evict_page_cache(files)
    before, t = disk_read(), time.perf_counter()
    work()
    return time.perf_counter() - t, disk_read() - before
