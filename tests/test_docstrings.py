"""Every example in glyd's docstrings runs and prints what it says (the public API's docs are examples:
one that went stale, as two had, is a defect). GPU-only examples are marked ``+SKIP`` where they sit."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import glyd


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(glyd.__path__, "glyd.") if not m.name.endswith("._cpu"))


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:  # an optional dependency (triton, fastapi, diffusers) not installed
        if (exc.name or "").split(".")[0] == "glyd":
            raise
        pytest.skip(f"{name} needs {exc.name}, not installed")
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        runner.run(test, out=lambda s: None)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples in {name} fail (python -m pytest --doctest-modules {module.__file__})"
