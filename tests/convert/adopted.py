"""Foreign layouts made by tests/convert/foreign_data.py, and adopting one in place with ``ddpipe index``
(asserting that only index.json was written): what the adoption tests share."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from ..conftest import run_cli
from . import foreign_data as fd

LAYOUTS: dict[str, tuple[Callable[[Path], Path], list[str], int]] = {
    "h5-vlen": (fd.h5_vlen, [], 30),
    "h5-fixed": (fd.h5_fixed, [], 20),
    "h5-one-hot": (fd.h5_one_hot, [], 30),
    "h5-float-labels": (fd.h5_float_labels, [], 30),
    "h5-float-attribute": (lambda p: fd.h5_float_labels(p, attribute=True), [], 30),
    "h5-pixels": (fd.h5_pixels, [], 30),
    "h5-pixels-chw": (lambda p: fd.h5_pixels(p, "chw"), [], 30),
    "lmdb-label-in-key": (fd.lmdb_images_label_in_key, [], 25),
    "lmdb-labels-file": (fd.lmdb_images_labels_file, ["--labels-file", "labels.txt"], 25),
    "lmdb-msgpack": (fd.lmdb_msgpack, [], 25),
    "lmdb-pickle": (fd.lmdb_pickle, ["--allow-pickle"], 25),
    "caffe-encoded": (fd.lmdb_caffe, [], 25),
    "caffe-raw": (lambda p: fd.lmdb_caffe(p, encoded=False), [], 25),
}


def hashes(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())
            if p.is_file() and p.name != "index.json"}


def adopt(name: str, tmp: Path) -> Path:
    make, flags, _ = LAYOUTS[name]
    root = make(tmp / name)
    before = hashes(root)
    proc = run_cli("index", root, *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert hashes(root) == before  # the data files' bytes unchanged: only index.json was written
    return root
