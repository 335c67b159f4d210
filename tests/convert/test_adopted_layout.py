"""An adopted dataset's manifest says how its files hold samples (its ``layout``). Whatever JSON value
a damaged or hand-edited manifest puts in any of its keys, the dataset reads, or is refused with one
ManifestError naming the key, before a file is opened: never another exception."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ddpipe

from ..conftest import run_cli
from . import foreign_data as fd

KEYS = ("images", "labels", "label_attr", "field", "values", "samples", "label_regex", "labels_file", "label_names",
        "seek_every", "seek_keys", "digests")
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2, 2**70), st.floats(allow_nan=False),
                   st.sampled_from(["", "x", "(", "(?P<label>\\d+)", "labels.txt", "../labels.txt", "jpg", "image",
                                    "msgpack", "caffe", "records", "images", "labels", "AAAA", "!!"]),
                   st.lists(st.one_of(st.integers(), st.text(max_size=4)), max_size=3),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@pytest.fixture(scope="module")
def adopted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("adopted")
    sets = {}
    for name, make, flags in (("hdf5", fd.h5_vlen, []),
                              ("lmdb", fd.lmdb_images_labels_file, ["--labels-file", "labels.txt"]),
                              ("lmdb-msgpack", fd.lmdb_msgpack, [])):
        root = make(tmp / name)
        assert run_cli("index", root, *flags).returncode == 0
        sets[name] = root, json.loads((root / "index.json").read_text())
    return sets


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["hdf5", "lmdb", "lmdb-msgpack"]), changes=st.dictionaries(st.sampled_from(KEYS), VALUES,
                                                                                      min_size=1, max_size=2))
def test_any_value_in_any_layout_key_reads_or_is_a_manifest_error(
        adopted: dict[str, tuple[Path, dict[str, Any]]], name: str, changes: dict[str, Any]) -> None:
    root, doc = adopted[name]
    changed = copy.deepcopy(doc)
    changed["layout"].update(changes)
    (root / "index.json").write_text(json.dumps(changed))
    try:
        sum(len(batch.indices) for batch in ddpipe.EncodedStream(root, 4, shuffle="none"))
    except ddpipe.DdpipeError as e:
        assert "\n" not in str(e)
    finally:
        (root / "index.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(("name", "key", "value", "says"), [
    ("hdf5", "images", ["images"], "'layout': 'images' must be the name of an HDF5 dataset, not ['images']"),
    ("hdf5", "labels", 3, "'labels' must be a name, not 3"),
    ("lmdb", "values", "protobuf", "'values' must be one of image, msgpack, caffe, pickle, not 'protobuf'"),
    ("lmdb", "samples", -1, "'samples' must be a whole number of at least 0, not -1"),
    ("lmdb", "label_regex", "(", "'label_regex' '(' is no regular expression"),
    ("lmdb", "label_regex", "\\d+", "has no group (?P<label>...)"),
    ("lmdb", "seek_keys", ["!!"], "'seek_keys' must be keys in base64, not '!!'"),
])
def test_the_error_names_the_layout_key(adopted: dict[str, tuple[Path, dict[str, Any]]], name: str, key: str,
                                        value: Any, says: str) -> None:
    root, doc = adopted[name]
    changed = copy.deepcopy(doc)
    changed["layout"][key] = value
    (root / "index.json").write_text(json.dumps(changed))
    try:
        with pytest.raises(ddpipe.ManifestError) as raised:
            ddpipe.open_dataset(root)
        assert says in str(raised.value) and str(root / "index.json") in str(raised.value)
        proc = run_cli("verify", root, timeout=120)  # a hang bound
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    finally:
        (root / "index.json").write_text(json.dumps(doc))
