"""The README's front door, as a new user walks through it: a fresh virtual environment, the
README's install lines (torch, then ddpipe with the `mpi` extra only: no DALI), then the quick start
unchanged. Its commands are read from the README itself, so the two cannot drift apart."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import REPO, launch


def readme_block(marker: str) -> str:
    text = (REPO / "README.md").read_text()
    return text.split(f"<!-- {marker} -->")[1].split(f"<!-- /{marker} -->")[0]


def test_the_readme_quick_start_runs_in_a_fresh_environment(tmp_path: Path) -> None:
    src = tmp_path / "checkout"  # the checkout as a user has it: no .venv, no build output
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "ddpipe", src / "ddpipe", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # as `source venv/bin/activate` does
    install = re.search(r"```\n(.*?)```", readme_block("install"), re.S)
    assert install is not None
    done = launch(["bash", "-e", "-c", install.group(1)], 900, env, cwd=src)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    quick = readme_block("quickstart")
    shell = re.search(r"```\n(.*?)```", quick, re.S)
    code = re.search(r"```python\n(.*?)```", quick, re.S)
    assert shell is not None and code is not None
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(code.group(1))
    ran = launch(["bash", "-e", "-c", shell.group(1) + "\npython train.py\n"], 600, env, cwd=work)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert re.search(r"epoch 1: loss \d", ran.stdout), ran.stdout
    assert "Traceback" not in ran.stderr
    # no DALI in this environment: the CPU path, said once
    assert ran.stderr.count("DALI is not installed") == 1, ran.stderr[-3000:]
    # and truly none: not borrowed from the test's environment
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import nvidia.dali"], capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'nvidia'" in probe.stderr
