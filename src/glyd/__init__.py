"""Glyd: lossless bf16 weight compression with GPU kernels that multiply from the packed form.

>>> import torch, glyd
>>> w = torch.randn(64, 96).mul(0.02).to(torch.bfloat16)
>>> p = glyd.pack(w, layout="fixed12")
>>> torch.equal(glyd.unpack(p).view(torch.int16), w.view(torch.int16))
True

``import glyd`` needs only torch and numpy: Triton kernels and the transformers integration are
imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from glyd import codec as _codec
from glyd._version import __version__
from glyd.codec import LAYOUTS, Packed, unpack
from glyd.errors import CorruptError, DestinationExistsError, FormatError, GlydError, UnsupportedError

# ``quant_method: "glyd"`` for transformers, registered when (and only if) transformers is imported.
from glyd.hf._register import install as _install_hf_hook

_install_hf_hook()

# The registry's ``glyd`` is another product with this import name: say so if it is installed here.
from glyd._dist import warn_conflicts as _warn_conflicts

_warn_conflicts()

# Public names that live in modules with heavy dependencies (transformers, triton).
_LAZY = {
    "from_pretrained": "glyd.hf",
    "save_pretrained": "glyd.hf",
    "compress": "glyd.hf",
    "verify": "glyd.hf",
    "GlydLinear": "glyd.nn",
    "GlydEmbedding": "glyd.nn",
    "GlydCache": "glyd.kv",
}

__all__ = [
    "__version__",
    "LAYOUTS",
    "Packed",
    "pack",
    "unpack",
    "GlydError",
    "FormatError",
    "CorruptError",
    "DestinationExistsError",
    "UnsupportedError",
    *_LAZY,
]


def pack(matrix: torch.Tensor, layout: str = "fixed12") -> Packed:
    """Pack a 2-D bf16 matrix losslessly, with the CPU reference codec (``glyd.ops.pack`` packs on
    the GPU, bit-identically); the result is on the CPU and ``glyd.unpack`` gives every bit back.

    ``layout``: ``"fixed12"`` (12 bits a weight plus rare exceptions; fastest to decode),
    ``"tiered"`` (about 10.5-10.8 bits a weight), or ``"auto"``: the layout
    ``glyd.ops.choose_layout`` picks for the matrix's shape on the matrix's device, from the kernel
    times measured on that GPU, as ``glyd.from_pretrained(layout="auto")`` and ``glyd pack --layout
    auto`` choose it; ``"fixed12"`` for a CPU tensor or a GPU without measurements. Any shape;
    padding is internal.

    >>> import torch, glyd
    >>> p = glyd.pack(torch.zeros(2, 3, dtype=torch.bfloat16), layout="auto")
    >>> p.layout, p.shape
    ('fixed12', (2, 3))
    """
    if layout == "auto":
        from glyd.ops import choose_layout

        layout = choose_layout(tuple(matrix.shape), matrix.device) if isinstance(matrix, torch.Tensor) else "fixed12"
    elif layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of auto, {', '.join(LAYOUTS)}")
    return _codec.pack(matrix, layout)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'glyd' has no attribute {name!r}")
