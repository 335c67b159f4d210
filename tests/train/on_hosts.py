"""Run ``python -m ddpipe ARGS`` after giving this rank's host its own node-local files, as nodes with
local disks differ: ``on_hosts.py SETUP ARGS``, SETUP a JSON object of host name to a list of
``["mkdir", DIR]`` and ``["copy", SRC, DEST]``. Ranks of one host may do it at once: each step may run twice."""

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
        else:  # copied whole, then renamed: a host's other rank never sees half a file
            part = f"{step[2]}.{os.getpid()}"
            shutil.copy(step[1], part)
            os.replace(part, step[2])
    sys.argv = ["ddpipe", *sys.argv[2:]]
    runpy.run_module("ddpipe", run_name="__main__")


if __name__ == "__main__":
    main()
