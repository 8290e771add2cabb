"""The ``glyd`` command line's own behaviour (each area's commands are tested beside that area)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_a_command_module_that_fails_to_import_is_an_error(monkeypatch):
    # a sub-command module is part of glyd: its import failing is a bug to see, not a missing command
    from glyd import cli

    monkeypatch.setitem(sys.modules, "glyd.apps.cli_bench", None)  # ``import`` now raises
    with pytest.raises(ModuleNotFoundError, match="glyd.apps.cli_bench"):
        cli.build_parser()


def test_every_command_is_there_without_optional_packages():
    # the optional dependencies are imported inside the handlers: with none of them importable every
    # command is still listed (and build_parser does not raise)
    code = (
        "import sys\n"
        "for m in ('transformers', 'accelerate', 'gguf', 'huggingface_hub', 'triton', 'constriction', 'fastapi',\n"
        "          'uvicorn', 'openai'):\n"
        "    sys.modules[m] = None\n"
        "from glyd.cli import build_parser\n"
        "sub = next(a for a in build_parser()._actions if a.dest == 'command')\n"
        "print(' '.join(sorted(sub.choices)))\n"
    )
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == sorted(
        ["pack", "unpack", "verify", "info", "demo", "fit", "eval", "compress", "decompress", "test", "bench", "serve"]
    )


def test_commands_other_than_the_archive_run_without_zstandard(monkeypatch, capsys):
    # the lent GPU machine has no zstandard: only compress/decompress/test may need it, and they
    # say so in one line
    from glyd import cli

    monkeypatch.setitem(sys.modules, "zstandard", None)
    for name in [m for m in sys.modules if m.startswith("glyd.filecodec")]:
        monkeypatch.delitem(sys.modules, name)
    assert cli.main(["fit", "qwen2.5-0.5b", "--gpu", "80GB"]) == 0
    capsys.readouterr()
    assert cli.main(["test", "missing.glyd"]) == 1
    assert "zstandard" in capsys.readouterr().err
