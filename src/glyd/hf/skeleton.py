"""Reading a glyd folder: a meta-device model whose packed modules have the checkpoint's shapes.

transformers' own loader fills the buffers (``glyd.hf.quantizer`` calls :func:`prepare_skeleton`
before it and :func:`finish_skeleton` after it); nothing is packed again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn

from glyd.codec import LAYOUTS, Packed
from glyd.codec.experts import LENS
from glyd.codec.packed import FORMAT_VERSION
from glyd.errors import CorruptError, FormatError, UnsupportedError, show_path
from glyd.hf import hooks
from glyd.hf._model import (SEP, is_packable_embedding, is_packable_linear, kept_unpacked, note_source, packed_ties,
                            refuse_tied_bias, set_module, untie_packed)
from glyd.hf.checks import check_complete
from glyd.hf.experts import PACKED_KINDS, experts_entries, module_tensors, place_experts
from glyd.nn.modules import GlydEmbedding, GlydLinear, GlydTiedEmbedding, GlydTiedLinear
from glyd.store import MANIFEST, CheckpointReader
from glyd.store._safetensors import dtype_from_name, read_header


def _st_dtype(name: str) -> torch.dtype:
    d = dtype_from_name(name)
    if d is None:
        raise FormatError(f"unsupported dtype {name!r} in a safetensors header")
    return d


def _layout_of(arrays: Iterable[str]) -> str | None:
    got = set(arrays) - {LENS}  # packed experts: a layout's arrays and their lengths
    for name, mod in LAYOUTS.items():
        if got == set(mod.arrays):
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
            if SEP in key:
                name, _, array = key.rpartition(SEP)
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
    experts = experts_entries(packed)
    ties = packed_ties(model)  # before the modules are swapped: which members are packable
    olds = {m: model.get_submodule(m) for members in ties for m in members}
    place_experts(model, folder, experts, manifest, exact)
    kept = kept_unpacked(model)
    for name, e in packed.items():
        if name in experts:
            continue
        if not name.endswith(".weight"):
            raise FormatError(f"{show_path(folder)}: packed tensor {name!r} is not a module's weight")
        mname = name[: -len(".weight")]
        if mname in kept:  # a folder packed before glyd kept them (Switch Transformers' routers, 2026-12-05)
            raise UnsupportedError(f"{show_path(folder)}: packed tensor {name!r} belongs to a module the model runs in "
                                   "float32, which glyd keeps unpacked; pack the bf16 folder again")
        entry = (manifest or {}).get("tensors", {}).get(name, {})
        meta = {a: torch.empty(shape, dtype=dt, device="meta") for a, (dt, shape) in e["arrays"].items()}
        parent_name, _, attr = mname.rpartition(".")
        try:
            parent = model.get_submodule(parent_name) if parent_name else model
        except AttributeError:
            if prefix and not mname.startswith(prefix + "."):
                raise FormatError(f"{show_path(folder)}: packed tensor {name!r} names no module of the model") from None
            raise FormatError(f"{show_path(folder)}: packed tensor {name!r} names no module of the model") from None
        old = parent._modules.get(attr)
        if attr in groups and old is None:
            parts = [parent._modules.get(p) for p in groups[attr]]
            if any(p is None or not is_packable_linear(p) for p in parts):
                raise FormatError(f"{show_path(folder)}: merged tensor {name!r}: the model has no "
                                  f"{', '.join(groups[attr])} to merge")
            shape = (sum(p.out_features for p in parts), parts[0].in_features)
            bias = None
            if parts[0].bias is not None:
                bias = torch.empty(shape[0], dtype=torch.bfloat16, device="meta")
            p = _meta_packed(folder, name, e["layout"], entry, shape, meta)
            mod = GlydLinear(p, bias, exact=exact, splits=[q.out_features for q in parts], sha256=entry.get("sha256"))
            setattr(parent, attr, mod)
            for part_name, part in zip(groups[attr], mod.parts()):
                setattr(parent, part_name, part)
        elif old is not None and is_packable_linear(old):
            p = _meta_packed(folder, name, e["layout"], entry, (old.out_features, old.in_features), meta)
            setattr(parent, attr, GlydLinear(p, old.bias, exact=exact, sha256=entry.get("sha256")))
        elif old is not None and is_packable_embedding(old):
            p = _meta_packed(folder, name, e["layout"], entry, (old.num_embeddings, old.embedding_dim), meta)
            scale = _scale(old, folder, name)
            setattr(parent, attr, _with_scale(GlydEmbedding(p, old.padding_idx, scale=scale, sha256=entry.get("sha256")),
                                              scale))
        else:
            raise FormatError(
                f"{show_path(folder)}: packed tensor {name!r} belongs to a {type(old).__name__}, which glyd cannot "
                "run packed"
            )
    for members in ties:
        _tie_skeleton(model, folder, members, olds, packed, exact)
    untie_packed(model)
    return manifest


def _scale(old: nn.Module, folder: Path, name: str) -> torch.Tensor | float | None:
    scale = getattr(old, "embed_scale", None)
    if isinstance(scale, torch.Tensor) and scale.is_meta:
        # A non-persistent buffer (Gemma 3): rebuilt from the float the module keeps, in the
        # dtype transformers gave it, so that it rounds to bf16 exactly as the original.
        value = getattr(old, "scalar_embed_scale", None)
        if not isinstance(value, (int, float)):
            raise FormatError(f"{show_path(folder)}: {name!r}: cannot recover the embed_scale of {type(old).__name__}")
        scale = torch.tensor(float(value), dtype=scale.dtype, device="cpu")
    return scale


def _with_scale(emb: nn.Module, scale: torch.Tensor | float | None) -> nn.Module:
    """``emb`` keeping the value of ``scale`` (:func:`_scale`), a buffer (a float is a plain attribute)."""
    if isinstance(scale, torch.Tensor):
        # transformers re-creates non-persistent buffers empty after loading: keep the value.
        emb.__dict__["_glyd_scale"] = (float(scale), scale.dtype)
    return emb


def _tie_skeleton(model: nn.Module, folder: Path, members: list[str], olds: dict[str, nn.Module],
                  packed: dict[str, Any], exact: bool) -> None:
    """The members of a tie not stored use the packed table of the first embedding stored (its source's)."""
    holder = next((model.get_submodule(m) for m in members if f"{m}.weight" in packed
                   and isinstance(model.get_submodule(m), GlydEmbedding)), None)
    if holder is None:
        return
    for m in members:
        if f"{m}.weight" in packed:
            continue
        old = olds[m]
        if is_packable_embedding(old):
            scale = _scale(old, folder, m)
            set_module(model, m, _with_scale(GlydTiedEmbedding(holder, old.padding_idx, scale=scale), scale))
        else:
            refuse_tied_bias(model, m, members[0])
            set_module(model, m, GlydTiedLinear(holder, exact=exact))


def _meta_packed(folder: Path, name: str, layout: str, entry: dict[str, Any], shape: tuple[int, int],
                 arrays: dict[str, torch.Tensor]) -> Packed:
    if entry:
        if tuple(entry.get("shape", ())) != tuple(shape):
            raise FormatError(f"{show_path(folder)}: tensor {name!r} is {entry.get('shape')} in {MANIFEST} but the "
                              f"model needs {list(shape)}")
        layout = entry.get("layout", layout)
    try:
        return Packed(layout, tuple(shape), arrays, entry.get("format_version", FORMAT_VERSION))
    except FormatError as exc:
        raise FormatError(f"{show_path(folder)}: tensor {name!r}: {exc}") from exc


def finish_skeleton(model: nn.Module, folder: Path, manifest: dict[str, Any]) -> None:
    """After loading: every packed buffer must have been filled, and the model must hold exactly the
    checkpoint's tensors (``glyd.hf.checks.check_complete``); remember where the model came from."""
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, PACKED_KINDS)]
    missing = [f"{n}.{b}" for n, m in mods for b, t in m._buffers.items() if SEP in b and t is not None and t.is_meta]
    if missing:
        raise FormatError(f"{show_path(folder)}: packed array(s) missing from the checkpoint: {', '.join(missing[:5])}")
    for name, m in mods:
        try:
            list(module_tensors(name, m))  # builds each Packed over the loaded buffers: checks them
        except (FormatError, CorruptError) as exc:
            what = f"tensor {name + '.weight'!r}" if isinstance(m, (GlydLinear, GlydEmbedding)) else name
            raise FormatError(f"{show_path(folder)}: {what}: {exc}") from exc
    for m in model.modules():
        kept = m.__dict__.pop("_glyd_scale", None)
        if isinstance(m, (GlydEmbedding, GlydTiedEmbedding)) and kept is not None:
            m.embed_scale = torch.tensor(kept[0], dtype=kept[1], device=m.weight.device)
    check_complete(model, manifest, folder)
    note_source(model, folder, manifest)
    hooks.wire(model)
