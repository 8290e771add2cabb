"""The transformers integration: load, pack, save and verify transformers models (causal LMs,
encoders, ...) with packed weights.

>>> import glyd                                                   # doctest: +SKIP
>>> model = glyd.from_pretrained("path/to/bf16-model")           # doctest: +SKIP
>>> glyd.save_pretrained(model, "model-glyd")                     # doctest: +SKIP
>>> from transformers import AutoModelForCausalLM
>>> again = AutoModelForCausalLM.from_pretrained("model-glyd")   # doctest: +SKIP

Importing this package does not import transformers; the functions below do, on first use.
See ``docs/models.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

from glyd.hf._register import install, register

_LAZY = {
    "from_pretrained": "glyd.hf.loading",
    "compress": "glyd.hf.loading",
    "save_pretrained": "glyd.hf.save",
    "verify": "glyd.hf.integrity",
    "GlydConfig": "glyd.hf.quantizer",
    "GlydHfQuantizer": "glyd.hf.quantizer",
}

__all__ = ["install", "register", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'glyd.hf' has no attribute {name!r}")
install()
