"""Interpreted launches leave ``triton.language`` as they found it (``glyd.kernels._interp``).

Triton 3.6's interpreter patches ``triton.language.core`` for good when a kernel calls a
``@triton.jit`` helper (``tl.sum``, ``tl.cumsum``): a Gluon kernel compiled later in the process
then failed with ``'ir.value' object has no attribute 'dtype'`` (49 sm_90 compile checks on a fresh
machine, hidden wherever the Triton cache already held the kernels)."""

from __future__ import annotations

import pytest
import torch

import glyd

from .conftest import HAS_CUDA, needs_triton, random_weights

pytestmark = [needs_triton, pytest.mark.skipif(HAS_CUDA, reason="the interpreter runs without a GPU only")]


def _language_state():
    from glyd.kernels._interp import language_namespaces

    return [(obj, dict(vars(obj))) for obj in language_namespaces()]


def test_interpreted_launch_restores_triton_language():
    import glyd.kernels

    before = _language_state()
    w = random_weights(64, 256, "wide")
    p = glyd.pack(w, "tiered")  # its unpack kernel calls tl.cumsum and tl.sum (jit helpers)
    assert torch.equal(glyd.kernels.unpack(p).view(torch.int16), w.view(torch.int16))
    changed = [f"{getattr(obj, '__name__', obj)}.{k}" for obj, old in before
               for k, v in old.items() if vars(obj).get(k) is not v]
    assert changed == []


def test_gluon_compiles_after_an_interpreted_launch(tmp_path, monkeypatch):
    # the failure as a new machine met it: an empty cache, so the Gluon compile path really runs
    import glyd.kernels

    from .test_gluon import _compile_sm90

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    w = random_weights(64, 256, "normal")
    glyd.kernels.unpack(glyd.pack(w, "tiered"))
    k = _compile_sm90(16, 64, 1, False, 1)
    assert "mma" in k.asm["ttgir"]
    assert any(tmp_path.iterdir())  # compiled into the empty cache, not found in a warm one


def test_gluon_language_keeps_triton_languages_builtins_after_an_interpreted_launch():
    # Triton's binder imports Gluon at the first launch of a process: under the interpreter, with triton.language
    # patched, so Gluon forwarded the interpreter's builtins for good and a later Gluon compile of a gl.reduce with a
    # @gluon.jit combine failed (test_wg.py's sm_90 checks after an interpreted unpack in the same xdist worker).
    # tests/conftest.py imports Gluon first; without it this fails when the launch below is the process's first
    import triton.language.core as tl_core

    import glyd.kernels

    w = random_weights(8, 64, "normal")
    assert torch.equal(glyd.kernels.unpack(glyd.pack(w, "fixed12")).view(torch.int16), w.view(torch.int16))
    import triton.experimental.gluon.language as gl

    for name in ("reduce", "maximum", "associative_scan", "where"):
        assert getattr(gl, name).__wrapped__ is getattr(tl_core, name), name
