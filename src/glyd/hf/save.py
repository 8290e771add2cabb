"""Writing a packed model as a glyd checkpoint folder (``glyd.store``), loadable by transformers."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from torch import nn
from tqdm.auto import tqdm

from glyd.codec.packed import FORMAT_VERSION
from glyd.hf._model import merged_groups, source_of
from glyd.hf.experts import packed_tensors, unpack_tensor
from glyd.store import CheckpointWriter, key_for, sha256_tensor
from glyd.store._config import QUANT_METHOD, packed_config
from glyd.store._source import check_inside

log = logging.getLogger(__name__)

__all__ = ["save_pretrained", "TOKENIZER_FILES"]


#: Files copied next to the weights when a model is saved (whichever the source folder has).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


def save_pretrained(model: nn.Module, path: str | os.PathLike, *, tokenizer: Any = None, overwrite: bool = False,
                    max_shard_bytes: int = 2 * 1024**3, progress: bool = True) -> Path:
    """Write a packed model as a glyd checkpoint folder (safetensors shards + ``glyd.json``), with its
    config.json (``quantization_config.quant_method = "glyd"``), generation config and tokenizer
    files. The packed arrays are written as they are: nothing is unpacked or packed again.

    >>> glyd.save_pretrained(model, "smollm2-glyd")                       # doctest: +SKIP
    """
    layout = model_layout(model)
    with CheckpointWriter(path, layout=layout, overwrite=overwrite, max_shard_bytes=max_shard_bytes) as out:
        write_tensors(out, model, progress)
        out.set_config(_config_dict(model, layout))
        src = source_of(model)
        with tempfile.TemporaryDirectory() as tmp:
            gen = getattr(model, "generation_config", None)
            if gen is not None:
                try:
                    gen.save_pretrained(tmp)
                except Exception as exc:  # an invalid generation config must not block saving the weights
                    log.warning("generation config not saved: %s", exc)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            added = set()
            for f in sorted(Path(tmp).iterdir()):
                if f.is_file() and f.name != "config.json":
                    out.add_file(f, f.name)
                    added.add(f.name)
            if src is not None:
                for fname in TOKENIZER_FILES:
                    if fname not in added and (src / fname).is_file():
                        check_inside(src, src / fname)  # a link out of the source folder is not copied
                        out.add_file(src / fname, fname)
    return Path(path)


def model_layout(model: nn.Module) -> str:
    """The layout a packed model's folder records: its packed modules' one layout, else ``"auto"``."""
    layouts = {p.layout for _, _, p, _ in packed_tensors(model)}
    if not layouts:
        raise ValueError("the model has no glyd-packed weights: call glyd.compress(model) or use glyd.from_pretrained")
    return layouts.pop() if len(layouts) == 1 else "auto"


def write_tensors(out: CheckpointWriter, model: nn.Module, progress: bool) -> None:
    """Every tensor of ``model`` into ``out``: packed arrays as they are (with the sha256 of the
    original bf16 weight), every other tensor as it is, a tied one once."""
    packed_keys = set()
    for name, _, p, sha in tqdm(list(packed_tensors(model)), desc="glyd: saving", unit="tensor", disable=not progress):
        if sha is None:  # no record from packing time: the only honest hash is of what we hold
            sha = sha256_tensor(unpack_tensor(p).cpu())
        out.add_packed(name, p, sha)
        packed_keys.update(key_for(name, a) for a in p.arrays)
    seen: set[int] = set()
    for name, t in model.state_dict().items():
        if name in packed_keys:
            continue
        if t.data_ptr() in seen and t.numel():  # a tied tensor other than the packed ones
            continue
        seen.add(t.data_ptr())
        out.add_tensor(name, t)


def _is_transformers_model(model: nn.Module) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return False
    return isinstance(model, PreTrainedModel)


def _config_dict(model: nn.Module, layout: str) -> dict[str, Any]:
    cfg = model.config
    d = cfg.to_dict()
    d.pop("quantization_config", None)
    d["dtype"] = "bfloat16"
    if _is_transformers_model(model):
        # As transformers' save_pretrained: the class saved, which glyd.from_pretrained builds by default.
        d["architectures"] = [type(model).__name__]
    q: dict[str, Any] = {"quant_method": QUANT_METHOD, "layout": layout, "format_version": FORMAT_VERSION}
    merged = merged_groups(model)
    if merged:
        q["merged"] = merged
    # Drop private and non-JSON values transformers keeps on the config object.
    d = json.loads(json.dumps({k: v for k, v in d.items() if not k.startswith("_")}, default=str))
    return packed_config(d, q)
