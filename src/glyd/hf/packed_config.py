"""transformers' config type ``glyd``: a packed folder's config.json read as the model's own config.

A packed folder says ``"model_type": "glyd"`` (see :mod:`glyd.store._config`), so transformers
without glyd refuses it. Registered by ``import glyd`` (``glyd.hf._register``) as soon as
transformers' ``AutoConfig`` is imported; reading such a config then gives the model's own config
class (``Qwen2Config``, ...) with glyd's ``quantization_config``, and every ``Auto*`` class builds the
model as usual.

This module imports transformers; ``import glyd`` does not import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers.configuration_utils import PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, AutoConfig

from glyd.errors import FormatError, show_path
from glyd.hf.checks import check_counts, stored_shapes
from glyd.store._config import PACKED_MODEL_TYPE, QUANT_METHOD, own_model_type
from glyd.store._safetensors import short


class GlydPackedConfig(PretrainedConfig):
    """Stands for a packed folder's config: :meth:`from_dict` returns the model's own config.

    >>> from glyd.hf.packed_config import GlydPackedConfig
    >>> cfg = GlydPackedConfig.from_dict({"model_type": "glyd", "hidden_size": 8, "num_attention_heads": 2,
    ...     "quantization_config": {"quant_method": "glyd", "original_model_type": "llama"}})
    >>> type(cfg).__name__, cfg.model_type
    ('LlamaConfig', 'llama')
    """

    model_type = PACKED_MODEL_TYPE

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        where = show_path(Path(kwargs["name_or_path"]) / "config.json") if kwargs.get("name_or_path") else "config.json"
        q = config_dict.get("quantization_config")
        if not isinstance(q, dict) or q.get("quant_method") != QUANT_METHOD:
            raise FormatError(f"{show_path(where)}: model_type is {PACKED_MODEL_TYPE!r} (a packed Glyd folder) but "
                              "there is no glyd quantization_config; restore the config.json written with the folder")
        own = own_model_type(config_dict)
        if not isinstance(own, str) or not own or own == PACKED_MODEL_TYPE:
            raise FormatError(f"{show_path(where)}: model_type is {PACKED_MODEL_TYPE!r} but "
                              "quantization_config.original_model_type "
                              f"({short(own)}) does not name the model's own type")
        folder = Path(kwargs["name_or_path"]) if kwargs.get("name_or_path") else None
        shapes = stored_shapes(folder) if folder is not None and folder.is_dir() else None
        if shapes is not None:  # before transformers builds a table or a module from a count
            check_counts(config_dict, shapes, where)
        try:
            real = CONFIG_MAPPING[own]
        except KeyError:
            raise FormatError(f"{show_path(where)}: quantization_config.original_model_type {own!r} is not a model "
                              "type this transformers knows") from None
        # transformers' own config class and its own checks (a bad field raises its error).
        return real.from_dict(dict(config_dict, model_type=own), **kwargs)


def register_config() -> None:
    """Make ``AutoConfig`` read ``model_type: "glyd"`` (no-op if already done)."""
    try:
        if CONFIG_MAPPING[PACKED_MODEL_TYPE] is GlydPackedConfig:
            return
    except KeyError:
        pass
    AutoConfig.register(PACKED_MODEL_TYPE, GlydPackedConfig, exist_ok=True)


# Importing this module is enough to make AutoConfig know the type (whoever imports it first).
register_config()
