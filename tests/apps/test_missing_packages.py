"""Commands whose optional packages are not installed end with one line naming the package and the
extra to install, not a traceback (what a ``pip install glyd-lossless`` user without ``[models]`` meets)."""

from __future__ import annotations

import json
import sys

import pytest

from glyd.cli import main
from glyd.errors import MissingDependencyError


@pytest.fixture
def no_transformers(monkeypatch):
    # ``import transformers`` (and ``from transformers import ...``) now raises ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "transformers", None)


def _one_line_naming_the_extra(err: str, command: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"glyd {command}: error:") and "transformers" in lines[0], err
    assert 'pip install "glyd-lossless[models]"' in lines[0], err


@pytest.mark.parametrize("argv", [
    ["eval", "qwen2.5-0.5b", "--random", "--device", "cpu", "--no-decode"],
    ["demo", "--device", "cpu"],
    ["fit", "qwen2.5-7b", "--gpu", "h200"],  # it said "glyd fit needs transformers to read a config", not the extra to install
])
def test_model_commands_without_transformers(no_transformers, tmp_path, capsys, argv):
    if argv[0] == "demo":  # a folder that passes the demo's own checks
        (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
        argv = [*argv, "--model", str(tmp_path)]
    assert main(argv) == 1
    _one_line_naming_the_extra(capsys.readouterr().err, argv[0])


def test_a_missing_optional_package_met_inside_a_command(monkeypatch, capsys):
    # any command that reaches an optional package gets the same one line from main()
    from glyd.apps import cli_models

    def fit(args):
        import transformers  # noqa: F401 - stands in for a command's lazy import

    monkeypatch.setattr(cli_models, "_fit", fit)
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert main(["fit", "qwen2.5-7b", "--gpu", "24GB"]) == 1
    _one_line_naming_the_extra(capsys.readouterr().err, "fit")


def test_a_missing_module_of_another_kind_is_not_hidden(monkeypatch):
    from glyd.apps import cli_models

    def fit(args):
        import glyd_no_such_module  # noqa: F401 - not an optional package of glyd: a bug to show

    monkeypatch.setattr(cli_models, "_fit", fit)
    with pytest.raises(ModuleNotFoundError):
        main(["fit", "qwen2.5-7b", "--gpu", "24GB"])


def test_require_names_the_extra(no_transformers):
    from glyd.apps._deps import require

    with pytest.raises(MissingDependencyError, match=r'pip install "glyd-lossless\[models\]"'):
        require("transformers")
    require("torch")  # installed: nothing raised
