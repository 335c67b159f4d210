"""ddpipe bench against known cases: a slow reader, slow decoding, a long step, and totals that add up."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

import ddpipe
from ddpipe import DecodeOptions, PlanOptions, ReadOptions, SourceLimits
from ddpipe.bench import BenchOptions, run_bench
from ddpipe.comm import Comm

from ..conftest import mpiexec
from ..decode.images import labelled_samples


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench") / "wds"
    ddpipe.write_dataset(root, iter(labelled_samples(64, np.random.default_rng(2))), samples_per_shard=16,
                         classes=[str(c) for c in range(6)])
    return root


def options(shuffle: str = "partial", source_limits: str | None = None, **kw: object) -> BenchOptions:
    return BenchOptions(plan=PlanOptions(batch_size=8, shuffle=shuffle),
                        read=ReadOptions(source_limits=SourceLimits.parse(source_limits) if source_limits else None),
                        decode=DecodeOptions(decoder="dali-cpu", size=32, resize_shorter=37, dtype="uint8"),
                        **kw)  # type: ignore[arg-type]


def test_slow_reader_is_the_bottleneck_and_fetch_stall_dominates(data: Path) -> None:
    size = sum(s.bytes for s in ddpipe.load_manifest(data).shards)
    report = run_bench(data, options(step_time=0.001, source_limits=f"{size * 2}B/s"), Comm())  # 0.5 s a read
    assert report.bottleneck == "read"
    assert report.fetch_stall > report.prep_stall and report.fetch_stall > 0.5
    assert report.max_feed_images_per_s == pytest.approx(report.stages[0].images_per_s)


def test_slow_decoding_is_the_bottleneck_and_prep_stall_dominates(tmp_path: Path) -> None:
    from ddpipe.synth import encode_jpeg, render_image

    root = tmp_path / "photos"  # photo-sized JPEGs: decoding each costs far more than reading it
    ddpipe.write_dataset(root, ({"__key__": f"p/{i}", "jpg": encode_jpeg(render_image(i, seed=1, long_side=500)),
                                 "cls": b"0"} for i in range(48)), samples_per_shard=16)
    report = run_bench(root, BenchOptions(plan=PlanOptions(batch_size=8, shuffle="local"), step_time=0.001,
                                          decode=DecodeOptions(decoder="pil", dtype="uint8")), Comm())
    assert report.bottleneck == "read+decode"
    assert report.prep_stall > report.fetch_stall and report.prep_stall > 0.5


def test_long_step_leaves_almost_no_stall(data: Path) -> None:
    report = run_bench(data, options(step_time=0.15), Comm())
    assert report.bottleneck == "step" and report.stall < 0.1


def test_totals_add_up_across_ranks(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = mpiexec(2, "-m", "ddpipe", "bench", data, "--batch-size", "8", "--decode", "dali-cpu", "--image-size",
                   "32", "--step-time", "0.01", "--json", out, "--plot", tmp_path / "bench.png", "--epochs", "2",
                   "--project", "nodes=1,8", "--project-images", "1281167", "--model-step-time", "0",
                   "--compare", "torch", "dali-wds",
                   "--compare-dir", tmp_path / "peers", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "bottleneck:" in proc.stdout and proc.stdout.count("stall") == 2  # the report, the projection's head
    # what each rank's step felt: its first batch, then the median, 99th percentile and longest wait
    assert len(re.findall(r"first batch [\d.]+ ms \(later epochs [\d.]+ ms\), then waits p50 [\d.]+ ms, "
                          r"p99 [\d.]+ ms, max", proc.stdout)) == 2
    # under a launcher (no terminal) rank 0 says each phase as it starts, not only the report at the end
    phases = [ln for ln in proc.stderr.splitlines() if ln.startswith("bench: ")]
    assert phases[0].startswith("bench: ") and phases[0].endswith(f"(1/{len(phases)})"), proc.stderr
    assert any("read+decode" in ln for ln in phases), phases
    projected = [ln.split() for ln in proc.stdout.splitlines() if ln.strip().startswith(("1 ", "8 "))]
    assert len(projected) == 10 and {row[2] for row in projected} == {"local", "partial", "global"}
    assert "step 0 ms per batch of 8" in proc.stdout  # a model step of 0 given was taken for none (--step-time's)
    doc = json.loads(out.read_text())
    assert doc["world_size"] == 2 and doc["images"] == 64
    full = [r for r in doc["per_rank"] if r["stage"] == "full"]
    assert sorted(r["rank"] for r in full) == [0, 1]
    reads = [r for r in doc["per_rank"] if r["stage"] == "read"]
    assert sum(r["images"] for r in reads) == 64
    assert {s["name"] for s in doc["stages"]} == {"read", "read+exchange", "read+decode", "full"}
    assert doc["machine"]["cores"] and "torch" in doc["machine"]["versions"]
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(len(r["waits"]) == r["steps"] for r in full)  # the stall over the epoch, step by step
    # each rank's first batch (the loader new), the later epoch's, and the waits after them
    assert [felt["rank"] for felt in doc["latency"]] == [0, 1]
    for felt, r in zip(doc["latency"], sorted(full, key=lambda r: r["rank"]), strict=True):
        assert felt["first_batch_s"] == r["waits"][0] and felt["later_first_batch_s"] == r["waits"][r["steps"] // 2]
    assert len(doc["epochs"]) == 2 and doc["epoch_seconds"] == pytest.approx(sum(doc["epochs"]) / 2)
    assert sum(r["steps"] for r in full) * 8 == 2 * 64  # two epochs fed the step
    # the peers ran on the same 64 images, split over both ranks, and their ratios are printed
    assert [c["peer"] for c in doc["compare"]] == ["torch", "dali-wds"]
    assert all(c["images"] == 64 and c["images_per_s"] > 0 for c in doc["compare"])
    decode = next(s["images_per_s"] for s in doc["stages"] if s["name"] == "read+decode")
    assert all(c["ddpipe_over_peer"] == pytest.approx(decode / c["images_per_s"]) for c in doc["compare"])
    assert "PyTorch DataLoader" in proc.stdout and "ddpipe / it" in proc.stdout


def test_a_real_model_step_is_timed(data: Path) -> None:
    report = run_bench(data, options(model="smallcnn", shuffle="local"), Comm())
    assert report.step == "smallcnn" and report.compute_seconds > 0
    full = next(r for r in report.per_rank if r["stage"] == "full")
    assert full["steps"] == 8 and full["compute"] == pytest.approx(report.compute_seconds)
    assert 0.0 <= report.stall <= 1.0


@pytest.mark.parametrize(("given", "says"), [
    ({"model": "resnet9000"}, "unknown model 'resnet9000'; choose one of resnet18"),
    ({"epochs": 0}, "epochs must be a whole number of at least 1, not 0"),
    ({"epochs": 1.5}, "epochs must be a whole number of at least 1, not 1.5"),
    ({"step_time": -0.1}, "step_time must be at least 0 seconds, not -0.1"),
    ({"step_time": "0.1"}, "step_time must be a number, not '0.1'"),
    ({"compare": ("torch", "tensorflow")}, "compare names peers from torch, webdataset, .*, not 'tensorflow'"),
    ({"compare": "torch"}, "compare is a tuple of peers' names, not the string 'torch'"),
    ({"compare_dir": "s3://bucket/peers"}, "compare_dir is a directory on this machine, not an object store's URL"),
    ({"cold": "yes"}, "cold must be True or False, not 'yes'"),
    ({"seed": 2**64}, "seed must be a whole number from -2\\*\\*63"),
])
def test_bad_options_are_refused_when_made_naming_the_option(given: dict[str, object], says: str) -> None:
    """As every options object of ddpipe's refuses what it cannot take when it is made, not when a
    benchmark that may have run for minutes reaches it (an unknown model was refused at the start of
    run_bench, an unknown peer after every stage had been measured)."""
    with pytest.raises(ddpipe.OptionError, match=says):
        BenchOptions(**given)  # type: ignore[arg-type]


def test_a_batch_size_that_leaves_one_batch_is_refused_before_measuring(data: Path) -> None:
    """One batch a rank: rates are timed after the first, so read+decode said 0 images/s and the
    report named it the bottleneck ("the pipeline could feed 0 images/s")."""
    from ..conftest import run_cli

    proc = run_cli("bench", data, "--batch-size", "64", "--decode", "pil", "--image-size", "32", "--no-progress")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr == f"ddpipe: error: {data}: --batch-size 64 leaves each rank 1 batch(es) of its share (64 of " \
                          "64 samples on 1 rank(s)), and a rate is timed after the first batch: use a smaller batch " \
                          "size or fewer ranks\n"


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_a_refusal_every_rank_reaches_alike_is_said_once_for_the_job(data: Path, launcher: str) -> None:
    """Raised by every rank alike (job-wide), the refusal was printed by each: on 64 ranks, 64 lines."""
    from ..conftest import torchrun

    args: list[str | Path] = ["-m", "ddpipe", "bench", data, "--batch-size", "32", "--decode", "pil",
                              "--image-size", "32", "--no-progress"]
    proc = mpiexec(2, *args, timeout=200) if launcher == "mpiexec" else torchrun(2, *args, timeout=200)
    said = (f"ddpipe: error: {data}: --batch-size 32 leaves each rank 1 batch(es) of its share (32 of 64 samples on "
            "2 rank(s))")
    assert proc.returncode != 0 and proc.stderr.count("ddpipe: error:") == 1 and said in proc.stderr, proc.stderr
    if launcher == "mpiexec":  # torchrun reports its failed workers itself
        assert proc.stderr.count("\n") == 1, proc.stderr


def test_each_epochs_first_wait_is_told_apart_from_the_steady_ones() -> None:
    from ddpipe.bench.figures import rank_latency
    from ddpipe.bench.report import latency

    waits = [0.5, 0.01, 0.02, 0.03, 0.4, 0.01, 0.02, 0.03, 0.3, 0.01, 0.02, 0.03]  # three epochs of four steps
    felt = rank_latency(waits, 3)
    assert felt["first_batch_s"] == 0.5 and felt["later_first_batch_s"] == 0.4  # the new loader's, then warm
    assert felt["wait_max_s"] == 0.03
    assert latency(felt) == ("; first batch 500.0 ms (later epochs 400.0 ms), then waits p50 20.0 ms, "
                             "p99 30.0 ms, max 30.0 ms")
    assert latency(rank_latency([0.25], 1)) == "; first batch 250.0 ms" and latency(rank_latency([], 1)) == ""


@pytest.fixture(scope="module")
def two_gpu_batches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Enough samples for two of gpu.py's batches of 256 an epoch: a first one and one after it."""
    root = tmp_path_factory.mktemp("gpu-rows") / "wds"
    ddpipe.write_dataset(root, iter(labelled_samples(300, np.random.default_rng(3))), samples_per_shard=100,
                         classes=[str(c) for c in range(6)])
    return root


@pytest.mark.parametrize("read_in", ["thread", "process"])
def test_the_gpu_benchmarks_loader_rows_run_on_the_cpu(two_gpu_batches: Path, tmp_path: Path, read_in: str) -> None:
    """benchmarks/gpu.py runs only where a GPU is lent, a few minutes now and then: the code of its
    Loader rows runs here with DALI's CPU decoder in place of its GPU one, so that a change that
    breaks it is found before a lease is spent finding it."""
    import subprocess
    import sys

    out = tmp_path / "row.json"
    script = Path(__file__).parents[2] / "benchmarks" / "gpu.py"
    proc = subprocess.run([sys.executable, str(script), "--n", "16", "--epochs", "2", "--out", str(out), "--run",
                           "ddpipe", str(two_gpu_batches), "local", "float32", "dali-cpu", "cpu", read_in],
                          env={**os.environ, "DDPIPE_BENCH_DATA": str(tmp_path)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    rates = figures["rates"]
    assert len(rates) == 1 and rates[0] > 0  # the epoch after the warm-up, timed
    # and the same epoch's wait for its first batch, and its rate from that batch on
    assert len(figures["first_batch_ms"]) == len(figures["steady_rates"]) == 1
    assert figures["first_batch_ms"][0] > 0 and figures["steady_rates"][0] > 0


def test_the_peers_inputs_go_in_a_directory_of_their_own_under_compare_dir(tmp_path: Path) -> None:
    """They were written straight into --compare-dir: an ImageFolder in its "images", and, for a
    dataset of another format, tars in its "wds" after removing whatever that held (a user's own)."""
    root = tmp_path / "h5"
    ddpipe.write_dataset(root, iter(labelled_samples(32, np.random.default_rng(3))), format="hdf5",
                         samples_per_shard=16, classes=[str(c) for c in range(6)])
    mine = tmp_path / "scratch" / "wds" / "mine.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("a user's own")
    report = run_bench(root, options(step_time=0.001, compare=("webdataset",), compare_dir=str(tmp_path / "scratch")),
                       Comm())
    assert [p["images"] for p in report.compare] == [32]
    assert mine.read_text() == "a user's own" and sorted(p.name for p in mine.parent.iterdir()) == ["mine.txt"]
    (own,) = [p for p in (tmp_path / "scratch").iterdir() if p.name != "wds"]
    assert sorted(p.name for p in own.iterdir()) == [".complete", "images", "wds"]


def test_no_thread_of_ddpipes_outlives_the_benchmark(data: Path) -> None:
    """The read+decode stage's loader was left open: its thread reading the next epoch ahead ran on
    while the peers' DataLoaders forked their workers, and a worker forked as it held a lock hung the
    run (CI: webdataset's epoch never ended)."""
    import gc
    import threading

    gc.collect()  # an earlier test's loaders, left to the collector, go with theirs
    before = set(threading.enumerate())
    run_bench(data, options(step_time=0.001), Comm())
    assert [t.name for t in set(threading.enumerate()) - before if t.name.startswith("ddpipe-")] == []


def test_overlap_says_whether_the_step_and_the_pipeline_ran_side_by_side() -> None:
    """On 2 cores, 500-pixel JPEGs and a sleeping step: "stall 46%" and "bottleneck: step" side by side,
    each true (the pipeline fed 870 images/s alone, the step took 787), and nothing said that the two
    had run in turns (1.20 s an epoch: the step's 0.65 s and the pipeline's 0.59 s)."""
    from ddpipe.bench.figures import BenchReport, StageFigures
    from ddpipe.bench.report import format_report

    def report(epoch_seconds: float) -> BenchReport:  # the pipeline alone 0.60 s, the step alone 0.64 s
        return BenchReport(1, [StageFigures("read+decode", 512, 512 * 1000, 0.6, 512, 0.6)], epoch_seconds, 0.64,
                           0.7, 512)

    assert report(0.64).overlap == 1.0 and report(0.5).overlap == 1.0  # no longer than the slower alone
    assert report(1.24).overlap == 0.0 and report(2.0).overlap == 0.0  # the two in turns, or worse
    assert report(0.94).overlap == pytest.approx(0.5)
    said = [ln for ln in format_report(report(1.2)).splitlines() if ln.startswith("overlap")]
    assert said == ["overlap 7%: the epoch took 1.20 s; the step alone 0.64 s, the pipeline alone 0.60 s (side by "
                    "side 0.64 s, in turns 1.24 s)"]
