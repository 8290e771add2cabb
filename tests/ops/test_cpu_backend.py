"""The glyd:: ops on CPU tensors: glyd's C kernels for fixed12 (``ops/backends/cpu.py``), the twin
for every other case; ``exact=True`` modules keep bf16's bits either way."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import glyd
import glyd.ops as ops
from glyd.ops.backends import torch as twin

from .conftest import random_weights


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@pytest.fixture
def calls(cpu_kernels, monkeypatch):
    """Counts the C kernels' calls by name."""
    seen = {"linear": 0, "unpack": 0, "rows": 0}
    for name in seen:
        real = getattr(cpu_kernels, name)

        def counted(*a, _real=real, _name=name, **kw):
            seen[_name] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(cpu_kernels, name, counted)
    return seen


def test_fixed12_on_the_cpu_runs_the_c_kernels(calls):
    w = random_weights(40, 96)
    p = ops.pack(w, "fixed12")
    x = torch.randn(2, 96).to(torch.bfloat16)
    y = ops.linear(x, p)
    ref = F.linear(x.double(), w.double())
    assert ((y.double() - ref).norm() / ref.norm()).item() < 8e-3
    assert torch.equal(_bits(ops.unpack(p)), _bits(w))
    assert torch.equal(_bits(ops.rows(p, torch.tensor([3, 39]))), _bits(w[[3, 39]]))
    assert calls == {"linear": 1, "unpack": 1, "rows": 1}


def test_other_layouts_and_dtypes_take_the_twin(calls):
    w = random_weights(40, 96)
    x = torch.randn(2, 96).to(torch.bfloat16)
    for layout in ("tiered", "dense11"):
        p = ops.pack(w, layout)
        args = ops._args(p)
        assert torch.equal(_bits(ops.linear(x, p)), _bits(twin.linear(x, args[0], args[1], args[2], None, args[3])))
    p = ops.pack(w, "fixed12")
    x64 = torch.randn(2, 96, dtype=torch.float64)
    assert torch.equal(ops.linear(x64, p), F.linear(x64, w.double()))
    bias32 = torch.randn(40)  # a bias of another dtype than x: the twin, whose F.linear decides
    with pytest.raises(RuntimeError):
        ops.linear(x, p, bias32)
    assert calls == {"linear": 0, "unpack": 0, "rows": 0}


def test_without_the_kernels_the_twin_runs(cpu_kernels, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    w = random_weights(40, 96)
    p = ops.pack(w, "fixed12")
    x = torch.randn(3, 96).to(torch.bfloat16)
    assert torch.equal(_bits(ops.linear(x, p)), _bits(F.linear(x, w)))  # the twin: bf16's own product
    assert torch.equal(_bits(ops.unpack(p)), _bits(w))


def test_exact_modules_keep_bf16_bits_with_the_c_kernels(calls):
    w = random_weights(40, 96)
    b = torch.randn(40).to(torch.bfloat16)
    lin = glyd.GlydLinear(ops.pack(w, "fixed12"), b, exact=True)
    x = torch.randn(5, 96).to(torch.bfloat16)
    assert torch.equal(_bits(lin(x)), _bits(F.linear(x, w, b)))
    assert calls["unpack"] == 1 and calls["linear"] == 0


def test_backward_through_the_c_kernels(cpu_kernels):
    w = random_weights(12, 96)
    p = ops.pack(w, "fixed12")
    x = torch.randn(4, 96, requires_grad=True)
    ops.linear(x, p).sum().backward()
    assert torch.equal(x.grad, torch.ones(4, 12) @ w.float())


def test_an_array_replaced_at_a_freed_arrays_id_is_validated(monkeypatch):
    # twin.packed skips validation for the arrays it validated last, keyed by their ids and versions: a
    # non-first array freed and replaced by a tensor that took its id (CPython's next object, version 0)
    # was trusted as it was, whatever its shape (here 'code' of another matrix: the kernels read past it)
    p = glyd.pack(random_weights(8, 64), "fixed12")
    other = glyd.pack(random_weights(4, 64), "fixed12")
    names = list(p.arrays)
    arrays = [p.arrays[n] for n in names]
    twin.packed("fixed12", [8, 64], arrays, p.version)
    i = names.index("code")  # not the first array: the entry dies with that one
    old = id(arrays[i])
    del p, arrays[i]
    new = other.arrays["code"].clone()
    for _ in range(100):  # (usually the first try)
        if id(new) == old:
            break
        new = other.arrays["code"].clone()
    else:  # CPython gave the slot to another object: the module sees the old id, the same case
        real = id
        monkeypatch.setattr(twin, "id", lambda o: old if o is new else real(o), raising=False)
    assert getattr(twin, "id", id)(new) == old
    arrays.insert(i, new)
    with pytest.raises(glyd.errors.FormatError, match="code"):
        twin.packed("fixed12", [8, 64], arrays, other.version)
