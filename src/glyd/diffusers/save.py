"""Writing a packed diffusers model as a glyd folder in diffusers' layout, and the model's own
``save_pretrained`` / ``dequantize`` in glyd's place.

The folder is what diffusers writes for a model (``config.json`` with ``_class_name`` and
``_diffusers_version``, weights in ``diffusion_pytorch_model.safetensors`` or its numbered shards
and index) plus ``glyd.json``; the config carries ``quantization_config: {"quant_method": "glyd",
...}``, so diffusers without glyd refuses the folder (an unknown quantization method) instead of
building a model with random weights. It fits in a pipeline folder as its ``transformer/``.

>>> glyd.save_pretrained(transformer, "flux-glyd/transformer")    # doctest: +SKIP
>>> transformer.save_pretrained("flux-glyd/transformer")           # the same folder  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path
from typing import Any

from torch import nn

from glyd.codec.packed import FORMAT_VERSION
from glyd.diffusers._detect import DIFFUSERS_KEYS, is_diffusers_model
from glyd.hf.save import model_layout, write_tensors
from glyd.store import CheckpointWriter
from glyd.store._config import QUANT_METHOD, packed_config

__all__ = ["save_pretrained", "WEIGHTS_NAME", "wire"]

#: The base name of diffusers' weight files (``diffusion_pytorch_model.safetensors``).
WEIGHTS_NAME = "diffusion_pytorch_model"

# Arguments of diffusers' ModelMixin.save_pretrained that change nothing for a glyd folder.
_HARMLESS = {"safe_serialization": (True,), "variant": (None,), "save_function": (None,), "use_flashpack": (False,)}


def save_pretrained(model: nn.Module, path: str | os.PathLike, *, overwrite: bool = False,
                    max_shard_bytes: int = 10 * 1000**3, progress: bool = True) -> Path:
    """Write a packed diffusers model (``glyd.compress`` or ``glyd.from_pretrained``) as a glyd folder
    in diffusers' layout: config.json + ``diffusion_pytorch_model*.safetensors`` + ``glyd.json``.
    The packed arrays are written as they are; ``glyd.from_pretrained(path)`` loads it back.
    ``max_shard_bytes`` defaults to diffusers' 10 GB shards.

    >>> import glyd                                                        # doctest: +SKIP
    >>> glyd.compress(pipe.transformer, exact=True)                        # doctest: +SKIP
    >>> glyd.save_pretrained(pipe.transformer, "flux-glyd/transformer")    # doctest: +SKIP
    """
    if not is_diffusers_model(model):
        raise TypeError(f"glyd.diffusers.save_pretrained takes a diffusers model (ModelMixin), got "
                        f"{type(model).__name__}")
    layout = model_layout(model)
    with CheckpointWriter(path, layout=layout, overwrite=overwrite, max_shard_bytes=max_shard_bytes,
                          weights_name=WEIGHTS_NAME) as out:
        write_tensors(out, model, progress)
        out.set_config(config_dict(model, layout))
    return Path(path)


def config_dict(model: nn.Module, layout: str) -> dict[str, Any]:
    """The model's diffusers config (as ``save_config`` writes it) with glyd's quantization_config."""
    d = json.loads(model.to_json_string())
    d = {k: v for k, v in d.items() if not k.startswith("_") or k in DIFFUSERS_KEYS}
    d.pop("quantization_config", None)
    return packed_config(d, {"quant_method": QUANT_METHOD, "layout": layout, "format_version": FORMAT_VERSION})


def _save_hook(model: nn.Module, save_directory: str | os.PathLike, is_main_process: bool = True,
               max_shard_size: int | str | None = "10GB", push_to_hub: bool = False, **kwargs: Any) -> None:
    """``model.save_pretrained(save_directory)`` of a packed diffusers model: :func:`save_pretrained`
    with ``overwrite=True`` (it replaces an empty folder or a glyd folder, never anything else)."""
    if push_to_hub:
        raise NotImplementedError("save_pretrained(push_to_hub=True) on a glyd model: save the folder and upload it "
                                  "with huggingface_hub.upload_folder")
    for k, v in kwargs.items():
        if k not in _HARMLESS or v not in _HARMLESS[k]:
            raise TypeError(f"save_pretrained({k}={v!r}) is not supported for a glyd model")
    if not is_main_process:
        return
    from huggingface_hub.serialization._base import parse_size_to_int

    # DiffusionPipeline.save_pretrained passes max_shard_size=None for its default
    size = max_shard_size if isinstance(max_shard_size, int) else parse_size_to_int(max_shard_size or "10GB")
    save_pretrained(model, save_directory, overwrite=True, max_shard_bytes=size, progress=False)


def _dequantize_hook(model: nn.Module, dtype: Any = None) -> nn.Module:
    """``model.dequantize()`` of a packed diffusers model: in place, the plain bf16 model, bit for bit
    (``dtype=torch.float32``: every weight exactly, in float32)."""
    from glyd.hf.dequantize import dequantize

    return dequantize(model, dtype=dtype)


def wire(model: nn.Module) -> nn.Module:
    """Give a packed diffusers model glyd's ``save_pretrained`` and ``dequantize`` (attributes of the
    instance, in place of diffusers' own, which would write the packed buffers without glyd.json;
    ``dequantize`` drops them again)."""
    model.save_pretrained = types.MethodType(_save_hook, model)
    model.dequantize = types.MethodType(_dequantize_hook, model)
    return model
