"""glyd._env: the environment read in one place. ``interpreting()`` must agree with Triton, which reads
``TRITON_INTERPRET`` itself when a kernel is defined: where they disagreed ("false", "off", "2"), glyd
took the interpreter's paths (CPU launches, no Gluon, fp32 dots) while Triton compiled for a GPU."""

from __future__ import annotations

import pytest

from glyd import _env

VALUES = ["0", "", "1", "false", "FALSE", "off", "no", "2", " 1", "true", "TRUE", "on", "yes", "Yes", "y", "t"]


@pytest.mark.parametrize("value", VALUES)
def test_interpreting_reads_triton_interpret_as_triton_does(value, monkeypatch):
    libtriton = pytest.importorskip("triton._C.libtriton")
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert _env.interpreting() == libtriton.getenv_bool("TRITON_INTERPRET", False), value


def test_interpreting_without_the_variable(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert _env.interpreting() is False
