"""config.json of a packed folder: what transformers without glyd must refuse.

A packed folder's config.json says ``"model_type": "glyd"`` and keeps the model's own type in
``quantization_config.original_model_type`` (not ``model_type``: transformers' config classes take a
nested dict with their own ``model_type`` for the whole config). Plain transformers does not know the type ``glyd`` and raises
(naming it) instead of building a bf16 model whose weights are all missing and filled at random;
with glyd imported, ``glyd.hf`` registers the type and hands transformers the model's own config.
Folders written before this (the model's own ``model_type`` at the top) keep loading.

A packed folder also carries :data:`LOADER_FILE`, named in config.json's ``auto_map`` (the one hook
transformers honours for a config type it does not know; it runs it only with
``trust_remote_code=True``): a process that never imported glyd, such as ``transformers serve
--trust-remote-code PACKED``, imports glyd through it. transformers 5.17 reads no entry point.

``glyd pack`` also keeps the source's config.json bytes as they were (``SOURCE_CONFIG``), so that
``glyd unpack`` gives them back byte for byte; it refuses a config whose model it could not give
back (:func:`check_restorable`: a ``model_type`` of ``"glyd"`` or null).

>>> cfg = packed_config({"model_type": "qwen2", "hidden_size": 8}, {"quant_method": "glyd"})
>>> cfg["model_type"], cfg["quantization_config"]["original_model_type"]
('glyd', 'qwen2')
>>> cfg["auto_map"]
{'AutoConfig': 'glyd_loader.GlydPackedConfig'}
>>> plain_config(cfg)
{'model_type': 'qwen2', 'hidden_size': 8}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from glyd.errors import FormatError, show_path

#: The ``model_type`` of a packed folder's config.json.
PACKED_MODEL_TYPE = "glyd"
#: The field of ``quantization_config`` that holds the model's own ``model_type``.
ORIGINAL_KEY = "original_model_type"
#: ``quant_method`` of glyd's ``quantization_config``.
QUANT_METHOD = "glyd"
#: The module a packed folder carries for transformers' ``auto_map`` (written beside config.json).
LOADER_FILE = "glyd_loader.py"
#: config.json's ``auto_map["AutoConfig"]`` of a packed folder: the class of :data:`LOADER_FILE`.
LOADER_CLASS = "glyd_loader.GlydPackedConfig"
#: The text of :data:`LOADER_FILE`. It only imports glyd (which registers the config type and the
#: quantizer); transformers' import check skips what is inside try/except, so a missing glyd gets
#: this message, naming the right distribution, instead of "pip install glyd" (another project).
LOADER_SOURCE = '''"""A model packed losslessly by Glyd; transformers loads it through the glyd-lossless package.

transformers runs this file only when asked to trust the folder's code (trust_remote_code=True, or
`transformers serve --trust-remote-code`). It reads no weights: it imports glyd, which registers
the config type "glyd" and glyd's quantizer with transformers.
"""

try:
    from glyd.hf.packed_config import GlydPackedConfig
except ImportError as exc:
    raise ImportError(
        "this folder holds a model packed by Glyd: install glyd-lossless to load it "
        "(pip install 'glyd-lossless[models]')"
    ) from exc

__all__ = ["GlydPackedConfig"]
'''
#: The file of a packed folder that holds its source's config.json bytes as they were (``glyd pack``).
SOURCE_CONFIG = "glyd.source_config.json"


def packed_config(config: dict[str, Any], quantization: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a model's own config dict) as a packed folder's, with ``quantization`` attached."""
    out = dict(config)
    q = dict(quantization)
    own = out.get("model_type")
    if isinstance(own, str) and own and own != PACKED_MODEL_TYPE:
        q[ORIGINAL_KEY] = own
        out["model_type"] = PACKED_MODEL_TYPE
        auto = out.get("auto_map")
        if auto is None or (isinstance(auto, dict) and "AutoConfig" not in auto):
            out["auto_map"] = {**(auto or {}), "AutoConfig": LOADER_CLASS}
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
        auto = out.get("auto_map")
        if isinstance(auto, dict) and auto.get("AutoConfig") == LOADER_CLASS:
            auto = {k: v for k, v in auto.items() if k != "AutoConfig"}
            if auto:
                out["auto_map"] = auto
            else:
                del out["auto_map"]
        if out["model_type"] is None:
            del out["model_type"]
    return out


def describes(config: dict[str, Any], source: dict[str, Any]) -> bool:
    """Whether ``config`` (a packed folder's, or a plain one) describes the model of the source
    config ``source``: equal once plain, a null or empty ``quantization_config`` of the source aside
    (not quantized: glyd's takes its place)."""
    if source.get("quantization_config", 0) in (None, {}):
        source = {k: v for k, v in source.items() if k != "quantization_config"}
    return plain_config(config) == source


def check_restorable(config: dict[str, Any], where: object) -> None:
    """Raise FormatError (naming ``where``) unless the packed folder's config of ``config`` gives
    ``config`` back (:func:`plain_config`), as the loaders read it (a null or empty
    ``quantization_config`` aside: glyd's takes its place).

    >>> check_restorable({"model_type": "glyd"}, "config.json")
    Traceback (most recent call last):
    ...
    glyd.errors.FormatError: config.json: model_type 'glyd' is the type of a packed folder's config: glyd cannot pack a model that claims it (it would come back without a model_type)
    """
    back = plain_config(packed_config(config, {"quant_method": QUANT_METHOD}))
    if describes(back, config):
        return
    own = config.get("model_type")
    if own == PACKED_MODEL_TYPE:
        raise FormatError(f"{show_path(where)}: model_type {own!r} is the type of a packed folder's config: glyd "
                          "cannot pack a model that claims it (it would come back without a model_type)")
    keys = sorted(k for k in config.keys() | back.keys() if config.get(k, ...) != back.get(k, ...))
    raise FormatError(f"{show_path(where)}: glyd could not give this config back as it is (field(s) "
                      f"{', '.join(keys)}, e.g. model_type {own!r}): refusing to pack it")


def already_quantized(where: Any, method: Any) -> FormatError:
    """The error for a bf16 load of a folder whose config.json names a quantization: glyd's own one
    without its glyd.json is an incomplete glyd folder, not a model to pack."""
    if method == QUANT_METHOD:
        return FormatError(f"{show_path(where)}: config.json names glyd's quantization (quant_method 'glyd') but "
                           "glyd.json is missing: an incomplete glyd folder")
    return FormatError(f"{show_path(where)}: the model is already quantized (quant_method {method!r}); glyd packs "
                       "bf16 models")


def pipeline_hint(path: str | os.PathLike) -> str:
    """For a folder without config.json: if it is a diffusers pipeline, which subfolder= to pass."""
    p = Path(path)
    if not (p / "model_index.json").is_file():
        return ""
    subs = sorted(d.name for d in p.iterdir() if (d / "config.json").is_file())
    return f": a diffusers pipeline folder (model_index.json): pass subfolder= ({', '.join(subs) or 'a component'})"
