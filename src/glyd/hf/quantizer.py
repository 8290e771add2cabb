"""glyd as a transformers quantization method: ``quant_method: "glyd"`` in config.json.

Registered by ``import glyd`` (lazily, see ``glyd.hf._register``), so
``AutoModelForCausalLM.from_pretrained(folder)`` loads a folder written by
``glyd.save_pretrained`` or ``glyd pack``: before the weights load, every packed module is
swapped for a ``GlydLinear`` / ``GlydEmbedding`` whose ``weight_glyd_<array>`` buffers have the
checkpoint's shapes (from the shard headers), and transformers' own loader fills them with the
packed arrays as they are. Nothing is packed or unpacked while loading. ``model.dequantize()``
unpacks every module into the plain bf16 model (``glyd.hf.dequantize``).

This importing module imports transformers; ``import glyd`` does not import it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    register_quantization_config,
    register_quantizer,
)
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from glyd.codec.packed import FORMAT_VERSION
from glyd.errors import FormatError, UnsupportedError, show_path
from glyd.store._safetensors import read_json_bytes

log = logging.getLogger(__name__)

QUANT_METHOD = "glyd"


class GlydConfig(QuantizationConfigMixin):
    """The ``quantization_config`` of a glyd checkpoint.

    ``layout``: the layout of every matrix (``"auto"`` when it varies); ``format_version``: of the
    packed arrays; ``merged``: merged products, ``{"qkv_proj": ["q_proj", "k_proj", "v_proj"], ...}``;
    ``exact``: a loading option, every product computed as bf16 does (bit-identical logits).

    >>> from glyd.hf.quantizer import GlydConfig
    >>> GlydConfig(layout="fixed12").to_dict()["quant_method"]
    'glyd'
    """

    def __init__(self, layout: str = "auto", format_version: int = FORMAT_VERSION,
                 merged: dict[str, list[str]] | None = None, exact: bool = False, **kwargs: Any):
        self.quant_method = QUANT_METHOD
        self.layout = layout
        self.format_version = format_version
        self.merged = dict(merged) if isinstance(merged, dict) else merged or {}  # checked by post_init
        self.exact = exact  # checked by post_init (a config.json's "false" is no bool)
        self.post_init()

    def post_init(self) -> None:
        # Natively, transformers builds this from config.json before glyd knows the folder: the
        # message names the field (glyd.from_pretrained checks the file first, naming it).
        from glyd.hf.checks import check_quantization_config

        check_quantization_config({"layout": self.layout, "format_version": self.format_version, "merged": self.merged,
                                   "exact": self.exact})

    def get_loading_attributes(self) -> dict[str, Any]:
        # What transformers copies from a config passed to from_pretrained onto the checkpoint's
        # own (see register_with_transformers): the options that belong to loading, not the file.
        return {"exact": self.exact}

    def to_dict(self) -> dict[str, Any]:
        d = {"quant_method": QUANT_METHOD, "layout": self.layout, "format_version": self.format_version}
        if self.merged:
            d["merged"] = {k: list(v) for k, v in self.merged.items()}
        return d


class GlydHfQuantizer(HfQuantizer):
    """Loads glyd-packed checkpoints (``pre_quantized`` only: glyd packs through ``glyd.from_pretrained``,
    ``glyd.compress`` or ``glyd pack``)."""

    requires_calibration = True  # i.e. only pre-packed checkpoints
    quantization_config: GlydConfig

    def __init__(self, quantization_config: GlydConfig, **kwargs: Any):
        super().__init__(quantization_config, **kwargs)
        self._folder: Path | None = None
        self._manifest: dict[str, Any] | None = None
        self._dtype: torch.dtype | None = None  # the dtype transformers asked for (checked with the folder)

    def validate_environment(self, *args: Any, device_map: Any = None, **kwargs: Any) -> None:
        # Called with the map passed to from_pretrained and again with the one computed for "auto".
        if device_map is not None:
            from glyd.hf.placement import normalize_map

            normalize_map(device_map)

    def update_dtype(self, dtype: torch.dtype | None) -> torch.dtype:
        self._dtype = dtype
        return torch.bfloat16

    def _process_model_before_weight_loading(self, model: Any, checkpoint_files: list[str] | None = None,
                                             **kwargs: Any) -> Any:
        from glyd.hf.checks import check_built_top_k, check_folder
        from glyd.hf.skeleton import prepare_skeleton

        self._folder = _checkpoint_folder(model, checkpoint_files or [])
        _check_dtype(self._dtype, self._folder)
        reader = check_folder(self._folder, verify=False)
        # the model as its class built it: a top-k past the default experts count check_folder cannot see
        check_built_top_k(model.config, self._folder / "config.json")
        shards = sorted({reader.entry(n)["file"] for n in reader.names()})
        files = sorted(str(f) for f in checkpoint_files or [])
        if sorted(Path(f).resolve() for f in files) != sorted((self._folder / s).resolve() for s in shards):
            raise FormatError(f"{show_path(self._folder)}: transformers would read "
                              f"{', '.join(files[:4]) or 'no file'}, not the checkpoint's "
                              f"shards ({', '.join(shards[:4])})")
        self._manifest = prepare_skeleton(model, self._folder, merged=self.quantization_config.merged,
                                          exact=self.quantization_config.exact)
        return model

    def _process_model_after_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        from glyd.hf.skeleton import finish_skeleton

        finish_skeleton(model, self._folder, self._manifest)
        return model

    def _dequantize(self, model: Any, dtype: torch.dtype | None = None) -> Any:
        # transformers' dequantize() calls this, then drops hf_quantizer and quantization_config.
        from glyd.hf.dequantize import dequantize

        return dequantize(model, dtype)

    def is_serializable(self) -> bool:
        # transformers' save_pretrained would write the buffers without glyd.json and its hashes.
        log.warning("save a glyd model with glyd.save_pretrained(model, path), not model.save_pretrained")
        return False

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True


def _check_dtype(dtype: torch.dtype | None, folder: Path) -> None:
    """A glyd model loads in bfloat16: another dtype asked for is refused, unless it is the one the
    folder's config.json names (transformers' ``dtype="auto"``), which is said and not used. A config.json
    larger than any config is FormatError, refused before it is read."""
    if dtype is None or dtype == torch.bfloat16:
        return
    path = folder / "config.json"
    try:  # (a FIFO would block the read: check_folder says what the path is)
        raw = read_json_bytes(path, "a config.json") if path.is_file() else b""
    except OSError:
        raw = b""
    try:  # a malformed config names no dtype: check_folder or transformers say what is wrong with it
        cfg = json.loads(raw.decode("utf-8")) if raw else None
        named = cfg.get("dtype", cfg.get("torch_dtype")) if isinstance(cfg, dict) else None
    except ValueError:
        named = None
    if isinstance(named, str) and getattr(torch, named, None) == dtype:
        log.warning("%s: config.json gives dtype %s; a glyd model loads in bfloat16 (its packed weights are bf16)",
                    show_path(folder), named)
        return
    raise UnsupportedError(f"dtype={dtype}: a glyd model loads in bfloat16 (its packed weights are bf16, bit for bit); "
                           f"leave dtype out, or load it and call model.dequantize(dtype={dtype}) for a {dtype} model")


def _checkpoint_folder(model: Any, checkpoint_files: list[str]) -> Path:
    """The glyd folder being loaded: where transformers found the shards when that is the folder
    asked for or inside it (a sub-folder, a Hub snapshot), else the folder asked for. The shards'
    folder alone would follow a hostile index: a value ``''`` or ``'../model.safetensors'`` makes
    it the parent, a folder that is not the one being loaded (no weight_map at all: none)."""
    asked = getattr(getattr(model, "config", None), "name_or_path", None)
    asked = Path(asked) if asked and Path(asked).is_dir() else None
    parents = {Path(f).parent for f in checkpoint_files}
    if len(parents) == 1:
        found = parents.pop()
        if asked is None or found.resolve() == asked.resolve() or found.resolve().is_relative_to(asked.resolve()):
            return found
    if asked is None:
        raise FormatError(f"a glyd checkpoint is one folder of safetensors shards; transformers found "
                          f"{', '.join(map(str, checkpoint_files[:4])) or 'none'}")
    return asked


def register_with_transformers() -> None:
    """Add ``quant_method: "glyd"`` to transformers' registries (no-op if already there)."""
    if AUTO_QUANTIZATION_CONFIG_MAPPING.get(QUANT_METHOD) is not GlydConfig:
        AUTO_QUANTIZATION_CONFIG_MAPPING.pop(QUANT_METHOD, None)
        register_quantization_config(QUANT_METHOD)(GlydConfig)
    if AUTO_QUANTIZER_MAPPING.get(QUANT_METHOD) is not GlydHfQuantizer:
        AUTO_QUANTIZER_MAPPING.pop(QUANT_METHOD, None)
        register_quantizer(QUANT_METHOD)(GlydHfQuantizer)
    # For a pre-quantized checkpoint transformers keeps the checkpoint's quantization_config and
    # takes loading attributes (``get_loading_attributes``) from a config passed to from_pretrained
    # only for the classes in this tuple: without it, GlydConfig(exact=True) would be ignored.
    import transformers.quantizers.auto as _auto

    types = getattr(_auto, "LOADING_ATTRIBUTES_CONFIG_TYPES", None)
    if isinstance(types, tuple) and GlydConfig not in types:
        _auto.LOADING_ATTRIBUTES_CONFIG_TYPES = (*types, GlydConfig)


# Importing this module is enough to make transformers know glyd (whoever imports it first).
register_with_transformers()
