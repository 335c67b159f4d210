"""What the multi-rank loader tests share: a tiny DALI loader's keywords, samples that say which
they are, and a run of a snippet on several ranks whose rank 0 reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..conftest import mpiexec

# a small DALI loader on the CPU, as the code these tests run on every rank makes it (ddpipe.Loader's keywords)
TINY_DALI = ("decoder='dali-cpu', device='cpu', "
             "decode=ddpipe.DecodeOptions(size=16, resize_shorter=16, dtype='uint8', threads=1)")


def indexed_samples(n: int) -> list[dict[str, bytes | str]]:
    """``n`` small JPEGs, each labelled with its own index: a label tells samples apart."""
    from ..decode.images import solid_jpeg

    return [{"__key__": f"img/{i:04d}", "jpg": solid_jpeg((20 * (i % 10), 90, 90), (40, 30)), "cls": b"%d" % i}
            for i in range(n)]


def ranks_report(ranks: int, code: str, data: Path, out: Path) -> Any:
    """Run ``code`` on ``ranks`` MPI ranks with ``data`` and ``out`` as its arguments; what rank 0
    wrote to ``out``, as JSON."""
    proc = mpiexec(ranks, "-c", code, data, out, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())
