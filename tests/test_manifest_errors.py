"""A damaged ``index.json`` is refused with a ManifestError that says which entry and field are wrong,
whatever JSON value stands where another was expected: never another exception, never a traceback."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ddpipe
from ddpipe.manifest import Manifest

from .conftest import run_cli
from .helpers import make_dataset

VALID: dict[str, Any] = {
    "ddpipe": 1, "format": "wds", "fields": ["cls", "jpg"], "classes": ["a", "b"], "num_samples": 3,
    "shards": [{"file": "shard-000000.tar", "samples": 2, "bytes": 4096, "checksum": "xxh3_64:00",
                "labels": [[0, 1], [1, 1]]},
               {"file": "shard-000001.tar", "samples": 1, "bytes": 2048, "checksum": "xxh3_64:01"}],
    "skipped": [{"path": "raw/x.jpg", "error": "not an image"}], "origin": {"fingerprint": "f"},
}
# every place in VALID a damaged file could put another value
PLACES = [("format",), ("fields",), ("classes",), ("shards",), ("skipped",), ("origin",), ("layout",), ("data_dir",),
          ("shards", 0), ("shards", 1), ("fields", 0), ("classes", 1), ("skipped", 0),
          *[("shards", 0, key) for key in ("file", "samples", "bytes", "checksum", "labels", "digests")],
          ("shards", 0, "labels", 0), ("shards", 0, "labels", 0, 0), ("shards", 0, "labels", 1, 1)]
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=6)


def replaced(place: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(VALID)
    *parents, last = place
    where: Any = doc
    for key in parents:
        where = where[key]
    where[last] = value
    return doc


def test_the_valid_manifest_reads() -> None:
    manifest = Manifest.from_dict(copy.deepcopy(VALID))
    assert manifest.num_samples == 3 and manifest.shards[0].labels == ((0, 1), (1, 1))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(PLACES), JSON)
def test_any_value_in_any_place_reads_or_is_a_manifest_error(place: tuple[Any, ...], value: Any) -> None:
    try:
        Manifest.from_dict(replaced(place, value))
    except ddpipe.ManifestError as e:
        assert str(e).count("\n") == 0


@pytest.mark.parametrize(("place", "value", "says"), [
    (("shards", 0, "samples"), -3, "shard 'shard-000000.tar': 'samples' must be a whole number of at least 0, not -3"),
    (("shards", 0, "samples"), 2.5, "'samples' must be a whole number"),
    (("shards", 0, "bytes"), True, "'bytes' must be a whole number"),
    (("shards", 0, "samples"), "2", "'samples' must be a whole number"),
    (("shards",), 5, "'shards' must be a list, not int"),
    (("shards", 1), 7, "shard entry 1 must be an object, not int"),
    (("shards", 0, "file"), "../../etc/passwd", "must be a file name inside the dataset"),
    (("shards", 0, "file"), ".hidden", "must be a file name inside the dataset"),
    (("shards", 0, "labels"), [[0]], "'labels' must be a list of [class, count] runs"),
    (("shards", 0, "labels", 0, 0), -1, "a label run's class must be a whole number"),
    (("shards", 0, "labels", 1, 0), 2, "shard 'shard-000000.tar': a label run's class is 2, but the manifest names 2"),
    (("classes",), None, "'classes' must be a list, not null"),
    (("fields",), [1, 2], "'fields' must be a list of names"),
    (("format",), 3, "'format' must be a str, not int"),
    (("origin",), [], "'origin' must be a dict, not list"),
    (("skipped", 0), "x", "'skipped' must be a list of"),
])
def test_the_error_names_the_entry_and_the_field(place: tuple[Any, ...], value: Any, says: str) -> None:
    with pytest.raises(ddpipe.ManifestError) as raised:
        Manifest.from_dict(replaced(place, value))
    assert says in str(raised.value)


def test_label_runs_need_names_only_where_the_manifest_names_classes() -> None:
    unnamed = replaced(("classes",), [])
    unnamed["shards"][0]["labels"] = [[0, 1], [7, 1]]
    assert Manifest.from_dict(unnamed).shards[0].labels == ((0, 1), (7, 1))  # no names: any class reads
    unnamed["shards"][0]["labels"] = [[0, 1], [3_000_000_000, 1]]  # no class index: counting per class took 22 GiB
    with pytest.raises(ddpipe.ManifestError, match="class is 3000000000, more classes than a dataset of 3 samples"):
        Manifest.from_dict(unnamed)
    unnamed["shards"][0]["labels"] = [[0, 1], [7, 1]]
    unnamed["classes"] = [str(c) for c in range(7)]
    with pytest.raises(ddpipe.ManifestError, match="class is 7, but the manifest names 7 classes"):
        Manifest.from_dict(unnamed)


def test_a_missing_field_is_named() -> None:
    doc = copy.deepcopy(VALID)
    del doc["shards"][0]["checksum"]
    with pytest.raises(ddpipe.ManifestError, match=r"shard 'shard-000000\.tar': no 'checksum'"):
        Manifest.from_dict(doc)


def test_the_commands_say_it_in_one_line(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "ds", "wds", [10, 10])
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    doc = json.loads((root / "index.json").read_text())
    doc["shards"][1]["samples"] = -1
    (root / "index.json").write_text(json.dumps(doc))
    before["index.json"] = (root / "index.json").read_bytes()
    for args in (("inspect", root), ("verify", root), ("plan", root, "--world-size", "2")):
        proc = run_cli(*args, timeout=120)  # a hang bound
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, (args, proc.stderr)
        assert "index.json: malformed manifest: shard 'shard-000001.tar': 'samples'" in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before  # nothing written, nothing lost


def test_an_empty_path_is_no_dataset_not_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Path("") is ".": a script's open_dataset(os.environ.get("DATA", "")) read the working directory,
    here a dataset, as if it had been named."""
    make_dataset(tmp_path, "wds", [2])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ddpipe.ManifestError, match=r"^a dataset's path is empty: name its directory$"):
        ddpipe.open_dataset("")
