"""Launch plans for a range of M (``glyd.kernels._plan``, ``Kernel.any_rows``): a prompt of a length not
seen before takes the plan an earlier prompt of its M bucket made, with the uncached path's bits; the
families whose plan depends on M, a non-contiguous x and another bucket still get plans of their own."""

from __future__ import annotations

import pytest
import torch

import glyd

from .conftest import DEVICES, bits_of as _bits, needs_triton, random_weights

pytestmark = [needs_triton, pytest.mark.usefixtures("plans_on")]


def _by_m(monkeypatch, short, long):
    """The registry chooses ``short`` (kernel name, config) up to M = 64 and ``long`` past it; calls counted."""
    from glyd.kernels import registry

    picks = [(registry.kernel_class(name), cfg) for name, cfg in (short, long)]
    calls = []
    monkeypatch.setattr(registry, "choose", lambda problem, device: calls.append(problem.m) or picks[problem.m > 64])
    return calls


def _uncached(cases, p):
    """The uncached path's bits of each (x, bias) (plans off, which forgets them all: before any plan is made)."""
    from glyd import kernels
    from glyd.kernels import _plan

    _plan.set_enabled(False)
    try:
        return [_bits(kernels.linear(x, p, bias)) for x, bias in cases]
    finally:
        _plan.set_enabled(True)


def _long_families():
    from glyd.kernels import Dense11LongConfig, LongConfig, TieredLongConfig

    return [("fixed12", "fixed12_unpack_cublas", LongConfig()), ("dense11", "dense11_unpack_cublas", Dense11LongConfig()),
            ("tiered", "tiered_unpack_cublas", TieredLongConfig())]


@pytest.mark.parametrize("family", range(3))
@pytest.mark.parametrize("device", DEVICES)
def test_a_prompt_of_a_new_length_takes_the_plan_of_its_bucket(monkeypatch, device, family):
    from glyd import kernels
    from glyd.kernels import GemvConfig

    layout, name, cfg = _long_families()[family]
    calls = _by_m(monkeypatch, ("fixed12_gemv", GemvConfig()), (name, cfg))
    # 8 rows: one row tile of the dense11 unpack (8 rows a program), so each of its 22 unpacks here is one program of
    # Triton's interpreter, not two (12 rows: 21 s in a 2-core run, 2026-12-07; about half with 8); no plan depends on N
    n, k = 8, 100
    p = glyd.pack(random_weights(n, k, "normal"), layout).to(device)
    bias = torch.randn(n).to(torch.bfloat16).to(device)
    runs = [(torch.randn(1, m, k).to(torch.bfloat16).to(device), b, first)
            for lengths, b in (((100, 117, 128, 65), None), ((90, 120), bias), ((200, 255, 129), None))
            for first, m in zip((1, 0, 0, 0), lengths)]
    runs.append((torch.randn(300, k).to(torch.bfloat16).to(device), None, 1))  # M 256+ (and 2-D): a plan of its own
    wants = _uncached([(x, b) for x, b, _ in runs], p)
    for (x, b, first), want in zip(runs, wants):
        calls.clear()
        y = kernels.linear(x, p, b)
        m = x.shape[-2]
        assert y.shape == (*x.shape[:-1], n) and torch.equal(_bits(y), want), m
        assert calls == ([m] if first else []), (m, calls)  # chosen once a bucket (and kind of bias)


def test_families_that_plan_for_one_m_and_a_strided_x_keep_a_plan_a_shape(monkeypatch):
    from glyd import kernels
    from glyd.kernels import GemvConfig, LongConfig

    calls = _by_m(monkeypatch, ("fixed12_gemv", GemvConfig(bm=8, bn=16, bk=128)), ("fixed12_unpack_cublas", LongConfig()))
    p = glyd.pack(random_weights(16, 128, "normal"))
    # M 5-7: one M bucket, but the GEMV's grid is M's; M 70, 80: rows 0, 2, 4, ... of a wider x, not contiguous
    xs = [torch.randn(m, 128).to(torch.bfloat16) for m in (5, 6, 7)]
    xs += [torch.randn(2 * m, 128).to(torch.bfloat16)[::2] for m in (70, 80)]
    wants = _uncached([(x, None) for x in xs], p)
    for x, want in zip(xs, wants):  # a plan each
        calls.clear()
        assert torch.equal(_bits(kernels.linear(x, p)), want) and calls == [x.shape[0]]


def test_prompts_of_many_lengths_leave_the_decode_plans_and_are_bounded(monkeypatch):
    from glyd import kernels
    from glyd.kernels import GemvConfig, LongConfig, _plan

    calls = _by_m(monkeypatch, ("fixed12_gemv", GemvConfig(bm=1, bn=16, bk=128)), ("fixed12_unpack_cublas", LongConfig()))
    monkeypatch.setattr(_plan, "MAX_PLANS", 2)
    p = glyd.pack(random_weights(16, 128, "normal"))
    one = torch.randn(1, 128).to(torch.bfloat16)
    kernels.linear(one, p)
    for m in range(65, 85):  # twenty prompt lengths: one plan for them all
        kernels.linear(torch.randn(m, 128).to(torch.bfloat16), p)
    assert _plan.count() == 2 and calls == [1, 65]
    kernels.linear(one, p)
    assert calls == [1, 65]  # the decode step's plan is still kept
    # kinds of x past MAX_RANGED: the oldest goes (a bias each time makes a new kind)
    monkeypatch.setattr(_plan, "MAX_RANGED", 1)
    x = torch.randn(70, 128).to(torch.bfloat16)
    kernels.linear(x, p, torch.randn(16).to(torch.bfloat16))
    calls.clear()
    kernels.linear(x, p)
    assert calls == [70] and _plan.count() == 2
