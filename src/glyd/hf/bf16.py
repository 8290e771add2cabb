"""Reading a bf16 transformers folder: every weight packed as it streams in, one tensor at a time."""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from glyd.errors import CorruptError, FormatError, UnsupportedError, show_path
from glyd.hf import hooks
from glyd.hf._model import note_source
from glyd.hf.checks import check_built_top_k, check_counts
from glyd.hf.classes import build_empty, read_config
from glyd.hf.convert import Conversions
from glyd.hf.memory import WeightsCount, check_packed, fit_layout
from glyd.hf.packer import Packer
from glyd.hf.placement import AUTO_MAPS, check_covers, device_of, infer_map, normalize_map
from glyd.store._config import already_quantized, pipeline_hint
from glyd.store._safetensors import dtype_from_name, load_json, read_header, read_json_bytes

log = logging.getLogger(__name__)


def resolve(name_or_path: str | os.PathLike, hf_kwargs: dict[str, Any]) -> Path:
    p = Path(name_or_path)
    if p.is_dir():
        return p
    if p.exists():
        raise FormatError(f"{show_path(p)}: not a folder (glyd.from_pretrained takes a model folder or a Hub model id)")
    s = str(name_or_path)
    if s.count("/") == 1 and not s.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            raise FormatError(f"{s}: no such folder (and huggingface_hub is not installed to fetch it)") from None
        kw = {k: hf_kwargs[k] for k in ("revision", "token", "cache_dir") if k in hf_kwargs}
        try:
            return Path(snapshot_download(s, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"], **kw))
        except Exception as exc:
            raise FormatError(f"{s}: not a local folder and it could not be fetched from the Hub ({exc})") from exc
    raise FormatError(f"{s}: no such model folder")


def subfolder_of(path: Path, subfolder: Any) -> Path:
    """``path / subfolder``, a folder inside ``path`` (``..`` and an absolute path are refused)."""
    if not isinstance(subfolder, str) or not subfolder or ".." in Path(subfolder).parts or \
            Path(subfolder).is_absolute():  # path / "/abs" would be "/abs"
        raise ValueError(f"subfolder={subfolder!r} must name a folder inside the model folder")
    p = path / subfolder
    if not p.is_dir():
        raise FormatError(f"{show_path(p)}: no such folder (subfolder={subfolder!r})")
    return p


def _weight_files(path: Path) -> list[Path]:
    """The model's safetensors shards: those of the index, else model.safetensors, else every one."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        what = "not a safetensors index (JSON with a weight_map)"
        # a hostile index is not read into memory whole; load_json: nesting bounded, a duplicate key refused
        doc = load_json(read_json_bytes(index, "a safetensors index"), index, what)
        try:
            names = sorted(set(doc["weight_map"].values()))
        except (KeyError, TypeError, AttributeError) as exc:
            raise FormatError(f"{show_path(index)}: {what}: {exc}") from exc
        files = []
        for n in names:
            f = path / n
            if not isinstance(n, str) or f.parent != path or not f.is_file():
                raise FormatError(f"{show_path(index)}: names shard {n!r}, which is not a file of the folder")
            files.append(f)
        return files
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        if (path / "pytorch_model.bin").exists() or list(path.glob("pytorch_model-*.bin")):
            raise FormatError(
                f"{show_path(path)}: holds only pickle (.bin) weights; glyd reads safetensors only (it never "
                "unpickles). Convert with transformers: model.save_pretrained(dst, safe_serialization=True)"
            )
        raise FormatError(f"{show_path(path)}: no *.safetensors weights: not a model folder")
    return files


def _check_bf16(path: Path, files: list[Path]) -> dict[Path, list[str]]:
    """Read every shard header; raise a clear error for a model that is not bf16."""
    keys: dict[Path, list[str]] = {}
    shard_of: dict[str, Path] = {}
    for f in files:
        h = read_header(f)
        keys[f] = h.keys_in_file_order()
        for k in keys[f]:  # read twice, a copy would be packed and the other dropped (or fused twice)
            if shard_of.setdefault(k, f) != f:
                raise FormatError(f"{show_path(path)}: tensor {k!r} is in two shards: {show_path(shard_of[k].name)} "
                                  f"and {show_path(f.name)}")
        bad = Counter(info.dtype for info in h.tensors.values() if dtype_from_name(info.dtype) is not None
                      and dtype_from_name(info.dtype).is_floating_point and info.dtype != "bfloat16")
        if bad:
            dtype, n = bad.most_common(1)[0]
            example = next(k for k, i in h.tensors.items() if i.dtype == dtype)
            raise FormatError(
                f"{show_path(f)}: the model is {dtype}, not bfloat16 ({n} {dtype} tensors, e.g. {example!r}): glyd "
                "packs bf16 models only. Convert it first (AutoModelForCausalLM.from_pretrained(..., "
                "dtype=torch.bfloat16).save_pretrained(dst)); rounding "
                f"{dtype} to bf16 is lossy, so glyd does not do it silently"
            )
    return keys


def load_bf16(path: Path, cls: type, *, layout: str, merge: bool | None, exact: bool, device: torch.device, progress: bool,
              hf_kwargs: dict[str, Any], device_map: Any = None, memory_limit: int | None = None) -> nn.Module:
    """The bf16 model in ``path`` built as transformers class ``cls``, packed as it streams in, on
    ``device`` or as ``device_map`` says (``merge=None``: merged when the model goes to a GPU);
    ``memory_limit`` (bytes): the layout chosen or checked on the empty model (``glyd.hf.memory``)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, GenerationConfig

    if not (path / "config.json").is_file():
        raise FormatError(f"{show_path(path)}: no config.json: not a transformers model folder{pipeline_hint(path)}")
    files = _weight_files(path)
    # Before transformers reads the config: a count it builds modules from, bounded by the weights.
    check_counts(read_config(path), [list(i.shape) for f in files for i in read_header(f).tensors.values()],
                 path / "config.json")
    cfg_kw = {k: hf_kwargs.pop(k) for k in ("trust_remote_code",) if k in hf_kwargs}
    try:
        config = AutoConfig.from_pretrained(path, **cfg_kw)
    except (ValueError, OSError, KeyError) as exc:
        raise FormatError(f"{show_path(path / 'config.json')}: not a config transformers can read ({exc})") from exc
    check_built_top_k(config, path / "config.json")  # a top-k past the class's default experts count
    if getattr(config, "quantization_config", None) is not None:
        q = config.quantization_config
        method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", q)
        raise already_quantized(path, method)
    keys = _check_bf16(path, files)
    max_memory = _placement_kwargs(hf_kwargs)
    for k in ("dtype", "torch_dtype"):
        want = hf_kwargs.pop(k, None)
        if want not in (None, "auto", torch.bfloat16, "bfloat16"):
            raise UnsupportedError(f"{k}={want!r}: a glyd model runs in bfloat16 (its weights are bf16, bit for bit)")
    with init_empty_weights(include_buffers=False):
        model = build_empty(cls, config, **cfg_kw, **hf_kwargs)
    if memory_limit is not None:  # counted on the empty model: nothing is read or packed yet
        count = WeightsCount.of(model, stored={k for names in keys.values() for k in names})
        layout = fit_layout(count, layout, memory_limit)
    placement = _placement(model, device_map, max_memory)
    devices = {device} if placement is None else set(placement.values())
    if len(devices) == 1:
        device = next(iter(devices))
    if merge is None:
        merge = any(d.type == "cuda" for d in devices)
    where = device if len(devices) == 1 else (lambda name: device_of(placement, name))
    packer = Packer(model, layout=layout, merge=merge, exact=exact, device=where)
    try:
        _stream(path, keys, model, packer, progress)
    finally:
        packer.close()
    packer.finish(str(path))
    if memory_limit is not None:
        check_packed(packer, count, memory_limit)
    _init_unsaved(model)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise FormatError(f"{show_path(path)}: the checkpoint lacks tensor(s) the model needs: {', '.join(left[:5])}")
    if len(devices) == 1:
        model.to(device)
    else:
        from accelerate import dispatch_model

        dispatch_model(model, device_map={k: str(v) for k, v in placement.items()})
    if placement is not None:
        model.hf_device_map = {k: str(v) for k, v in placement.items()}
    model.eval()
    try:
        model.generation_config = GenerationConfig.from_pretrained(path)
    except (OSError, ValueError):
        pass
    note_source(model, path, None)
    hooks.wire(model)
    gb = packer.packed_bytes / 1e9
    log.info("packed %d matrices (%s): %.3f GB, %.2f bits a weight", sum(packer.layouts.values()),
             ", ".join(f"{k} x{v}" for k, v in sorted(packer.layouts.items())), gb,
             8 * packer.packed_bytes / max(packer.weights, 1))
    return model


def _init_unsaved(model: nn.Module) -> None:
    """Make the parameters the checkpoint lacks that transformers makes itself (named by the class's
    ``_keys_to_ignore_on_load_missing``, as Marian's sinusoidal positions, computed and never saved),
    on the CPU, in their dtype, by the model's own ``_init_weights``, as transformers' loader does."""
    init = getattr(model, "_init_weights", None)
    pats = [re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_missing", None) or [])]
    left = [n for n, t in model.named_parameters() if t.is_meta and any(p.search(n) for p in pats)]
    if init is None or not left:
        return
    for mname in dict.fromkeys(n.rpartition(".")[0] for n in left):
        module = model.get_submodule(mname)
        own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        if not all(t.is_meta for t in own):  # _init_weights would overwrite what the checkpoint gave it
            continue
        module.to_empty(device="cpu", recurse=False)
        with torch.no_grad():
            init(module)
        log.info("%s: made by %s._init_weights (the checkpoint does not store it)", mname, type(model).__name__)


def _placement_kwargs(hf_kwargs: dict[str, Any]) -> dict | None:
    """Take transformers' placement arguments out of ``hf_kwargs``: ``max_memory`` (returned, for
    ``device_map="auto"``); the offloading ones are refused."""
    for k in ("offload_folder", "offload_buffers", "offload_state_dict"):
        if hf_kwargs.pop(k, None):
            raise UnsupportedError(f"{k}=...: glyd does not offload packed layers to the CPU or disk")
    return hf_kwargs.pop("max_memory", None)


def _placement(model: nn.Module, device_map: Any, max_memory: dict | None) -> dict[str, torch.device] | None:
    """``device_map`` resolved against the (meta) model: ``{module prefix: device}``, or None."""
    if device_map is None:
        if max_memory is not None:
            raise UnsupportedError("max_memory=... is used with device_map='auto' (or another computed map) only")
        return None
    placement = normalize_map(device_map)
    if isinstance(placement, str) and placement in AUTO_MAPS:
        placement = infer_map(model, placement, max_memory)
    elif max_memory is not None:
        raise UnsupportedError("max_memory=... is used with device_map='auto' (or another computed map) only")
    check_covers(placement, [n for n, _ in [*model.named_parameters(), *model.named_buffers()]])
    return placement


def _stream(path: Path, keys: dict[Path, list[str]], model: nn.Module, packer: Packer, progress: bool) -> None:
    """Read the shards one tensor at a time and hand each to the packer."""
    from safetensors import safe_open

    conversions = Conversions(model, [k for names in keys.values() for k in names], str(path))
    total = sum(len(v) for v in keys.values())
    with tqdm(total=total, desc="glyd: loading and packing", unit="tensor", disable=not progress) as bar:
        for f, names in keys.items():
            with safe_open(str(f), framework="pt", device="cpu") as st:
                for key in names:
                    try:
                        t = st.get_tensor(key)
                    except Exception as exc:  # safetensors' own error types
                        raise CorruptError(f"{show_path(f)}: tensor {key!r}: cannot read: {exc}") from exc
                    # a tensor, or (MoE experts stored one matrix per expert) nothing until its target's
                    # last source arrives, then the target that transformers' conversion makes
                    for name, ready in conversions.take(key, t):
                        packer.feed(name, ready)
                    del t
                    bar.update(1)
    conversions.check_done()
