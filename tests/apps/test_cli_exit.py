"""The ``glyd`` command line's own behaviour (each area's commands are tested beside that area)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_a_closed_pipe_ends_quietly():
    # ``glyd fit ... | head -1``: the reader is gone before glyd writes; no traceback, status 141
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, "-m", "glyd.cli", "fit", "qwen2.5-7b", "--gpu", "80GB"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    child.stdout.close()
    rc = child.wait(timeout=120)
    err = child.stderr.read().decode()
    assert rc == 141 and "Traceback" not in err and "BrokenPipe" not in err, err
