"""The op face: ``glyd::linear``, ``glyd::unpack`` and ``glyd::rows`` as ``torch.library`` ops.

A packed matrix travels as its layout, true shape, format version and arrays (in the layout's
``ARRAYS`` order). Each op has a fake (meta) implementation, so ``torch.compile`` traces through it,
and an autograd formula for ``x`` (the packed weights are constants). Its default implementation is
the pure-torch twin (``backends/torch.py``: any device, and the reference of the tests); CUDA tensors
take the Triton kernels (``backends/cuda.py``), CPU tensors glyd's C kernels for ``fixed12``
(``backends/cpu.py``); both fall back to the twin where their kernels are missing.

>>> import torch, glyd
>>> p = glyd.pack((torch.randn(8, 16) * 0.02).to(torch.bfloat16))
>>> y = torch.ops.glyd.linear(torch.randn(2, 16).to(torch.bfloat16), p.layout, list(p.shape),
...                           list(p.arrays.values()), None, p.version)
>>> y.shape
torch.Size([2, 8])
"""

from __future__ import annotations

import torch

from glyd.ops.backends import cpu as _cpu
from glyd.ops.backends import cuda as _cuda
from glyd.ops.backends import torch as _twin

__all__ = ["LIB"]

LIB = torch.library.Library("glyd", "DEF")  # noqa: TOR901 - the library lives as long as the process

LIB.define("linear(Tensor x, str layout, SymInt[] shape, Tensor[] arrays, Tensor? bias, int version) -> Tensor")
LIB.define("unpack(str layout, SymInt[] shape, Tensor[] arrays, int version) -> Tensor")
LIB.define("rows(str layout, SymInt[] shape, Tensor[] arrays, int version, Tensor index) -> Tensor")

LIB.impl("linear", _twin.linear, "CompositeExplicitAutograd")
LIB.impl("unpack", _twin.unpack, "CompositeExplicitAutograd")
LIB.impl("rows", _twin.rows, "CompositeExplicitAutograd")
LIB.impl("linear", _cpu.linear, "CPU")
LIB.impl("unpack", _cpu.unpack, "CPU")
LIB.impl("rows", _cpu.rows, "CPU")
LIB.impl("linear", _cuda.linear, "CUDA")
LIB.impl("unpack", _cuda.unpack, "CUDA")
LIB.impl("rows", _cuda.rows, "CUDA")


@torch.library.register_fake("glyd::linear")
def _linear_fake(x, layout, shape, arrays, bias, version):
    return x.new_empty((*x.shape[:-1], shape[0]))  # x's dtype, as the twin's F.linear and the kernels


@torch.library.register_fake("glyd::unpack")
def _unpack_fake(layout, shape, arrays, version):
    return arrays[0].new_empty(tuple(shape), dtype=torch.bfloat16)


@torch.library.register_fake("glyd::rows")
def _rows_fake(layout, shape, arrays, version, index):
    return arrays[0].new_empty((*index.shape, shape[1]), dtype=torch.bfloat16)


def _linear_setup(ctx, inputs, output):
    x, layout, shape, arrays, bias, version = inputs
    ctx.packed = (layout, shape, arrays, version)
    ctx.x_dtype = x.dtype
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad):
    # d(x @ W^T + b)/dx = grad @ W; the bias's gradient is the sum over rows (W is constant)
    layout, shape, arrays, version = ctx.packed
    w = torch.ops.glyd.unpack(layout, shape, arrays, version).to(ctx.x_dtype)  # as the forward's twin
    gx = grad.to(ctx.x_dtype) @ w
    gb = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
    return gx, None, None, [None] * len(arrays), gb, None


torch.library.register_autograd("glyd::linear", _linear_backward, setup_context=_linear_setup)
