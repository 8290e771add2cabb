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

from glyd._version import __version__
from glyd.codec import LAYOUTS, Packed, pack, unpack
from glyd.errors import CorruptError, DestinationExistsError, FormatError, GlydError, UnsupportedError

# ``quant_method: "glyd"`` for transformers, registered when (and only if) transformers is imported.
from glyd.hf._register import install as _install_hf_hook

_install_hf_hook()

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


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'glyd' has no attribute {name!r}")
