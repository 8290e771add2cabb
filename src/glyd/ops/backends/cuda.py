"""The CUDA implementations of the ``glyd::`` ops: the Triton kernels (``glyd.kernels``, imported at
the first call), or the twin where Triton does not import, ``x`` is on another device, or the
layout has no kernels (its entry in ``glyd.codec.LAYOUTS`` names none).

``x`` of another dtype than bf16 (the fused kernels take bf16): the weight is unpacked on the GPU,
bit for bit, cast to ``x``'s dtype and multiplied by ``F.linear`` in that dtype, as the twin does
(the same bits; the twin would decode on the CPU and copy the matrix over)."""

from __future__ import annotations

import functools
import importlib
import logging

import torch
import torch.nn.functional as F

from glyd.codec.layout import LAYOUTS
from glyd.kernels import _plan
from glyd.ops.backends import torch as twin

log = logging.getLogger(__name__)

__all__ = ["triton_available", "linear", "unpack", "rows"]


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when ``triton`` imports (checked once)."""
    try:
        importlib.import_module("triton")
        return True
    except Exception as exc:  # ImportError, or a broken install raising anything else
        log.info("Triton is not available (%s); glyd's ops use the pure-torch twin", exc)
        return False


def linear(x: torch.Tensor, layout: str, shape, arrays, bias, version: int) -> torch.Tensor:
    if _plan.enabled():  # a call like an earlier one: its kept plan (glyd.kernels._plan)
        y = _plan.run(x, layout, shape, arrays, bias, version)
        if y is not None:
            return y
    p = twin.packed(layout, shape, arrays, version)
    lay = LAYOUTS[layout]
    if not triton_available() or p.device != x.device or not lay.kernels:
        return twin.linear(x, layout, shape, arrays, bias, version)
    from glyd import kernels

    if x.dtype != torch.bfloat16:  # the documented cast (module docstring)
        if lay.unpack_kernel is None:
            return twin.linear(x, layout, shape, arrays, bias, version)
        return F.linear(x, kernels.unpack(p).to(x.dtype), bias)
    return kernels.linear(x, p, bias)


def unpack(layout: str, shape, arrays, version: int) -> torch.Tensor:
    if not triton_available() or LAYOUTS[layout].unpack_kernel is None:
        return twin.unpack(layout, shape, arrays, version)
    from glyd import kernels

    return kernels.unpack(twin.packed(layout, shape, arrays, version))


def rows(layout: str, shape, arrays, version: int, index: torch.Tensor) -> torch.Tensor:
    p = twin.packed(layout, shape, arrays, version)
    if layout != "fixed12" or not triton_available() or p.device != index.device:
        return twin.rows(layout, shape, arrays, version, index)
    from glyd.kernels.fixed12 import rows as rows_kernel
    from glyd.ops._checks import check_arrays_once, check_ids

    # the same checks as every other path (glyd.ops.rows): ids in [0, rows) by a device-side assert
    # (whole-number float ids too), the arrays once a matrix; then one launch (the twin took ~30 ops)
    check_ids(index, p.shape[0])
    check_arrays_once(p)
    flat = index.reshape(-1).to(torch.int64)
    return rows_kernel.rows(p, flat).reshape(*index.shape, p.shape[1])
