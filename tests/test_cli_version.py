"""``glyd --version`` answers before anything heavy is imported (no torch, numpy, transformers):
the commands' modules load only for a command. Its time is measured in benchmarks/RESULTS.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from glyd import __version__
from glyd.cli import _only_version

SRC = str(Path(__file__).resolve().parents[1] / "src")
HEAVY = ("torch", "numpy", "transformers", "triton", "safetensors", "glyd.codec", "glyd.apps.cli_store")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


def test_version_imports_nothing_heavy():
    r = _run("import sys, glyd.cli; rc = glyd.cli.main(['--version']); "
             f"print(rc, [m for m in {HEAVY!r} if m in sys.modules])")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"glyd {__version__}", "0 []"]


def test_import_glyd_is_light_and_names_load_on_use():
    r = _run("import sys, glyd; light = 'torch' not in sys.modules and 'numpy' not in sys.modules; "
             "import torch; p = glyd.pack(torch.ones(2, 3, dtype=torch.bfloat16)); "
             "print(light, type(p) is glyd.Packed, 'fixed12' in glyd.LAYOUTS, glyd.codec.__name__, glyd.unpack(p).shape)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "True", "glyd.codec", "torch.Size([2,", "3])"]


@pytest.mark.parametrize("argv, only", [
    (["--version"], True), (["-v", "--version"], True), (["pack", "--version"], False),
    (["info", "DIR"], False), ([], False),
])
def test_only_a_top_level_version_is_answered_early(argv, only):
    assert _only_version(argv) is only


def test_version_through_the_full_parser_too(capsys):
    from glyd.cli import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"glyd {__version__}"
