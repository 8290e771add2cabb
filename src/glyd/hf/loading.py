"""Load, pack, save and verify transformers causal LMs with glyd-packed weights.

* :func:`from_pretrained` reads a bf16 model folder (packing each weight as it streams in, one
  tensor at a time) or a folder written by glyd (nothing is packed again).
* :func:`compress` packs a model already in memory, in place.
* :func:`save_pretrained` writes the packed checkpoint format (``glyd.store``), which
  ``AutoModelForCausalLM.from_pretrained`` also loads once glyd is imported.
* :func:`verify` re-hashes every weight against the sha256 recorded when it was packed.

Which modules are packed: every ``nn.Linear`` (exact type) and every ``nn.Embedding`` (or a
subclass that only adds ``embed_scale``, as Gemma 3's) whose weight is a 2-D bf16 matrix. With
``merge``, q|k|v and gate|up become one packed product each (``qkv_proj``, ``gate_up_proj`` on
the parent module, with ``q_proj`` ... kept as views on it). A tied output projection uses the
embedding's packed arrays: packed once, used twice.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn
from tqdm.auto import tqdm

from glyd.codec import LAYOUTS, Packed
from glyd.codec.packed import FORMAT_VERSION
from glyd.errors import CorruptError, FormatError, GlydError
from glyd import ops as _ops
from glyd.nn.modules import BUFFER_PREFIX, GlydEmbedding, GlydLinear, GlydLinearPart, GlydTiedLinear, set_exact
from glyd.hf import hooks
from glyd.hf.checks import check_complete, check_folder
from glyd.store import MANIFEST, CheckpointReader, CheckpointWriter, sha256_tensor
from glyd.store._source import check_inside
from glyd.store.checkpoint import CONFIG
from glyd.store._safetensors import dtype_from_name, read_header, sha256_file

log = logging.getLogger(__name__)

__all__ = ["from_pretrained", "compress", "save_pretrained", "verify", "MERGE_GROUPS", "TOKENIZER_FILES"]

#: Merged products: attribute of the merged module on the parent -> the projections it replaces.
MERGE_GROUPS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
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
GENERATION_CONFIG = "generation_config.json"
_SEP = "_glyd_"


# --------------------------------------------------------------------------------------------------
# Small helpers


def _pick_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a torch device ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r}: this machine has no CUDA GPU that torch can use (device='cpu' runs "
                           f"on the CPU)")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise RuntimeError(f"device={device!r}: there are only {torch.cuda.device_count()} CUDA device(s)")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _check_layout(layout: str) -> str:
    if layout != "auto" and layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join([*LAYOUTS, 'auto'])}")
    return layout


def _set_module(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, module)


def _set_tensor(root: nn.Module, name: str, t: torch.Tensor) -> bool:
    """Put ``t`` in place of parameter or buffer ``name``; False if the model has no such tensor."""
    parent, _, attr = name.rpartition(".")
    try:
        mod = root.get_submodule(parent) if parent else root
    except AttributeError:
        return False
    if attr in mod._parameters:
        mod._parameters[attr] = nn.Parameter(t, requires_grad=False)
    elif attr in mod._buffers:
        mod._buffers[attr] = t
    else:
        return False
    return True


def _is_packable_linear(m: nn.Module) -> bool:
    return type(m) is nn.Linear and m.weight.dim() == 2


def _is_packable_embedding(m: nn.Module) -> bool:
    if not isinstance(m, nn.Embedding) or m.max_norm is not None or m.weight.dim() != 2:
        return False
    # A subclass is safe only when its forward is the plain lookup, optionally times embed_scale.
    return type(m) is nn.Embedding or hasattr(m, "embed_scale")


def _embed_scale(m: nn.Module) -> torch.Tensor | float | None:
    s = getattr(m, "embed_scale", None)
    if isinstance(s, torch.Tensor) and s.is_meta:
        raise FormatError(f"{type(m).__name__}.embed_scale is not materialized; cannot pack this embedding")
    return s


def _tied_pair(model: nn.Module) -> tuple[str, str] | None:
    """(output projection module name, input embedding module name) when they share one weight."""
    try:
        out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if out is None or inp is None:
        return None
    cfg = getattr(model, "config", None)
    tie = False
    if cfg is not None:
        text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
        tie = bool(getattr(text, "tie_word_embeddings", False))
    if not (tie or getattr(out, "weight", None) is getattr(inp, "weight", None)):
        return None
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    if id(out) not in names or id(inp) not in names:
        return None
    return names[id(out)], names[id(inp)]


def _packed_modules(model: nn.Module) -> Iterable[tuple[str, GlydLinear | GlydEmbedding]]:
    for name, m in model.named_modules():
        if isinstance(m, (GlydLinear, GlydEmbedding)):
            yield name, m


# --------------------------------------------------------------------------------------------------
# The packer: replaces modules as their weights arrive (a stream from disk, or a loaded model)


@dataclass
class _Group:
    parent: str
    attr: str
    parts: tuple[str, ...]
    has_bias: bool
    got: dict[str, torch.Tensor] = field(default_factory=dict)

    def needed(self) -> list[str]:
        names = [f"{self.parent}.{p}.weight" if self.parent else f"{p}.weight" for p in self.parts]
        if self.has_bias:
            names += [n[: -len("weight")] + "bias" for n in names]
        return names


class _Packer:
    """Decides which tensors are packed, packs them one at a time and swaps the modules in."""

    def __init__(self, model: nn.Module, *, layout: str, merge: bool, exact: bool, device: torch.device | None):
        self.model = model
        self.layout = _check_layout(layout)
        self.exact = exact
        self.device = device  # None: pack where each tensor already is
        self.layouts: Counter[str] = Counter()
        self.packed_bytes = 0
        self.weights = 0
        self.linears: dict[str, str] = {}  # weight name -> module name
        self.embeds: dict[str, str] = {}
        self.groups: dict[str, _Group] = {}  # tensor name -> its group
        self.tied = _tied_pair(model)
        self.skip: set[str] = set()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="glyd-sha256")
        self._hashes: deque[tuple[nn.Module, Future]] = deque()
        for name, m in model.named_modules():
            w = f"{name}.weight" if name else "weight"
            if _is_packable_linear(m):
                self.linears[w] = name
            elif _is_packable_embedding(m):
                self.embeds[w] = name
        if self.tied is not None:
            out_name, in_name = self.tied
            if f"{in_name}.weight" in self.embeds:
                self.linears.pop(f"{out_name}.weight", None)
                self.skip.add(f"{out_name}.weight")
            else:
                self.tied = None
        if merge:
            self._plan_merges()

    def _plan_merges(self) -> None:
        for pname, parent in self.model.named_modules():
            for attr, parts in MERGE_GROUPS.items():
                mods = [parent._modules.get(p) for p in parts]
                if any(m is None or not _is_packable_linear(m) for m in mods) or hasattr(parent, attr):
                    continue
                if len({m.in_features for m in mods}) != 1 or len({m.bias is None for m in mods}) != 1:
                    continue
                g = _Group(pname, attr, parts, mods[0].bias is not None)
                for n in g.needed():
                    self.groups[n] = g
                    self.linears.pop(n, None)

    def wants(self, name: str) -> bool:
        return name in self.linears or name in self.embeds or name in self.groups or name in self.skip

    def _pack(self, name: str, t: torch.Tensor) -> tuple[Packed, Future]:
        if t.dtype != torch.bfloat16:
            raise FormatError(
                f"tensor {name!r} is {t.dtype}: glyd packs bf16 weights only (convert the model to bf16 "
                f"first; rounding fp32 or fp16 to bf16 is lossy, so glyd does not do it for you)"
            )
        # sha256 of the original bf16 bytes (saving and verify need no unpack), on a worker thread
        # while the matrix packs: hashlib releases the GIL.
        sha = self._hasher.submit(sha256_tensor, t)
        dev = self.device if self.device is not None else t.device
        w = t.to(dev)
        layout = _ops.choose_layout(tuple(w.shape), w.device) if self.layout == "auto" else self.layout
        p = _ops.pack(w, layout)
        self.layouts[p.layout] += 1
        self.packed_bytes += p.nbytes
        self.weights += p.numel
        return p, sha

    def _track(self, module: nn.Module, sha: Future) -> nn.Module:
        """Give ``module`` its hash when ready; at most two tensors wait for hashing (bounded memory)."""
        self._hashes.append((module, sha))
        while len(self._hashes) > 2:
            self._settle()
        return module

    def _settle(self) -> None:
        module, fut = self._hashes.popleft()
        module.sha256 = fut.result()

    def close(self) -> None:
        """Wait for every hash and stop the hashing thread."""
        try:
            while self._hashes:
                self._settle()
        finally:
            self._hasher.shutdown(wait=True, cancel_futures=True)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.device is None else t.to(self.device)

    def feed(self, name: str, t: torch.Tensor) -> None:
        """Take tensor ``name`` of the model (a weight to pack, or any other tensor to put in place)."""
        if name in self.skip:
            log.debug("%s: tied to the input embedding, not packed twice", name)
        elif name in self.linears:
            mname = self.linears.pop(name)
            old = self.model.get_submodule(mname)
            p, sha = self._pack(name, t)
            bias = old.bias
            if bias is not None and not bias.is_meta:
                bias = self._to_device(bias.detach())
            _set_module(self.model, mname, self._track(GlydLinear(p, bias, exact=self.exact), sha))
        elif name in self.embeds:
            mname = self.embeds.pop(name)
            old = self.model.get_submodule(mname)
            p, sha = self._pack(name, t)
            scale = _embed_scale(old)
            if isinstance(scale, torch.Tensor):
                scale = scale.to(p.device)
            _set_module(self.model, mname, self._track(GlydEmbedding(p, old.padding_idx, scale=scale), sha))
        elif name in self.groups:
            g = self.groups[name]
            g.got[name] = t
            if len(g.got) == len(g.needed()):
                self._merge(g)
        elif not _set_tensor(self.model, name, self._to_device(t)):
            log.warning("tensor %r of the checkpoint has no place in the model; ignored", name)

    def _merge(self, g: _Group) -> None:
        names = g.needed()
        k = len(g.parts)
        ws = [g.got[n] for n in names[:k]]
        w = torch.cat([x.to(ws[0].device) for x in ws], dim=0)
        merged_name = f"{g.parent}.{g.attr}" if g.parent else g.attr
        p, sha = self._pack(f"{merged_name}.weight", w)
        del w
        bias = None
        if g.has_bias:
            bias = self._to_device(torch.cat([g.got[n].to(ws[0].device) for n in names[k:]]))
        merged = self._track(GlydLinear(p, bias, exact=self.exact, splits=[x.shape[0] for x in ws]), sha)
        parent = self.model.get_submodule(g.parent) if g.parent else self.model
        setattr(parent, g.attr, merged)
        for part, mod in zip(g.parts, merged.parts()):
            setattr(parent, part, mod)
        for n in names:
            self.groups.pop(n, None)
        g.got.clear()

    def finish(self, where: str) -> None:
        self.close()
        missing = sorted(set(self.linears) | set(self.embeds) | set(self.groups))
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise FormatError(f"{where}: tensor(s) {', '.join(missing[:5])}{more} are missing from the checkpoint")
        if self.tied is not None:
            out_name, in_name = self.tied
            emb = self.model.get_submodule(in_name)
            if isinstance(emb, GlydEmbedding):
                _set_module(self.model, out_name, GlydTiedLinear(emb, exact=self.exact))
        _untie_packed(self.model)


def _untie_packed(model: nn.Module) -> None:
    """Drop transformers' tie entries that name packed weights (ours are tied by GlydTiedLinear)."""
    tied = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied, dict) and tied:
        real = {n for n, _ in model.named_parameters(remove_duplicate=False)}
        model.all_tied_weights_keys = {k: v for k, v in tied.items() if k in real and v in real}


# --------------------------------------------------------------------------------------------------
# Reading a bf16 folder


def _resolve(name_or_path: str | os.PathLike, hf_kwargs: dict[str, Any]) -> Path:
    p = Path(name_or_path)
    if p.is_dir():
        return p
    if p.exists():
        raise FormatError(f"{p}: not a folder (glyd.from_pretrained takes a model folder or a Hub model id)")
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


def _weight_files(path: Path) -> list[Path]:
    """The model's safetensors shards: those of the index, else model.safetensors, else every one."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FormatError(f"{index}: not a safetensors index (JSON with a weight_map): {exc}") from exc
        files = []
        for n in names:
            f = path / n
            if not isinstance(n, str) or f.parent != path or not f.is_file():
                raise FormatError(f"{index}: names shard {n!r}, which is not a file of the folder")
            files.append(f)
        return files
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        if (path / "pytorch_model.bin").exists() or list(path.glob("pytorch_model-*.bin")):
            raise FormatError(
                f"{path}: holds only pickle (.bin) weights; glyd reads safetensors only (it never unpickles). "
                f"Convert with transformers: model.save_pretrained(dst, safe_serialization=True)"
            )
        raise FormatError(f"{path}: no *.safetensors weights: not a model folder")
    return files


def _check_bf16(path: Path, files: list[Path]) -> dict[Path, list[str]]:
    """Read every shard header; raise a clear error for a model that is not bf16."""
    keys: dict[Path, list[str]] = {}
    for f in files:
        h = read_header(f)
        keys[f] = h.keys_in_file_order()
        bad = Counter(info.dtype for info in h.tensors.values() if dtype_from_name(info.dtype) is not None
                      and dtype_from_name(info.dtype).is_floating_point and info.dtype != "bfloat16")
        if bad:
            dtype, n = bad.most_common(1)[0]
            example = next(k for k, i in h.tensors.items() if i.dtype == dtype)
            raise FormatError(
                f"{f}: the model is {dtype}, not bfloat16 ({n} {dtype} tensors, e.g. {example!r}): glyd packs bf16 "
                f"models only. Convert it first (AutoModelForCausalLM.from_pretrained(..., dtype=torch.bfloat16)"
                f".save_pretrained(dst)); rounding {dtype} to bf16 is lossy, so glyd does not do it silently"
            )
    return keys


def _load_bf16(path: Path, *, layout: str, merge: bool, exact: bool, device: torch.device, progress: bool,
               hf_kwargs: dict[str, Any]) -> nn.Module:
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    if not (path / "config.json").is_file():
        raise FormatError(f"{path}: no config.json: not a transformers model folder")
    files = _weight_files(path)
    cfg_kw = {k: hf_kwargs.pop(k) for k in ("trust_remote_code",) if k in hf_kwargs}
    try:
        config = AutoConfig.from_pretrained(path, **cfg_kw)
    except (ValueError, OSError, KeyError) as exc:
        raise FormatError(f"{path / 'config.json'}: not a config transformers can read ({exc})") from exc
    if getattr(config, "quantization_config", None) is not None:
        q = config.quantization_config
        method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", q)
        raise FormatError(f"{path}: the model is already quantized (quant_method {method!r}); glyd packs bf16 models")
    keys = _check_bf16(path, files)
    hf_kwargs.pop("device_map", None)  # glyd places every tensor itself (``device``)
    for k in ("dtype", "torch_dtype"):
        want = hf_kwargs.pop(k, None)
        if want not in (None, "auto", torch.bfloat16, "bfloat16"):
            raise ValueError(f"{k}={want!r}: a glyd model runs in bfloat16 (its weights are bf16, bit for bit)")
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, **cfg_kw, **hf_kwargs)
    packer = _Packer(model, layout=layout, merge=merge, exact=exact, device=device)
    try:
        _stream(path, keys, model, packer, progress)
    finally:
        packer.close()
    packer.finish(str(path))
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise FormatError(f"{path}: the checkpoint lacks tensor(s) the model needs: {', '.join(left[:5])}")
    model.to(device)
    model.eval()
    try:
        model.generation_config = GenerationConfig.from_pretrained(path)
    except (OSError, ValueError):
        pass
    _note_source(model, path, None)
    hooks.wire(model)
    gb = packer.packed_bytes / 1e9
    log.info("packed %d matrices (%s): %.3f GB, %.2f bits a weight", sum(packer.layouts.values()),
             ", ".join(f"{k} x{v}" for k, v in sorted(packer.layouts.items())), gb,
             8 * packer.packed_bytes / max(packer.weights, 1))
    return model


def _stream(path: Path, keys: dict[Path, list[str]], model: nn.Module, packer: _Packer, progress: bool) -> None:
    """Read the shards one tensor at a time and hand each to the packer."""
    from safetensors import safe_open

    sd_names = set(model.state_dict(keep_vars=True).keys())
    prefix = getattr(model, "base_model_prefix", "")
    total = sum(len(v) for v in keys.values())
    with tqdm(total=total, desc="glyd: loading and packing", unit="tensor", disable=not progress) as bar:
        for f, names in keys.items():
            with safe_open(str(f), framework="pt", device="cpu") as st:
                for key in names:
                    name = key if key in sd_names or not prefix else f"{prefix}.{key}"
                    if name not in sd_names:
                        name = key
                    try:
                        t = st.get_tensor(key)
                    except Exception as exc:  # safetensors' own error types
                        raise CorruptError(f"{f}: tensor {key!r}: cannot read: {exc}") from exc
                    packer.feed(name, t)
                    del t
                    bar.update(1)


def _note_source(model: nn.Module, source: Path | None, manifest: dict[str, Any] | None) -> None:
    # Plain attributes (not in state_dict): where tokenizer files are, and the raw tensors' hashes.
    model.__dict__["_glyd_source"] = source
    model.__dict__["_glyd_manifest"] = manifest


# --------------------------------------------------------------------------------------------------
# Reading a glyd folder (also used by the transformers quantizer)


def _st_dtype(name: str) -> torch.dtype:
    d = dtype_from_name(name)
    if d is None:
        raise FormatError(f"unsupported dtype {name!r} in a safetensors header")
    return d


def _layout_of(arrays: Iterable[str]) -> str | None:
    got = set(arrays)
    for name, mod in LAYOUTS.items():
        if got == set(mod.ARRAYS):
            return name
    return None


def checkpoint_layout(files: list[Path]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """From shard headers: packed tensors ``name -> {layout, arrays: {array: (dtype, shape)}}`` and the
    other tensors ``name -> (dtype, shape)``."""
    packed: dict[str, dict[str, Any]] = {}
    raw: dict[str, dict[str, Any]] = {}
    for f in files:
        for key, info in read_header(f).tensors.items():
            spec = (_st_dtype(info.dtype), tuple(info.shape))
            if _SEP in key:
                name, _, array = key.rpartition(_SEP)
                packed.setdefault(name, {"arrays": {}})["arrays"][array] = spec
            else:
                raw[key] = spec
    for name, e in packed.items():
        e["layout"] = _layout_of(e["arrays"])
        if e["layout"] is None:
            raise FormatError(f"tensor {name!r}: arrays {sorted(e['arrays'])} are not those of any glyd layout")
    return packed, raw


def prepare_skeleton(model: nn.Module, folder: Path, *, merged: dict[str, list[str]] | None = None,
                     exact: bool = False) -> dict[str, Any] | None:
    """Swap the modules of ``model`` (built on the meta device) for packed ones whose buffers have the
    shapes of the checkpoint in ``folder``, so that transformers' loader fills them as they are.

    Returns the manifest (``finish_skeleton`` checks the loaded model against it).
    """
    # The reader checks the manifest, every shard header and the index first: a damaged folder gets
    # glyd's error naming what is wrong, and the model is checked against the manifest after loading.
    manifest = CheckpointReader(folder).manifest
    files = sorted({folder / e["file"] for e in manifest["tensors"].values()})
    packed, _ = checkpoint_layout(files)
    groups = {attr: tuple(parts) for attr, parts in (merged or {}).items()}
    prefix = getattr(model, "base_model_prefix", "")
    for name, e in packed.items():
        if not name.endswith(".weight"):
            raise FormatError(f"{folder}: packed tensor {name!r} is not a module's weight")
        mname = name[: -len(".weight")]
        entry = (manifest or {}).get("tensors", {}).get(name, {})
        meta = {a: torch.empty(shape, dtype=dt, device="meta") for a, (dt, shape) in e["arrays"].items()}
        parent_name, _, attr = mname.rpartition(".")
        try:
            parent = model.get_submodule(parent_name) if parent_name else model
        except AttributeError:
            if prefix and not mname.startswith(prefix + "."):
                raise FormatError(f"{folder}: packed tensor {name!r} names no module of the model") from None
            raise FormatError(f"{folder}: packed tensor {name!r} names no module of the model") from None
        old = parent._modules.get(attr)
        if attr in groups and old is None:
            parts = [parent._modules.get(p) for p in groups[attr]]
            if any(p is None or not _is_packable_linear(p) for p in parts):
                raise FormatError(f"{folder}: merged tensor {name!r}: the model has no {', '.join(groups[attr])} to merge")
            shape = (sum(p.out_features for p in parts), parts[0].in_features)
            bias = None
            if parts[0].bias is not None:
                bias = torch.empty(shape[0], dtype=torch.bfloat16, device="meta")
            p = _meta_packed(folder, name, e["layout"], entry, shape, meta)
            mod = GlydLinear(p, bias, exact=exact, splits=[q.out_features for q in parts], sha256=entry.get("sha256"))
            setattr(parent, attr, mod)
            for part_name, part in zip(groups[attr], mod.parts()):
                setattr(parent, part_name, part)
        elif old is not None and _is_packable_linear(old):
            p = _meta_packed(folder, name, e["layout"], entry, (old.out_features, old.in_features), meta)
            setattr(parent, attr, GlydLinear(p, old.bias, exact=exact, sha256=entry.get("sha256")))
        elif old is not None and _is_packable_embedding(old):
            p = _meta_packed(folder, name, e["layout"], entry, (old.num_embeddings, old.embedding_dim), meta)
            scale = getattr(old, "embed_scale", None)
            if isinstance(scale, torch.Tensor) and scale.is_meta:
                # A non-persistent buffer (Gemma 3): rebuilt from the float the module keeps, in the
                # dtype transformers gave it, so that it rounds to bf16 exactly as the original.
                value = getattr(old, "scalar_embed_scale", None)
                if not isinstance(value, (int, float)):
                    raise FormatError(f"{folder}: {name!r}: cannot recover the embed_scale of {type(old).__name__}")
                scale = torch.tensor(float(value), dtype=scale.dtype, device="cpu")
            emb = GlydEmbedding(p, old.padding_idx, scale=scale, sha256=entry.get("sha256"))
            if scale is not None:
                # transformers re-creates non-persistent buffers empty after loading: keep the value.
                emb.__dict__["_glyd_scale"] = (float(scale), scale.dtype)
            setattr(parent, attr, emb)
        else:
            raise FormatError(
                f"{folder}: packed tensor {name!r} belongs to a {type(old).__name__}, which glyd cannot run packed"
            )
    tied = _tied_pair(model)
    if tied is not None:
        out_name, in_name = tied
        emb = model.get_submodule(in_name)
        if isinstance(emb, GlydEmbedding) and f"{out_name}.weight" not in packed:
            _set_module(model, out_name, GlydTiedLinear(emb, exact=exact))
    _untie_packed(model)
    return manifest


def _meta_packed(folder: Path, name: str, layout: str, entry: dict[str, Any], shape: tuple[int, int],
                 arrays: dict[str, torch.Tensor]) -> Packed:
    if entry:
        if tuple(entry.get("shape", ())) != tuple(shape):
            raise FormatError(f"{folder}: tensor {name!r} is {entry.get('shape')} in {MANIFEST} but the model needs {list(shape)}")
        layout = entry.get("layout", layout)
    try:
        return Packed(layout, tuple(shape), arrays, entry.get("format_version", FORMAT_VERSION))
    except FormatError as exc:
        raise FormatError(f"{folder}: tensor {name!r}: {exc}") from exc


def finish_skeleton(model: nn.Module, folder: Path, manifest: dict[str, Any]) -> None:
    """After loading: every packed buffer must have been filled, and the model must hold exactly the
    checkpoint's tensors (``glyd.hf.checks.check_complete``); remember where the model came from."""
    missing = [f"{n}.{b}" for n, m in _packed_modules(model) for b, t in m._buffers.items()
               if b.startswith(BUFFER_PREFIX) and t is not None and t.is_meta]
    if missing:
        raise FormatError(f"{folder}: packed array(s) missing from the checkpoint: {', '.join(missing[:5])}")
    for name, m in _packed_modules(model):
        try:
            m.packed  # noqa: B018 - builds the Packed over the loaded buffers: checks their shapes
        except FormatError as exc:
            raise FormatError(f"{folder}: tensor {name + '.weight'!r}: {exc}") from exc
        kept = m.__dict__.pop("_glyd_scale", None)
        if isinstance(m, GlydEmbedding) and kept is not None:
            m.embed_scale = torch.tensor(kept[0], dtype=kept[1], device=m.packed.device)
    check_complete(model, manifest, folder)
    _note_source(model, folder, manifest)
    hooks.wire(model)


def _load_glyd(path: Path, *, device: torch.device, exact: bool, verify: bool, hf_kwargs: dict[str, Any]) -> nn.Module:
    from glyd.hf._register import register

    if not register():
        raise ImportError("loading a glyd folder needs transformers (pip install 'glyd[models]')")
    from transformers import AutoModelForCausalLM

    # Before transformers reads the folder: glyd's errors, not its.
    reader = check_folder(path, verify=verify)
    cpath = path / CONFIG
    edited = reader.files.get(CONFIG) not in (None, sha256_file(cpath))

    kw = dict(hf_kwargs)
    kw.setdefault("device_map", str(device))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), **kw)
    except GlydError:
        raise
    except Exception as exc:
        if not edited:
            raise
        # The config is not the one packed with the weights (check_folder warned): what transformers
        # cannot build from it is that file's fault, said on one line.
        why = " ".join(str(exc).split())
        why = why if len(why) <= 300 else why[:297] + "..."
        raise FormatError(f"{cpath}: differs from the config.json recorded in {MANIFEST} and transformers cannot "
                          f"load the model from it ({type(exc).__name__}: {why})") from exc
    set_exact(model, exact)
    return model


# --------------------------------------------------------------------------------------------------
# Merging and unmerging a packed model (only when asked for a form the folder was not saved in)


def _merge_packed(model: nn.Module, exact: bool) -> int:
    n = 0
    for pname, parent in list(model.named_modules()):
        for attr, parts in MERGE_GROUPS.items():
            mods = [parent._modules.get(p) for p in parts]
            if hasattr(parent, attr) or any(not isinstance(m, GlydLinear) or m.splits for m in mods):
                continue
            if len({m.in_features for m in mods}) != 1 or len({m.bias is None for m in mods}) != 1:
                continue
            w = torch.cat([_ops.unpack(m.packed) for m in mods])
            layout = mods[0].layout
            p = _ops.pack(w, layout)
            bias = None if mods[0].bias is None else torch.cat([m.bias for m in mods])
            merged = GlydLinear(p, bias, exact=exact, splits=[m.out_features for m in mods], sha256=sha256_tensor(w.cpu()))
            setattr(parent, attr, merged)
            for part, mod in zip(parts, merged.parts()):
                setattr(parent, part, mod)
            n += 1
    return n


def _unmerge_packed(model: nn.Module, exact: bool) -> int:
    n = 0
    for pname, parent in list(model.named_modules()):
        for attr, parts in MERGE_GROUPS.items():
            merged = parent._modules.get(attr)
            if not isinstance(merged, GlydLinear) or not merged.splits or len(merged.splits) != len(parts):
                continue
            w = _ops.unpack(merged.packed)
            biases = merged.bias.split(merged.splits) if merged.bias is not None else [None] * len(parts)
            for part, wi, bi in zip(parts, w.split(merged.splits), biases):
                wi = wi.contiguous()
                setattr(parent, part, GlydLinear(_ops.pack(wi, merged.layout), bi, exact=exact, sha256=sha256_tensor(wi.cpu())))
            del parent._modules[attr]
            n += 1
    return n


def _is_merged(model: nn.Module) -> bool:
    return any(isinstance(m, GlydLinearPart) for m in model.modules())


# --------------------------------------------------------------------------------------------------
# Public API


def from_pretrained(
    name_or_path: str | os.PathLike,
    *,
    layout: str = "auto",
    exact: bool = False,
    verify: bool = False,
    device: str | torch.device | None = None,
    merge: bool | None = None,
    kv: str | None = None,
    progress: bool = True,
    **hf_kwargs: Any,
) -> nn.Module:
    """Load a causal LM with packed weights, ready for ``generate()``.

    ``name_or_path`` is a bf16 transformers folder (or Hub id) with safetensors weights, or a folder
    written by :func:`save_pretrained` / ``glyd pack`` (loaded as it is: nothing is packed again).
    A bf16 model is packed as it streams in, one tensor at a time and on ``device`` (default: the
    GPU when there is one), so neither the host nor the GPU ever holds the whole bf16 model.

    ``layout``: ``"fixed12"``, ``"tiered"`` or ``"auto"`` (chosen per matrix and device).
    ``exact=True`` computes every product as bf16 does (unpack, then ``F.linear``): logits equal
    the bf16 model's bit for bit. ``merge`` runs q|k|v and gate|up as one product each (default:
    on for a GPU, off on the CPU). ``verify=True`` re-hashes every weight against the sha256
    recorded when it was packed. ``kv="lossless"`` uses glyd's compressed KV cache. Other keyword
    arguments go to transformers (``attn_implementation=...``, ``trust_remote_code=...``).

    >>> import glyd                                                       # doctest: +SKIP
    >>> model = glyd.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")  # doctest: +SKIP
    >>> model.generate(**tok("Hello", return_tensors="pt").to(model.device))  # doctest: +SKIP
    """
    _check_layout(layout)
    if kv not in (None, "lossless"):
        raise ValueError(f"kv must be None or 'lossless', got {kv!r}")
    dev = _pick_device(device)
    hf_kwargs = dict(hf_kwargs)
    path = _resolve(name_or_path, hf_kwargs)
    if (path / MANIFEST).is_file():
        model = _load_glyd(path, device=dev, exact=exact, verify=verify, hf_kwargs=hf_kwargs)
        if verify:
            _verify_model(model, progress=progress)
            _verify_files(path)
        if merge is True and not _is_merged(model):
            log.info("%s was saved unmerged: merging q|k|v and gate|up (repacks those matrices)", path)
            _merge_packed(model, exact)
        elif merge is False and _is_merged(model):
            log.info("%s was saved merged: splitting q|k|v and gate|up (repacks those matrices)", path)
            _unmerge_packed(model, exact)
    else:
        for k in ("revision", "token", "cache_dir"):  # used to fetch the folder; not model options
            hf_kwargs.pop(k, None)
        do_merge = (dev.type == "cuda") if merge is None else bool(merge)
        model = _load_bf16(path, layout=layout, merge=do_merge, exact=exact, device=dev, progress=progress,
                           hf_kwargs=hf_kwargs)
        if verify:
            _verify_model(model, progress=progress)
    if kv == "lossless":
        _wire_kv(model)
    return model


def _wire_kv(model: nn.Module) -> None:
    try:
        from glyd import kv as kv_module
    except ImportError:
        kv_module = None
    make_cache = getattr(kv_module, "make_cache", None)
    if make_cache is None:
        raise NotImplementedError("kv='lossless' needs glyd.kv.make_cache, which this build of glyd does not have yet")
    generate = model.generate

    @functools.wraps(generate)
    def generate_with_glyd_cache(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("past_key_values") is None:
            kwargs["past_key_values"] = make_cache(model.config)
        return generate(*args, **kwargs)

    model.generate = generate_with_glyd_cache
    model.__dict__["glyd_make_cache"] = functools.partial(make_cache, model.config)


def compress(model: nn.Module, *, layout: str = "auto", merge: bool | None = None, exact: bool = False,
             progress: bool = True) -> nn.Module:
    """Pack a loaded bf16 model in place (each weight packed where it lives); returns the model.

    >>> import torch, glyd                                                # doctest: +SKIP
    >>> model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)  # doctest: +SKIP
    >>> glyd.compress(model, layout="fixed12")                            # doctest: +SKIP
    """
    _check_layout(layout)
    if any(isinstance(m, (GlydLinear, GlydEmbedding)) for m in model.modules()):
        raise ValueError("this model is already packed by glyd")
    if merge is None:
        merge = any(p.is_cuda for p in model.parameters())
    packer = _Packer(model, layout=layout, merge=bool(merge), exact=exact, device=None)
    todo = [(n, p) for n, p in model.named_parameters(remove_duplicate=False) if packer.wants(n)]
    try:
        for name, p in tqdm(todo, desc="glyd: packing", unit="tensor", disable=not progress):
            if p.is_meta:
                raise FormatError(f"tensor {name!r} is on the meta device: load the model's weights first")
            packer.feed(name, p.detach())
    finally:
        packer.close()
    packer.finish("model")
    _note_source(model, _source_of(model), None)
    return hooks.wire(model)


def _source_of(model: nn.Module) -> Path | None:
    src = model.__dict__.get("_glyd_source")
    if src is None:
        name = getattr(getattr(model, "config", None), "_name_or_path", None) or getattr(
            getattr(model, "config", None), "name_or_path", None)
        if name and Path(name).is_dir():
            src = Path(name)
    return src


def _merged_groups(model: nn.Module) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for _, parent in model.named_modules():
        for attr, parts in MERGE_GROUPS.items():
            m = parent._modules.get(attr)
            if isinstance(m, GlydLinear) and m.splits:
                out[attr] = list(parts)
    return out


def save_pretrained(model: nn.Module, path: str | os.PathLike, *, tokenizer: Any = None, overwrite: bool = False,
                    max_shard_bytes: int = 2 * 1024**3, progress: bool = True) -> Path:
    """Write a packed model as a glyd checkpoint folder (safetensors shards + ``glyd.json``), with its
    config.json (``quantization_config.quant_method = "glyd"``), generation config and tokenizer
    files. The packed arrays are written as they are: nothing is unpacked or packed again.

    >>> glyd.save_pretrained(model, "smollm2-glyd")                       # doctest: +SKIP
    """
    packed = list(_packed_modules(model))
    if not packed:
        raise ValueError("the model has no glyd-packed weights: call glyd.compress(model) or use glyd.from_pretrained")
    layouts = {m.layout for _, m in packed}
    layout = layouts.pop() if len(layouts) == 1 else "auto"
    packed_keys = set()
    with CheckpointWriter(path, layout=layout, overwrite=overwrite, max_shard_bytes=max_shard_bytes) as out:
        for name, m in tqdm(packed, desc="glyd: saving", unit="tensor", disable=not progress):
            wname = f"{name}.weight"
            sha = m.sha256
            if sha is None:  # no record from packing time: the only honest hash is of what we hold
                sha = sha256_tensor(_ops.unpack(m.packed).cpu())
            out.add_packed(wname, m.packed, sha)
            packed_keys.update(f"{name}.{b}" for b in m._buffers if b.startswith(BUFFER_PREFIX))
        seen: set[int] = set()
        for name, t in model.state_dict().items():
            if name in packed_keys:
                continue
            if t.data_ptr() in seen and t.numel():  # a tied tensor other than the packed ones
                continue
            seen.add(t.data_ptr())
            out.add_tensor(name, t)
        out.set_config(_config_dict(model, layout))
        src = _source_of(model)
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


def _config_dict(model: nn.Module, layout: str) -> dict[str, Any]:
    cfg = model.config
    d = cfg.to_dict()
    d.pop("quantization_config", None)
    d["dtype"] = "bfloat16"
    q: dict[str, Any] = {"quant_method": "glyd", "layout": layout, "format_version": FORMAT_VERSION}
    merged = _merged_groups(model)
    if merged:
        q["merged"] = merged
    d["quantization_config"] = q
    # Drop private and non-JSON values transformers keeps on the config object.
    return json.loads(json.dumps({k: v for k, v in d.items() if not k.startswith("_")}, default=str))


def _verify_files(folder: Path) -> None:
    """Every file the manifest lists (config, tokenizer, ...) still has its recorded sha256."""
    reader = CheckpointReader(folder)
    for rel, digest in reader.files.items():
        if sha256_file(folder / rel) != digest:
            raise CorruptError(f"{folder / rel}: sha256 mismatch with {MANIFEST} (the file was changed or damaged)")


def _verify_model(model: nn.Module, progress: bool = True) -> dict[str, int]:
    src = model.__dict__.get("_glyd_source")
    where = f"{src}: " if src else ""
    if not any(True for _ in _packed_modules(model)):
        raise FormatError(f"{where}the model has no glyd-packed weights: nothing to verify (pack it with "
                          f"glyd.compress or load it with glyd.from_pretrained)")
    counts = {"packed": 0, "raw": 0, "weights": 0}
    for name, m in tqdm(list(_packed_modules(model)), desc="glyd: verify", unit="tensor", disable=not progress):
        wname = f"{name}.weight"
        if m.sha256 is None:
            raise CorruptError(f"{where}tensor {wname!r}: no sha256 was recorded for it, nothing to verify against")
        try:
            w = _ops.unpack(m.packed).cpu()
        except (CorruptError, FormatError, RuntimeError, IndexError, ValueError) as exc:
            raise CorruptError(f"{where}tensor {wname!r}: damaged packed arrays ({exc})") from exc
        if sha256_tensor(w) != m.sha256:
            raise CorruptError(
                f"{where}tensor {wname!r}: sha256 mismatch: the packed arrays do not give back the original bf16 weights"
            )
        counts["packed"] += 1
        counts["weights"] += w.numel()
    manifest = model.__dict__.get("_glyd_manifest")
    if manifest:
        tensors = manifest.get("tensors", {})
        for name, m in _packed_modules(model):
            _check_arrays(m, tensors.get(f"{name}.weight"), f"{where}tensor {name + '.weight'!r}")
        for name, t in model.state_dict().items():
            e = tensors.get(name)
            if e is None or e.get("kind") != "raw":
                continue
            if sha256_tensor(t.cpu()) != e["sha256"]:
                raise CorruptError(f"{where}tensor {name!r}: sha256 mismatch with {MANIFEST}")
            counts["raw"] += 1
    return counts


def _check_arrays(m: GlydLinear | GlydEmbedding, entry: dict[str, Any] | None, what: str) -> None:
    """The module's packed arrays hash to those glyd.json records (for a module loaded from a glyd
    folder): bytes that unpacking ignores (padding, the code of an exception weight) included,
    since a fused kernel may still read them."""
    if not entry or entry.get("kind") != "packed":
        return
    arrays = m.packed.arrays
    for a, spec in entry["arrays"].items():
        if a not in arrays or sha256_tensor(arrays[a].cpu()) != spec["sha256"]:
            raise CorruptError(f"{what}: stored array {a!r} does not match its sha256 in {MANIFEST} (damaged file)")


def verify(model_or_path: nn.Module | str | os.PathLike, *, progress: bool = True) -> dict[str, int]:
    """Re-hash every tensor against the sha256 recorded at packing time; raise
    :class:`glyd.CorruptError` naming the first tensor that does not match. Returns counts.

    A path checks the folder on disk (every shard and copied file); a model checks what it holds.

    >>> glyd.verify("smollm2-glyd")                                       # doctest: +SKIP
    {'tensors': 273, 'packed': 211, 'raw': 62, 'weights': 134515008, 'files': 7}
    """
    if isinstance(model_or_path, (str, os.PathLike)):
        return CheckpointReader(model_or_path).verify(progress=progress)
    if not isinstance(model_or_path, nn.Module):
        raise TypeError(f"verify expects a model or a folder path, got {type(model_or_path).__name__}")
    return _verify_model(model_or_path, progress=progress)
