"""transformers' own calls on a packed model: ``model.save_pretrained(dir)`` writes a glyd folder,
``model.dequantize()`` gives back the plain bf16 model.

transformers' ``save_pretrained`` would write the packed buffers without ``glyd.json`` (and, for a
freshly packed model, without glyd's ``quantization_config``): a folder that loads as a model with
random weights. Every packed model glyd hands out carries :func:`save_pretrained` below in its
place, so transformers' spelling and its ``push_to_hub`` (which saves through it) write a folder
that loads bit for bit.

A model loaded natively (``AutoModelForCausalLM.from_pretrained(glyd_folder)``) dequantizes
through transformers' own path (its ``hf_quantizer``); one packed by ``glyd.from_pretrained`` or
``glyd.compress`` has no quantizer, and :func:`dequantize` below does the same work for it.

The folder ``model.save_pretrained`` writes is the one ``glyd.save_pretrained`` writes, and
``dequantize()`` gives plain bf16 modules, every weight bit for bit:

>>> model = glyd.from_pretrained("bf16-folder")      # doctest: +SKIP
>>> model.save_pretrained("model-glyd")              # doctest: +SKIP
>>> model = model.dequantize()                       # doctest: +SKIP
"""

from __future__ import annotations

import os
import types
from typing import Any

from torch import nn

from glyd.hf.save import save_pretrained as glyd_save

__all__ = ["wire", "save_pretrained", "dequantize"]

# Arguments of transformers' save_pretrained that change nothing for a glyd folder.
_HARMLESS = {"safe_serialization": (True, None), "variant": (None,), "token": None, "save_peft_format": None,
             "save_original_format": None, "distributed_checkpoint": (False,)}


def save_pretrained(model: nn.Module, save_directory: str | os.PathLike, is_main_process: bool = True,
                    state_dict: dict | None = None, push_to_hub: bool = False, max_shard_size: int | str = "2GB",
                    **kwargs: Any) -> None:
    """``model.save_pretrained(save_directory)`` of a packed model: :func:`glyd.save_pretrained` with
    ``overwrite=True`` (it replaces an empty folder or a glyd folder, never anything else)."""
    if state_dict is not None:
        raise ValueError("save_pretrained(state_dict=...) is not supported for a glyd model: its packed arrays "
                         "are saved as they are")
    if push_to_hub:
        raise NotImplementedError("save_pretrained(push_to_hub=True) on a glyd model: call model.push_to_hub(repo_id), "
                                  "or save the folder and upload it with huggingface_hub.upload_folder")
    for k, v in kwargs.items():
        ok = _HARMLESS.get(k, ())
        if k not in _HARMLESS or (ok is not None and v not in ok):
            raise TypeError(f"save_pretrained({k}={v!r}) is not supported for a glyd model")
    if not is_main_process:
        return
    from transformers.utils.hub import convert_file_size_to_int

    glyd_save(model, save_directory, overwrite=True, max_shard_bytes=convert_file_size_to_int(max_shard_size),
              progress=False)


def dequantize(model: nn.Module, dtype: Any = None) -> nn.Module:
    """``model.dequantize()`` of a packed model: in place, the plain bf16 model (``glyd.hf.dequantize``);
    transformers' own ``dequantize`` when the model has glyd's quantizer (it also drops the
    ``quantization_config``)."""
    from glyd.hf.dequantize import dequantize as unpack_model

    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        return type(model).dequantize(model, dtype=dtype)
    unpack_model(model, dtype)
    if getattr(getattr(model, "config", None), "quantization_config", None) is not None:
        del model.config.quantization_config
    return model


def wire(model: nn.Module) -> nn.Module:
    """Give a packed transformers model glyd's ``save_pretrained`` and ``dequantize`` (attributes of
    the instance, dropped again by ``dequantize``)."""
    if hasattr(model, "save_pretrained"):
        model.save_pretrained = types.MethodType(save_pretrained, model)
    if hasattr(model, "dequantize"):
        model.dequantize = types.MethodType(dequantize, model)
    return model
