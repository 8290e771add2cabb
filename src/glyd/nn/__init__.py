"""Torch modules over packed weights: ``GlydLinear``, ``GlydEmbedding`` and their helpers.

>>> import torch, glyd
>>> from glyd.nn import GlydLinear
>>> lin = GlydLinear(glyd.pack(torch.randn(6, 4).to(torch.bfloat16)))
>>> lin(torch.randn(3, 4).to(torch.bfloat16)).shape
torch.Size([3, 6])
"""

from glyd.nn.experts import GlydExperts
from glyd.nn.modules import (
    BUFFER_PREFIX,
    GlydEmbedding,
    GlydLinear,
    GlydLinearPart,
    GlydTiedEmbedding,
    GlydTiedLinear,
    PackedWeight,
    set_exact,
)
from glyd.ops.rows import unpack_rows

__all__ = [
    "BUFFER_PREFIX",
    "GlydEmbedding",
    "GlydExperts",
    "GlydLinear",
    "GlydLinearPart",
    "GlydTiedEmbedding",
    "GlydTiedLinear",
    "PackedWeight",
    "set_exact",
    "unpack_rows",
]
