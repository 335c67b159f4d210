"""``ddpipe plan``: stream scores from the manifest alone, the same as what the real Loader yields."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import ddpipe
from ddpipe.checksum import file_checksum
from ddpipe.manifest import Manifest, label_runs, load_manifest, save_manifest
from ddpipe.quality import score_epoch

from .conftest import mpiexec, run_cli

WORKER = Path(__file__).parent / "mpi" / "plan_scores_worker.py"
CLASSES, PER_CLASS = 12, 20


def class_sorted(root: Path) -> Path:
    samples = ({"__key__": f"s/{i}", "cls": b"%d" % (i // PER_CLASS), "bin": bytes(8)}
               for i in range(CLASSES * PER_CLASS))
    ddpipe.write_dataset(root, samples, samples_per_shard=30, classes=[str(c) for c in range(CLASSES)])
    return root


def plan_json(data: Path, *args: str) -> dict:  # type: ignore[type-arg]
    proc = run_cli("plan", data, "--json", "--seed", "5", "--round-size", "24", *args,
                   check=True)
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.mark.mpi
def test_scores_are_those_of_what_the_loader_yields(tmp_path: Path) -> None:
    data = class_sorted(tmp_path / "d")
    mpiexec(4, WORKER, data, tmp_path / "streams.json", "6", "0.2", "0.6", timeout=300)
    streams = json.loads((tmp_path / "streams.json").read_text())
    labels = np.arange(CLASSES * PER_CLASS) // PER_CLASS
    advice = plan_json(data, "-W", "4", "--batch-size", "6", "--buffer-size", "16", "--exchange-fraction", "0.2", "0.6")
    assert [(m["shuffle"], m["exchange_fraction"]) for m in advice["scores"]] == [
        ("local", 0.0), ("partial", 0.2), ("partial", 0.6), ("global", 0.0)]
    for m in advice["scores"]:
        real = score_epoch([np.array(s) for s in streams[f"{m['shuffle']} {m['exchange_fraction']:g}"]], labels, 6)
        assert m["batch_skew"] == pytest.approx(real.batch_skew)
        assert m["rank_skew"] == pytest.approx(real.rank_skew)
        assert m["order_correlation"] == pytest.approx(real.order_correlation)
        assert m["step_skew"] == pytest.approx(real.step_skew)
    # on class-sorted shards more exchange mixes more, and a global shuffle most
    skews = [m["rank_skew"] for m in advice["scores"]]
    assert skews[0] > skews[1] > skews[2] > skews[3]


def test_a_manifest_without_label_runs_is_scored_from_the_shards(tmp_path: Path) -> None:
    data = class_sorted(tmp_path / "d")
    with_runs = plan_json(data, "-W", "8", "--batch-size", "6")
    manifest = load_manifest(data)
    assert manifest.shards[0].labels == ((0, 20), (1, 10))
    save_manifest(data, dataclasses.replace(manifest, shards=tuple(dataclasses.replace(s, labels=())
                                                                    for s in manifest.shards)))
    assert plan_json(data, "-W", "8", "--batch-size", "6") == with_runs


@pytest.mark.parametrize(("cls", "says"), [(b"3000000000", "a sample's label is 3000000000, more classes than a "
                                                           "dataset of 40 samples is taken to have"),
                                          (b"cat", "a sample's label is no class: cls b'cat' is not an integer")])
def test_labels_read_from_the_shards_that_are_no_class_index_get_one_line(tmp_path: Path, cls: bytes,
                                                                          says: str) -> None:
    """Counting samples per class sized an array from the label: 22 GiB for 3,000,000,000."""
    # as long as the label under test (which write_dataset refuses), and no tar header's octal field holds a 9
    stand_in = b"9".rjust(len(cls), b"0")
    samples = [{"__key__": f"k/{i}", "bin": b"x", "cls": stand_in if i == 13 else b"%d" % (i % 2)} for i in range(40)]
    data = tmp_path / "d"
    ddpipe.write_dataset(data, iter(samples), samples_per_shard=10)
    shard = ddpipe.open_dataset(data).shard_path(1)
    shard.write_bytes(shard.read_bytes().replace(stand_in, cls))  # a tar member's bytes: no header changes
    manifest = load_manifest(data)  # as an older ddpipe wrote it: no label runs, so labels are read from the shards
    save_manifest(data, dataclasses.replace(manifest, shards=tuple(
        dataclasses.replace(s, labels=(), checksum=file_checksum(shard) if s.file == shard.name else s.checksum)
        for s in manifest.shards)))
    proc = run_cli("plan", data, "-W", "2", "--batch-size", "4", timeout=120)  # a hang bound
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and says in proc.stderr, proc.stderr
    # on a line of its own: the progress bar, left open, ran on into it
    assert proc.stderr.splitlines()[-1] == f"ddpipe: error: {data}: {says}", proc.stderr


def test_a_dataset_without_labels_is_refused_from_its_manifest_without_reading_its_shards(tmp_path: Path) -> None:
    """No cls field at all: said at once, not after reading every sample (minutes at ImageNet's size)."""
    data = tmp_path / "d"
    ddpipe.write_dataset(data, ({"__key__": f"k/{i}", "bin": b"x"} for i in range(40)), samples_per_shard=10)
    proc = run_cli("plan", data, "-W", "2", "--batch-size", "4", timeout=120)  # a hang bound
    assert proc.returncode == 1 and proc.stderr == (f"ddpipe: error: {data}: its samples have no labels (no 'cls' "
                                                    "field among bin): shuffles are scored by class\n"), proc.stderr


def test_the_choice_is_the_smallest_q_that_closes_enough_of_the_gap(tmp_path: Path) -> None:
    advice = plan_json(class_sorted(tmp_path / "d"), "-W", "8", "--batch-size", "6", "--within", "0.4")
    closing = [m["exchange_fraction"] for m in advice["scores"]
               if m["shuffle"] == "partial" and m["gap_closed"] >= 0.6]
    assert advice["chosen_exchange_fraction"] == min(closing)
    assert plan_json(tmp_path / "d", "-W", "8", "--batch-size", "6", "--within", "0.01", "--exchange-fraction", "0.1")[
        "chosen_exchange_fraction"] is None


def test_label_runs() -> None:
    assert label_runs([3, 3, 1, 1, 1, 3]) == ((3, 2), (1, 3), (3, 1))
    assert label_runs([0, -1]) == ()  # a sample without a label: no runs at all
    assert label_runs([]) == ()


@pytest.mark.parametrize("args, message", [
    (["-W", "0"], "argument --world-size/-W: must be at least 1"),
    (["-W", "4", "--exchange-fraction", "1.5"], "must be in (0, 1]"),
    (["-W", "100000"], "cannot be shared by 100000 ranks"),
    (["-W", "8"], "holds 30 samples, less than one batch of 32"),
])
def test_bad_arguments_get_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    proc = run_cli("plan", class_sorted(tmp_path / "d"), *args)
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_label_runs_that_disagree_with_the_shard_are_refused(tmp_path: Path) -> None:
    data = class_sorted(tmp_path / "d")
    doc = json.loads((data / "index.json").read_text())
    doc["shards"][1]["labels"] = [[1, 10], [2, 5]]  # 15 labels for 30 samples
    (data / "index.json").write_text(json.dumps(doc))
    proc = run_cli("plan", data, "-W", "2")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "index.json" in proc.stderr and "shard-000001.tar" in proc.stderr and "30 samples" in proc.stderr


def test_a_job_reading_few_classes_at_a_time_is_pointed_at_the_buffer(tmp_path: Path) -> None:
    """With 2 ranks on class-sorted shards each step holds the few classes being read: no Q changes
    that, a larger shuffle buffer does, and the plan says so."""
    data = class_sorted(tmp_path / "d")
    small = plan_json(data, "-W", "2", "--batch-size", "6", "--buffer-size", "4")
    global_steps = small["scores"][-1]["step_skew"]
    assert small["buffer_bound"]
    assert all(m["step_skew"] > 1.5 * global_steps for m in small["scores"][:-1])  # every Q, local included
    large = plan_json(data, "-W", "2", "--batch-size", "6", "--buffer-size", "120")
    assert not large["buffer_bound"] and large["scores"][0]["step_skew"] < small["scores"][0]["step_skew"]
    text = run_cli("plan", data, "-W", "2", "--batch-size", "6", "--buffer-size", "4", check=True).stdout
    assert "score a larger --buffer-size" in text


@pytest.mark.parametrize("within", [float("nan"), -1.0, 1.5])
def test_advice_within_a_share_outside_0_to_1_is_refused(tmp_path: Path, within: float) -> None:
    """It said "no Q scored closes nan% of the gap", or looked for one closing 200% of it."""
    data = ddpipe.open_dataset(class_sorted(tmp_path / "d"))
    labels = data.manifest.sample_labels()
    assert labels is not None
    with pytest.raises(ddpipe.OptionError, match=r"within is a share of the gap, in \[0, 1\]"):
        ddpipe.advise_exchange(data.manifest, labels, 4, [0.3], within=within)


@pytest.mark.parametrize(("labels", "says"), [
    (lambda n: np.zeros(3, dtype=np.int64),
     "labels_of has shape (3,), not one label per sample of the dataset: ({n},)"),
    (lambda n: np.zeros((n, 2), dtype=np.int64),
     "labels_of has shape ({n}, 2), not one label per sample of the dataset: ({n},)"),
    (lambda n: np.full(n, -1), "labels_of must hold class numbers, 0 or more, not -1"),
    (lambda n: np.zeros(n), "labels_of must hold class numbers (manifest.sample_labels()), not float64"),
])
def test_advice_on_labels_not_the_datasets_is_refused(tmp_path: Path, labels: Callable[[int], np.ndarray],
                                                      says: str) -> None:
    """Too few labels was an IndexError from deep in the scoring; too many, or negative ones, were scored."""
    data = ddpipe.open_dataset(class_sorted(tmp_path / "d"))
    n = data.manifest.num_samples
    with pytest.raises(ddpipe.OptionError) as refused:
        ddpipe.advise_exchange(data.manifest, labels(n), 4, [0.3])
    assert str(refused.value) == says.format(n=n)


def test_a_dataset_of_no_samples_is_said_to_be_one(tmp_path: Path) -> None:
    """It was "0 samples cannot be shared by 2 ranks", which blamed the world size."""
    save_manifest(tmp_path, Manifest("wds", ("cls", "jpg"), (), ()))
    proc = run_cli("plan", tmp_path, "-W", "2", timeout=120)  # a hang bound
    assert proc.returncode == 1 and proc.stderr == f"ddpipe: error: {tmp_path}: the dataset holds no samples: " \
                                                   "nothing to plan\n", proc.stderr
