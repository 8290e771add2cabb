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


def on_devices(cases: list[tuple], ids: list[str], cpu_slow=frozenset(), cpu_marks=()) -> list:
    """Params ``(*case, device)`` for each case and each of DEVICES, with ids ``"{id}-{device}"``. The
    CPU params (Triton's interpreter) of the cases at the indices in ``cpu_slow`` are marked slow (their
    CUDA ones stay in the default GPU set); the other CPU params get ``cpu_marks``."""
    out = []
    for i, (case, name) in enumerate(zip(cases, ids, strict=True)):
        for dev in DEVICES:
            (device,) = dev.values
            marks = list(dev.marks)
            if device == "cpu":
                marks += [pytest.mark.slow] if i in cpu_slow else list(cpu_marks)
            out.append(pytest.param(*case, device, marks=marks, id=f"{name}-{device}"))
    return out


def cpu_sampled(cases: list[tuple], every: int, keep=frozenset()) -> list:
    """Params of ``cases`` (their ids as plain tuples would get) marked ``cpu_sample(every=every)``: interpreter
    time, one CPU run of ``every`` of each (by a hash of its id) in the default run, the others slow (tests/conftest.py;
    GPU runs are unaffected). The cases at the indices in ``keep`` are not marked: one that alone exercises an option
    runs in every default CPU run."""
    return [pytest.param(*case, marks=() if i in keep else [pytest.mark.cpu_sample(every=every)])
            for i, case in enumerate(cases)]


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


@pytest.fixture
def plans_on():
    """Launch plans on for the test (``glyd.kernels._plan``), back to the environment's setting after it."""
    from glyd.kernels import _plan

    _plan.set_enabled(True)
    yield
    _plan.set_enabled(None)


def bits_of(y: torch.Tensor) -> torch.Tensor:
    """A bf16 tensor's raw bits, on the CPU (compare outputs bit for bit)."""
    return y.view(torch.int16).cpu()
