"""What glyd packs in a transformers model, and the small tools that swap its modules.

Packed: every ``nn.Linear`` (exact type) and every ``nn.Embedding`` (or a subclass that only adds
``embed_scale``, as Gemma 3's) whose weight is a 2-D matrix. With merging, q|k|v and gate|up
become one packed product each (:data:`MERGE_GROUPS`). A tied output projection uses the
embedding's packed arrays: packed once, used twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn

from glyd.codec import LAYOUTS
from glyd.errors import FormatError, UnsupportedError
from glyd.nn.modules import GlydEmbedding, GlydLinear, GlydLinearPart


#: Merged products: attribute of the merged module on the parent -> the projections it replaces.
MERGE_GROUPS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


#: Between a packed weight's name and its array's name in a shard key: ``x.weight_glyd_lo``.
SEP = "_glyd_"


def pick_device(device: str | torch.device | None) -> torch.device:
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


def check_layout(layout: str) -> str:
    if layout != "auto" and layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join([*LAYOUTS, 'auto'])}")
    return layout


def set_module(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, module)


def check_shape(root: nn.Module, name: str, t: torch.Tensor) -> None:
    """FormatError unless ``t`` has the shape of ``root``'s parameter or buffer ``name`` (when it has
    one), as transformers' and diffusers' loaders refuse any other: put in place, a norm weight of
    [1] for [64] broadcast, and an output projection of 100 rows for 128 ran, a wrong model."""
    parent, _, attr = name.rpartition(".")
    try:
        mod = root.get_submodule(parent) if parent else root
    except AttributeError:
        return
    have = mod._parameters.get(attr, mod._buffers.get(attr))
    if have is not None and tuple(have.shape) != tuple(t.shape):
        raise FormatError(f"tensor {name!r} has shape {list(t.shape)}, the model's is {list(have.shape)}")


def set_tensor(root: nn.Module, name: str, t: torch.Tensor) -> bool:
    """Put ``t`` in place of parameter or buffer ``name``; False if the model has no such tensor;
    FormatError if it has another shape."""
    parent, _, attr = name.rpartition(".")
    try:
        mod = root.get_submodule(parent) if parent else root
    except AttributeError:
        return False
    check_shape(root, name, t)
    if attr in mod._parameters:
        mod._parameters[attr] = nn.Parameter(t, requires_grad=False)
    elif attr in mod._buffers:
        mod._buffers[attr] = t
    else:
        return False
    return True


def is_packable_linear(m: nn.Module) -> bool:
    return type(m) is nn.Linear and m.weight.dim() == 2


def kept_unpacked(model: nn.Module) -> frozenset[str]:
    """The names of the modules ``model`` does not run in bf16, which glyd keeps as transformers holds
    them: those its ``_keep_in_fp32_modules_strict`` names (loaded in float32), and every module under
    one that sets its own ``dtype`` to another (Switch Transformers' and NLLB-MoE's routers:
    ``self.dtype = config.router_dtype``, float32, the classifier cast to it before each product).

    >>> kept_unpacked(nn.Sequential(nn.Linear(2, 2)))
    frozenset()
    """
    strict = tuple(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    kept = set()
    for name, m in model.named_modules(remove_duplicate=False):
        own = vars(m).get("dtype")  # an attribute of its own: PreTrainedModel's dtype is a property
        if isinstance(own, torch.dtype) and own != torch.bfloat16:
            kept.update(f"{name}.{n}" if name and n else name or n for n, _ in m.named_modules(remove_duplicate=False))
        elif strict and any(k in f"{name}.weight" for k in strict):  # as transformers matches them (a substring)
            kept.add(name)
    return frozenset(kept)


def is_packable_embedding(m: nn.Module) -> bool:
    if not isinstance(m, nn.Embedding) or m.max_norm is not None or m.weight.dim() != 2:
        return False
    # A subclass is safe only when its forward is the plain lookup, optionally times embed_scale.
    return type(m) is nn.Embedding or hasattr(m, "embed_scale")


def embed_scale_of(m: nn.Module) -> torch.Tensor | float | None:
    s = getattr(m, "embed_scale", None)
    if isinstance(s, torch.Tensor) and s.is_meta:
        raise FormatError(f"{type(m).__name__}.embed_scale is not materialized; cannot pack this embedding")
    return s


def tied_pair(model: nn.Module) -> tuple[str, str] | None:
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


def tie_groups(model: nn.Module) -> list[list[str]]:
    """The modules whose weights transformers ties, one list a shared weight, its source first:
    ``all_tied_weights_keys`` (``{target: source}``, as the config and the class resolve them; T5 ties
    ``shared`` to its encoder's and decoder's ``embed_tokens`` and its ``lm_head``), and :func:`tied_pair`."""
    keys = getattr(model, "all_tied_weights_keys", None)
    links: dict[str, str] = {}
    if isinstance(keys, dict):
        for target, source in keys.items():
            if isinstance(target, str) and isinstance(source, str) and target.endswith(".weight") \
                    and source.endswith(".weight"):
                links[target[: -len(".weight")]] = source[: -len(".weight")]
    pair = tied_pair(model)
    if pair is not None and pair[0] != pair[1]:
        links.setdefault(*pair)
    groups: dict[str, list[str]] = {}
    for target in links:
        root, seen = target, {target}
        while root in links and links[root] not in seen:  # a target's source may be tied to another
            root = links[root]
            seen.add(root)
        group = groups.setdefault(root, [root])
        if target not in group:
            group.append(target)
    return [g for g in groups.values() if len(g) > 1]


def packed_ties(model: nn.Module) -> list[list[str]]:
    """:func:`tie_groups` the packer shares: their packable modules, where one is an embedding (its
    packed table is shared; the output projections use it as ``GlydTiedLinear``)."""
    out = []
    for group in tie_groups(model):
        mods = []
        for name in group:
            try:
                mods.append((name, model.get_submodule(name)))
            except AttributeError:
                continue
        kept = [n for n, m in mods if is_packable_embedding(m) or is_packable_linear(m)]
        if len(kept) > 1 and any(is_packable_embedding(m) for n, m in mods if n in kept):
            out.append(kept)
    return out


def unpacked_report(model: nn.Module) -> str:
    """One line on the floating-point tensors left as they are: how many, and the 2-D ones by the
    type of their module (not ``nn.Linear`` / ``nn.Embedding``, so not packed), a few named.

    >>> unpacked_report(nn.Sequential(nn.LayerNorm(4), nn.Conv1d(2, 2, 1)))
    'left unpacked: 4 tensors (14 values); 2-D or larger weights of Conv1d: 1.weight'
    """
    count, values = 0, 0
    by_type: dict[str, list[str]] = {}
    for mname, m in model.named_modules():
        for pname, t in m.named_parameters(recurse=False):
            if not t.is_floating_point():
                continue
            count, values = count + 1, values + t.numel()
            if t.dim() >= 2:
                by_type.setdefault(type(m).__name__, []).append(f"{mname}.{pname}" if mname else pname)
    line = f"left unpacked: {count} tensors ({values} values)"
    if by_type:
        parts = [f"{k}: {', '.join(v[:3])}{f' and {len(v) - 3} more' if len(v) > 3 else ''}"
                 for k, v in sorted(by_type.items())]
        line += "; 2-D or larger weights of " + "; ".join(parts)
    return line


def refuse_tied_bias(model: nn.Module, out_name: str, in_name: str) -> None:
    """A tied output projection runs packed as ``GlydTiedLinear``, which has no bias: refuse one with
    its own bias (``BertForMaskedLM``'s decoder) rather than drop it."""
    if getattr(model.get_submodule(out_name), "bias", None) is not None:
        raise UnsupportedError(f"{out_name} shares its weight with {in_name} (tied embeddings) and adds its own bias: "
                               f"glyd cannot run it packed yet ({type(model).__name__})")


def packed_modules(model: nn.Module) -> Iterable[tuple[str, GlydLinear | GlydEmbedding]]:
    for name, m in model.named_modules():
        if isinstance(m, (GlydLinear, GlydEmbedding)):
            yield name, m


def untie_packed(model: nn.Module) -> None:
    """Drop transformers' tie entries that name packed weights (ours are tied by GlydTiedLinear)."""
    tied = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied, dict) and tied:
        real = {n for n, _ in model.named_parameters(remove_duplicate=False)}
        model.all_tied_weights_keys = {k: v for k, v in tied.items() if k in real and v in real}


def note_source(model: nn.Module, source: Path | None, manifest: dict[str, Any] | None) -> None:
    # Plain attributes (not in state_dict): where tokenizer files are, and the raw tensors' hashes.
    model.__dict__["_glyd_source"] = source
    model.__dict__["_glyd_manifest"] = manifest


def source_of(model: nn.Module) -> Path | None:
    src = model.__dict__.get("_glyd_source")
    if src is None:
        name = getattr(getattr(model, "config", None), "_name_or_path", None) or getattr(
            getattr(model, "config", None), "name_or_path", None)
        if name and Path(name).is_dir():
            src = Path(name)
    return src


def is_merged(model: nn.Module) -> bool:
    return any(isinstance(m, GlydLinearPart) for m in model.modules())


def merged_groups(model: nn.Module) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for _, parent in model.named_modules():
        for attr, parts in MERGE_GROUPS.items():
            m = parent._modules.get(attr)
            if isinstance(m, GlydLinear) and m.splits:
                out[attr] = list(parts)
    return out
