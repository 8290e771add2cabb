"""Every command takes every layout, from the one list (``glyd.LAYOUTS``): ``glyd pack``, ``demo``,
``fit``, ``serve``, ``eval --modes``, ``bench`` and ``benchmarks/scale.py`` (a layout registered later
included), and the README's command-line section names them all."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

import glyd
from glyd.apps.layouts import eval_modes, kernel_layouts, layout_names
from glyd.cli import build_parser
from glyd.codec.layout import register, unregister

ROOT = Path(__file__).resolve().parents[2]


def _parse(*argv: str):
    return build_parser().parse_args(list(argv))


@pytest.fixture
def toy_layout():
    """A second name for fixed12's codec (no kernels): enough for the command lines' choices."""
    register(dataclasses.replace(glyd.LAYOUTS["fixed12"], name="toy12", about="a toy", kernels={}))
    try:
        yield "toy12"
    finally:
        unregister("toy12")


@pytest.mark.parametrize("layout", list(glyd.LAYOUTS))
def test_each_command_takes_each_layout(layout):
    assert _parse("pack", "src", "dst", "--layout", layout).layout == layout
    assert _parse("demo", "--layout", layout).layout == layout
    assert _parse("serve", "m", "--layout", layout).layout == layout
    assert _parse("fit", "qwen2.5-7b", "--gpu", "80GB", "--layout", layout).layout == layout
    modes = eval_modes()
    assert modes[layout] == (layout, False) and modes["exact" if layout == "fixed12" else f"exact-{layout}"] == (
        layout, True)
    assert layout in kernel_layouts()  # the built-in layouts all have kernels: glyd bench times them


def test_auto_where_a_matrix_is_packed():
    assert _parse("pack", "s", "d", "--layout", "auto").layout == "auto"
    assert _parse("demo", "--layout", "auto").layout == "auto"
    with pytest.raises(SystemExit):
        _parse("fit", "qwen2.5-7b", "--gpu", "80GB", "--layout", "auto")  # fit needs a layout's bits


def test_a_registered_layout_joins_every_command(toy_layout, capsys):
    assert _parse("pack", "s", "d", "--layout", toy_layout).layout == toy_layout
    assert _parse("demo", "--layout", toy_layout).layout == toy_layout
    assert toy_layout in layout_names() and f"exact-{toy_layout}" in eval_modes()
    assert toy_layout not in kernel_layouts()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["pack", "--help"])
    assert f"{toy_layout}: a toy" in " ".join(capsys.readouterr().out.split())


def test_eval_config_takes_every_mode_and_names_them_when_wrong():
    from glyd.apps.evaluate import EvalConfig
    from glyd.errors import GlydError

    cfg = EvalConfig(model="m", modes=tuple(m for m in eval_modes() if m != "bf16"))
    assert "dense11" in cfg.modes and "exact-dense11" in cfg.modes
    with pytest.raises(GlydError, match="exact-dense11"):
        EvalConfig(model="m", modes=("fixed13",))


def test_bench_names_the_layouts_it_times():
    from glyd.apps import cli_bench
    from glyd.errors import GlydError

    args = _parse("bench", "--layout", "fixed13")
    with pytest.raises(GlydError, match="dense11"):
        cli_bench._check_layouts(args.layout)
    assert cli_bench._check_layouts("dense11,fixed12") == ["dense11", "fixed12"]


def test_the_scale_benchmark_takes_every_layout():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("scale", ROOT / "benchmarks" / "scale.py")
        scale = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(scale)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    variants = ",".join(f"{lay}+kv" for lay in glyd.LAYOUTS)
    args = scale.parse_args(["--out", "o", "--variants", variants])
    assert list(args.variants) == [f"{lay}+kv" for lay in glyd.LAYOUTS]
    with pytest.raises(SystemExit):
        scale.parse_args(["--out", "o", "--variants", "fixed13"])


def test_the_readme_command_line_names_every_layout():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Command line"):]
    section = section[:section.index("\n## ", 1)]
    for name in (*glyd.LAYOUTS, "auto"):
        assert f"`{name}`" in section, name
