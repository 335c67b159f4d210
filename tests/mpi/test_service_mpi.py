"""The decode service under a real 2-rank job with partial shuffling: each rank's batches through one
and two servers are the batches it decodes itself, in every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ddpipe

from ..conftest import mpiexec
from ..service.servers import servers

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("service_worker.py")


def test_two_ranks_get_the_same_batches_from_one_or_two_servers(raw_images: Path, tmp_path: Path) -> None:
    for fmt in ("wds", "hdf5", "lmdb"):
        ddpipe.convert(raw_images, tmp_path / fmt, ddpipe.ConvertOptions(format=fmt, samples_per_shard=5,
                                                                          progress=False))
    out = tmp_path / "report.json"
    with servers(2) as (a, b):
        proc = mpiexec(2, WORKER, tmp_path, out, a.endpoint, f"{a.endpoint},{b.endpoint}", timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = json.loads(out.read_text())
    for fmt in ("wds", "hdf5", "lmdb"):
        for n in (1, 2):
            rows = [r[f"{fmt}-{n}"] for r in ranks]
            assert all(r["same"] for r in rows), (fmt, n)
            assert rows[0]["batches"] == rows[1]["batches"] > 0
            # the two ranks' samples are the whole dataset, once: 24 images, 3 classes of 8
            labels = sorted(rows[0]["labels"] + rows[1]["labels"])
            assert labels == sorted([c for c in range(3) for _ in range(8)]), fmt
