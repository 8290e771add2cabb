"""The CUDA implementations of the ``glyd::`` ops: the Triton kernels (``glyd.kernels``, imported at
the first call), the twin where Triton does not import or ``x`` is not bf16."""

from __future__ import annotations

import functools
import importlib
import logging

import torch

from glyd.ops.backends import torch as twin

log = logging.getLogger(__name__)

__all__ = ["triton_available", "linear", "unpack"]


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
    p = twin.packed(layout, shape, arrays, version)
    if x.dtype != torch.bfloat16 or not triton_available() or p.device != x.device:
        return twin.linear(x, layout, shape, arrays, bias, version)
    from glyd import kernels

    return kernels.linear(x, p, bias)


def unpack(layout: str, shape, arrays, version: int) -> torch.Tensor:
    if not triton_available():
        return twin.unpack(layout, shape, arrays, version)
    from glyd import kernels

    return kernels.unpack(twin.packed(layout, shape, arrays, version))
