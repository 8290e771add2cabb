"""CPU reference codec: the source of truth for every layout.

>>> import torch, glyd
>>> w = torch.randn(8, 8).to(torch.bfloat16)
>>> p = glyd.pack(w, layout="tiered")
>>> torch.equal(glyd.unpack(p).view(torch.int16), w.view(torch.int16))
True
"""

from __future__ import annotations

import torch

from glyd.codec import fixed12, tiered, dense11  # noqa: F401, I001 - each registers its layout, in this order
from glyd.codec.experts import PackedExperts, pack_experts, unpack_experts
from glyd.codec.layout import LAYOUTS, Layout, register
from glyd.codec.packed import FORMAT_VERSION, Packed

__all__ = ["FORMAT_VERSION", "LAYOUTS", "Layout", "Packed", "PackedExperts", "register", "pack", "unpack",
           "pack_experts", "unpack_experts"]


def pack(matrix: torch.Tensor, layout: str = "fixed12") -> Packed:
    """Pack a 2-D bf16 matrix losslessly.

    ``layout`` is ``"fixed12"`` (12 bits a weight plus rare exceptions; fastest to decode) or
    ``"tiered"`` (about 10.5-10.8 bits a weight) or ``"dense11"`` (about 11.1-11.2 bits a weight,
    fixed rate with popcount-ranked escapes). Any shape; padding is internal.

    >>> import torch, glyd
    >>> p = glyd.pack(torch.zeros(2, 3, dtype=torch.bfloat16), layout="fixed12")
    >>> p.shape
    (2, 3)
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    return LAYOUTS[layout].pack(matrix)


def unpack(packed: Packed) -> torch.Tensor:
    """The bf16 matrix of ``packed``, bit for bit, on the CPU (``glyd.kernels.unpack`` for the GPU)."""
    if not isinstance(packed, Packed):
        raise TypeError(f"unpack expects a glyd Packed, got {type(packed).__name__}")
    if packed.device.type != "cpu":
        packed = packed.to("cpu")
    if packed.numel == 0:
        return torch.empty(packed.shape, dtype=torch.bfloat16)
    return LAYOUTS[packed.layout].unpack(packed)
