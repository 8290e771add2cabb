"""``glyd.ops._eager``: an eager product skips the dispatcher only where it would pass the call
straight through to the CUDA or CPU implementation; gradients, modes, transforms, the profiler,
traces and torch.compile take the op."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import glyd
from glyd.ops import _eager

from .conftest import random_weights

HAS_CUDA = torch.cuda.is_available()


def _inputs(device="cpu"):
    p = glyd.pack(random_weights(8, 64)).to(device)
    layout, shape, arrays, version = glyd.ops._args(p)
    return torch.randn(2, 64).to(torch.bfloat16).to(device), torch.randn(8).to(torch.bfloat16).to(device), arrays


class _Functions(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Dispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_plain_calls_pass_through_and_the_rest_do_not():
    x, bias, arrays = _inputs()
    assert _eager.USABLE  # the torch here has every probe
    assert _eager.passes_through(x, bias, arrays) and _eager.passes_through(x, None, arrays)
    from glyd.ops.backends import cpu

    assert _eager.backend(x, bias, arrays) is cpu.linear
    assert _eager.backend(x.to("meta"), None, arrays) is None  # a meta x: the op (its fake)
    xg = x.clone().requires_grad_()
    assert not _eager.passes_through(xg, bias, arrays)
    assert not _eager.passes_through(x, torch.nn.Parameter(bias.clone()), arrays)  # a bias that wants a gradient
    assert _eager.passes_through(x, torch.nn.Parameter(bias.clone(), requires_grad=False), arrays)
    with torch.no_grad():
        assert _eager.passes_through(xg, bias, arrays)
    with _Functions():
        assert not _eager.passes_through(x, bias, arrays)
    with _Dispatch():
        assert not _eager.passes_through(x, bias, arrays)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert not _eager.passes_through(x, bias, arrays)
    seen = []
    torch.func.vmap(lambda r: seen.append(_eager.passes_through(r, bias, arrays)) or r)(x)
    assert seen == [False]
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
    assert not _eager.passes_through(fake, bias, arrays)
    assert not _eager.passes_through(x, bias, [*arrays[:-1], fake])
    traced = []
    torch.jit.trace(lambda r: traced.append(_eager.passes_through(r, bias, arrays)) or r * 1, (x,), check_trace=False)
    assert traced == [False]


def test_plans_off_take_the_op(monkeypatch):
    from glyd.kernels import _plan

    x, bias, arrays = _inputs()
    _plan.set_enabled(False)
    try:
        assert not _eager.passes_through(x, bias, arrays)
    finally:
        _plan.set_enabled(None)


def test_torch_compile_traces_the_op():
    x, bias, arrays = _inputs()
    lin = glyd.GlydLinear(glyd.pack(random_weights(8, 64)))
    seen = []

    def step(x):
        seen.append(_eager.backend(x, None, arrays))
        return lin(x)

    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(step, backend="eager", fullgraph=True)(x)
    assert seen == [None] and torch.equal(got.view(torch.int16), lin(x).view(torch.int16))


def test_module_on_the_cpu_goes_direct_with_the_ops_bits(monkeypatch):
    from glyd.ops.backends import cpu

    lin = glyd.GlydLinear(glyd.pack(random_weights(16, 64)), torch.randn(16).to(torch.bfloat16))
    x = torch.randn(3, 64).to(torch.bfloat16)
    layout, shape, arrays, version = lin._op_args()
    want = torch.ops.glyd.linear(x, layout, shape, arrays, lin.bias, version)
    calls = []
    real = cpu.linear
    monkeypatch.setattr(_eager._cpu, "linear", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        assert torch.equal(lin(x).view(torch.int16), want.view(torch.int16))
    assert calls == [1]
    y = lin(x.clone().requires_grad_())  # a gradient wanted: the op, with its autograd formula
    assert y.grad_fn is not None and calls == [1]
    assert torch.equal(y.detach().view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_module_on_cuda_goes_direct_with_the_ops_bits(monkeypatch):
    from glyd.kernels import _plan
    from glyd.ops.backends import cuda

    lin = glyd.GlydLinear(glyd.pack(random_weights(4608, 3584, device="cuda")),
                          torch.randn(4608, device="cuda").to(torch.bfloat16))
    x = torch.randn(3, 3584, device="cuda").to(torch.bfloat16)
    _plan.set_enabled(False)
    want = lin(x)
    _plan.set_enabled(True)
    calls = []
    real = cuda.linear
    monkeypatch.setattr(_eager._cuda, "linear", lambda *a: calls.append(1) or real(*a))
    try:
        with torch.no_grad():
            for _ in range(4):
                assert torch.equal(lin(x).view(torch.int16), want.view(torch.int16))
        assert len(calls) == 4
        xg = x.clone().requires_grad_()
        y = lin(xg)  # a gradient wanted: the op, with its autograd formula
        assert y.grad_fn is not None and len(calls) == 4
        assert torch.equal(y.detach().view(torch.int16), want.view(torch.int16))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            lin(x)
        assert any(e.name == "glyd::linear" for e in prof.events()) and len(calls) == 4
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = lin(x)
        x.copy_(torch.randn(3, 3584, device="cuda").to(torch.bfloat16))
        g.replay()
        _plan.set_enabled(False)
        assert torch.equal(y.view(torch.int16), lin(x).view(torch.int16))
    finally:
        _plan.set_enabled(None)
