"""The products and conversions the nn modules use, all through ``glyd.ops`` (GPU Triton kernels
on CUDA, the pure-torch reference elsewhere). The modules call these module-level names, so a test
can patch one place (for example to prove that loading a saved folder packs nothing)."""

from __future__ import annotations

import torch

from glyd import ops
from glyd.codec import Packed


def unpack(packed: Packed) -> torch.Tensor:
    """The bf16 matrix of ``packed`` on ``packed``'s device, bit for bit."""
    return ops.unpack(packed)


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` the packed matrix (fused kernel on the GPU)."""
    return ops.linear(x, packed, bias)


def pack(w: torch.Tensor, layout: str) -> Packed:
    """Pack a 2-D bf16 matrix with ``layout``; the result lives on ``w``'s device."""
    return ops.pack(w, layout)


def choose_layout(shape: tuple[int, int], device: torch.device | str) -> str:
    """The layout ``"auto"`` resolves to for a matrix of ``shape`` on ``device``."""
    return ops.choose_layout(tuple(shape), device)
