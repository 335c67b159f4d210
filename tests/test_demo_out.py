"""``make demo``'s output directory: the demo replaces its own from before, and nothing else."""

from __future__ import annotations

import sys
from pathlib import Path

from .conftest import launch


def test_the_demo_refuses_a_directory_that_holds_other_files(tmp_path: Path) -> None:
    """``--out`` was removed whole before the demo began: ``make demo DEMO=$HOME`` took the home directory."""
    theirs = tmp_path / "work" / "notes.txt"
    theirs.parent.mkdir()
    theirs.write_text("a user's own")
    for out in (theirs.parent, theirs):
        proc = launch([sys.executable, "-m", "ddpipe.demo", "--out", str(out), "--n", "8"], 120)  # a hang bound
        assert proc.returncode == 1 and proc.stderr == f"ddpipe demo: error: {out}: holds other files than an " \
            "earlier demo's: give --out a new or empty directory\n", proc.stderr
    assert theirs.read_text() == "a user's own" and [p.name for p in theirs.parent.iterdir()] == ["notes.txt"]
