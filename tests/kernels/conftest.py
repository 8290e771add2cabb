"""Kernel tests run twice: on the CPU through Triton's interpreter (default run, CI) and on CUDA
(marked ``gpu``). The interpreter must be chosen before the kernels are decorated: the top-level
``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` without a GPU before anything imports them."""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
assert HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1", "tests/conftest.py sets the interpreter first"

try:
    import triton  # noqa: F401

    HAS_TRITON = True
except Exception:  # pragma: no cover - triton is in the dev environment
    HAS_TRITON = False

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

#: Each kernel test runs on these devices: the interpreter without a GPU, CUDA (marked gpu) with one.
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(HAS_CUDA, reason="CUDA present: the gpu-marked variant runs")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")]),
]


def random_weights(n: int, k: int, kind: str, device: str = "cpu") -> torch.Tensor:
    """Fresh random bf16 weights. ``normal``: std 0.02 plus a few exceptions (fixed12 window misses,
    deep tiered tiers); ``wide``: exponents spread over ~40 values (every tier, many exceptions)."""
    if kind == "normal":
        w = torch.randn(n, k) * 0.02
        if n * k:
            pick = torch.randint(0, n * k, (max(1, n * k // 500),))
            w.view(-1)[pick] = torch.randn(pick.numel()) * 1e-12  # far below the window
    else:
        w = torch.randn(n, k) * torch.exp2(torch.randn(n, k) * 4)
    return w.to(torch.bfloat16).to(device)
