"""glyd.kv: the KV cache held losslessly compressed, with a fused decode-attention kernel.

>>> import torch
>>> from glyd.kv import PageStore
>>> x = torch.randn(2, 4, 100, 64).to(torch.bfloat16)   # [batch, kv heads, tokens, head dim]
>>> st = PageStore.from_bf16(x, page=64)
>>> torch.equal(st.to_bf16().view(torch.int16), x.view(torch.int16))
True

Two page codes: :class:`FixedPageStore` (``glyd.kv.fixed``, ``kvf12``: 12 bits a value plus rare
exceptions, the cheapest decode; ``GlydCache``'s default) and :class:`PageStore` (``glyd.kv.pages``:
the ``kvtiered`` code with escape tiers, ``GlydCache(code="kvtiered")``).

>>> st = FixedPageStore.from_bf16(x, page=64)
>>> torch.equal(st.to_bf16().view(torch.int16), x.view(torch.int16))
True

``GlydStaticCache`` holds them in a static pool of kvf12 pages (``FixedPagePool``: reserved once, CUDA
graphs and ``torch.compile`` see the same shapes every step); ``glyd.kv.generate`` hands ``generate`` one
for ``glyd.from_pretrained(..., kv="lossless")``.

``GlydCache`` / ``GlydStaticCache`` / ``make_cache`` need transformers; ``decode_attention`` uses Triton on CUDA
tensors. Both are imported on first use, so ``import glyd.kv`` needs only torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from glyd.kv.fixed import FixedPageStore
from glyd.kv.pages import PageStore, pack_blocks, unpack_blocks

_LAZY = {
    "GlydCache": "glyd.kv.cache",
    "GlydLayer": "glyd.kv.cache",
    "make_cache": "glyd.kv.cache",
    "enable_fused": "glyd.kv.hf_attention",
    "GlydStaticCache": "glyd.kv.static_cache",
    "FixedPagePool": "glyd.kv.pool",
    "KVCapacityError": "glyd.kv.pool_twin",
    "decode_attention": "glyd.kv.attention",
    "decode_attention_reference": "glyd.kv.attention",
    "decode_attention_torch": "glyd.kv.attention",
}

__all__ = ["FixedPageStore", "PageStore", "pack_blocks", "unpack_blocks", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'glyd.kv' has no attribute {name!r}")
