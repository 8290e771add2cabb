"""The CPU implementations of the ``glyd::`` ops: glyd's C kernels for ``fixed12``
(``glyd.kernels.fixed12.cpu``: a one-pass unpack, row lookups and a decode-and-multiply), the twin for every
other layout, for ``x`` neither bf16 nor fp32, and where the kernels are not built.

``linear`` sums in another order than bf16's ``F.linear`` (as the GPU kernels do); ``unpack`` is
bit for bit, so ``exact=True`` modules (unpack, then ``F.linear``) keep bf16's bits.
"""

from __future__ import annotations

import torch

from glyd.ops.backends import torch as twin

__all__ = ["kernels_available", "linear", "unpack", "rows"]


def kernels_available() -> bool:
    """True when glyd's compiled CPU kernels import (checked once, at the first call)."""
    from glyd.kernels.fixed12 import cpu as cpu_fixed12

    return cpu_fixed12.available()


def linear(x: torch.Tensor, layout: str, shape, arrays, bias, version: int) -> torch.Tensor:
    if layout != "fixed12" or x.dtype not in (torch.bfloat16, torch.float32) or not kernels_available():
        return twin.linear(x, layout, shape, arrays, bias, version)
    p = twin.packed(layout, shape, arrays, version)
    if p.device != x.device or (bias is not None and (bias.dtype != x.dtype or bias.device != x.device)):
        return twin.linear(x, layout, shape, arrays, bias, version)
    from glyd.kernels.fixed12 import cpu as cpu_fixed12

    return cpu_fixed12.linear(x, p, bias)


def unpack(layout: str, shape, arrays, version: int) -> torch.Tensor:
    if layout != "fixed12" or not kernels_available():
        return twin.unpack(layout, shape, arrays, version)
    from glyd.kernels.fixed12 import cpu as cpu_fixed12

    return cpu_fixed12.unpack(twin.packed(layout, shape, arrays, version))


def rows(layout: str, shape, arrays, version: int, index: torch.Tensor) -> torch.Tensor:
    if layout != "fixed12" or index.device.type != "cpu" or not kernels_available():
        return twin.rows(layout, shape, arrays, version, index)
    from glyd.kernels.fixed12 import cpu as cpu_fixed12
    from glyd.ops._checks import check_arrays_once, check_ids

    p = twin.packed(layout, shape, arrays, version)
    # the same checks as every other path (glyd.ops.rows): ids in [0, rows) (whole-number float ids
    # too, as a checkpoint may store them), the arrays once a matrix; then int64 ids for the C kernel
    check_ids(index, p.shape[0])
    check_arrays_once(p)
    return cpu_fixed12.rows(p, index.to(torch.int64) if index.dtype != torch.int64 else index)
