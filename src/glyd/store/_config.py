"""config.json of a packed folder: what transformers without glyd must refuse.

A packed folder's config.json says ``"model_type": "glyd"`` and keeps the model's own type in
``quantization_config.original_model_type`` (not ``model_type``: transformers' config classes take a
nested dict with their own ``model_type`` for the whole config). Plain transformers does not know the type ``glyd`` and raises
(naming it) instead of building a bf16 model whose weights are all missing and filled at random;
with glyd imported, ``glyd.hf`` registers the type and hands transformers the model's own config.
Folders written before this (the model's own ``model_type`` at the top) keep loading.

>>> cfg = packed_config({"model_type": "qwen2", "hidden_size": 8}, {"quant_method": "glyd"})
>>> cfg["model_type"], cfg["quantization_config"]["original_model_type"]
('glyd', 'qwen2')
>>> plain_config(cfg)
{'model_type': 'qwen2', 'hidden_size': 8}
"""

from __future__ import annotations

from typing import Any

#: The ``model_type`` of a packed folder's config.json.
PACKED_MODEL_TYPE = "glyd"
#: The field of ``quantization_config`` that holds the model's own ``model_type``.
ORIGINAL_KEY = "original_model_type"
#: ``quant_method`` of glyd's ``quantization_config``.
QUANT_METHOD = "glyd"


def packed_config(config: dict[str, Any], quantization: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a model's own config dict) as a packed folder's, with ``quantization`` attached."""
    out = dict(config)
    q = dict(quantization)
    own = out.get("model_type")
    if isinstance(own, str) and own and own != PACKED_MODEL_TYPE:
        q[ORIGINAL_KEY] = own
        out["model_type"] = PACKED_MODEL_TYPE
    out["quantization_config"] = q
    return out


def own_model_type(config: dict[str, Any]) -> Any:
    """The model's own type: ``quantization_config.original_model_type`` in a packed config, else ``model_type``."""
    q = config.get("quantization_config")
    if config.get("model_type") == PACKED_MODEL_TYPE and isinstance(q, dict):
        return q.get(ORIGINAL_KEY)
    return config.get("model_type")


def plain_config(config: dict[str, Any]) -> dict[str, Any]:
    """A packed folder's config as the model's own: glyd's quantization_config gone, its type back."""
    out = dict(config)
    q = out.get("quantization_config")
    if isinstance(q, dict) and q.get("quant_method") == QUANT_METHOD:
        out["model_type"] = own_model_type(out)
        del out["quantization_config"]
        if out["model_type"] is None:
            del out["model_type"]
    return out
