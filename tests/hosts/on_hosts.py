"""Run ``python -m ddpipe ARGS`` after giving this rank's host its own node-local files, as nodes with
local disks differ: ``on_hosts.py SETUP ARGS``, SETUP a JSON object of host name to a list of
``["mkdir", DIR]`` and ``["copy", SRC, DEST]`` (a file or a directory's tree). The ranks of a host each
do it, at once: each step may find another's done."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import socket
import sys


def main() -> None:
    setup = json.loads(sys.argv[1])
    for step in setup.get(socket.gethostname(), []):
        if step[0] == "mkdir":
            os.makedirs(step[1], exist_ok=True)
        else:  # copied whole, then renamed into place: a host's other rank never sees half of it
            part = f"{step[2]}.{os.getpid()}"
            if os.path.isdir(step[1]):
                shutil.copytree(step[1], part)
            else:
                shutil.copy(step[1], part)
            try:
                os.rename(part, step[2])
            except OSError:  # another rank's copy is there already (a directory is not replaced)
                shutil.rmtree(part, ignore_errors=True)
    sys.argv = ["ddpipe", *sys.argv[2:]]
    runpy.run_module("ddpipe", run_name="__main__")


if __name__ == "__main__":
    main()
