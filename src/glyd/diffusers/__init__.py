"""The diffusers integration: pack, save and load diffusers models (FLUX, SD3, DiT transformers,
any ``diffusers.ModelMixin``) with packed weights, used in their pipelines unchanged.

>>> import torch, glyd                                                     # doctest: +SKIP
>>> glyd.compress(pipe.transformer, exact=True)                            # doctest: +SKIP
>>> glyd.save_pretrained(pipe.transformer, "flux-glyd/transformer")        # doctest: +SKIP
>>> t = glyd.from_pretrained("flux-glyd", subfolder="transformer", exact=True)  # doctest: +SKIP

``glyd.compress``, ``glyd.save_pretrained`` and ``glyd.from_pretrained`` route diffusers models and
folders here. Importing this package does not import diffusers; the functions below do, on first
use. See ``docs/models.md`` ("diffusers").
"""

from __future__ import annotations

import importlib
from typing import Any

from glyd.diffusers._detect import is_diffusers_class, is_diffusers_model, wants_diffusers

_LAZY = {
    "compress": "glyd.diffusers.loading",
    "from_pretrained": "glyd.diffusers.loading",
    "save_pretrained": "glyd.diffusers.save",
}

__all__ = ["is_diffusers_class", "is_diffusers_model", "wants_diffusers", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'glyd.diffusers' has no attribute {name!r}")
