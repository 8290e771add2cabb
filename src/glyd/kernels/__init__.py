"""Triton GPU kernels: bit-exact unpack, fused linear, and GPU pack for every layout.

``import glyd.kernels`` imports no Triton; the first call of ``linear`` or ``unpack`` does.
Every function takes a ``glyd.Packed`` whose arrays sit on the GPU (or on the CPU under
``TRITON_INTERPRET=1``, how the tests run them without a GPU).

Example (needs a CUDA GPU)::

    import torch, glyd, glyd.kernels
    w = (torch.randn(4096, 4096, device="cuda") * 0.02).to(torch.bfloat16)
    p = glyd.kernels.pack(w, "fixed12")      # on the GPU, bit-identical to glyd.pack
    y = glyd.kernels.linear(torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16), p)
    assert torch.equal(glyd.kernels.unpack(p).view(torch.int16), w.view(torch.int16))

``linear`` never synchronises with the host, so it can run inside a CUDA graph; the first call on
a matrix builds a small derived index (fixed12 exceptions) with host syncs, so call it once before
capturing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from glyd.codec.packed import Packed

__all__ = ["linear", "unpack", "pack", "prepare", "Config"]


def _module(layout: str):
    if layout == "fixed12":
        return importlib.import_module("glyd.kernels.fixed12")
    if layout == "tiered":
        return importlib.import_module("glyd.kernels.tiered")
    raise ValueError(f"no kernels for layout {layout!r}")


def linear(x: torch.Tensor, packed: "Packed", bias: torch.Tensor | None = None, config=None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` straight from the packed ``W`` [N, K]; x bf16 [..., K] -> bf16 [..., N].

    fp32 accumulation. ``config`` (a ``glyd.kernels.Config``) overrides the block shapes chosen
    per M bucket; leave it ``None``.
    """
    from glyd.codec.packed import Packed

    if not isinstance(packed, Packed):
        raise TypeError(f"packed must be a glyd.Packed, got {type(packed).__name__}")
    return _module(packed.layout).linear(x, packed, bias, config)


def unpack(packed: "Packed", out: torch.Tensor | None = None) -> torch.Tensor:
    """The bf16 matrix of ``packed``, bit for bit, decoded on the GPU (into ``out`` if given)."""
    from glyd.codec.packed import Packed

    if not isinstance(packed, Packed):
        raise TypeError(f"packed must be a glyd.Packed, got {type(packed).__name__}")
    return _module(packed.layout).unpack(packed, out)


def pack(w: torch.Tensor, layout: str = "fixed12") -> "Packed":
    """Pack ``w`` on its own device with torch ops (bit-identical to ``glyd.pack``); no Triton."""
    from glyd.kernels.gpu_pack import pack as _pack

    return _pack(w, layout)


def prepare(packed: "Packed") -> None:
    """Build the derived per-matrix index now (host syncs), e.g. before capturing a CUDA graph."""
    if packed.layout == "fixed12":
        _module("fixed12").prepare(packed)
    elif packed.layout == "tiered" and _module("tiered").SPARSE_DEEP:  # the opt-in deep-weight list
        _module("tiered").prepare(packed)


def __getattr__(name: str):
    if name == "Config":
        return importlib.import_module("glyd.kernels._common").Config
    raise AttributeError(f"module 'glyd.kernels' has no attribute {name!r}")
