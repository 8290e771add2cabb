"""Which tensors of a bf16 folder ``glyd pack`` may pack: those the glyd-folder loader runs packed.

``glyd pack`` (``glyd.store.pack_folder``) knows no model: it packs 2-D bf16 tensors. The loader of
the folder it writes (``glyd.hf.skeleton``) runs a packed tensor only as the weight of an
``nn.Linear`` or ``nn.Embedding`` named exactly as the checkpoint names it. This module builds the
model from the folder's config on the meta device (the class the loader builds), resolves each
checkpoint key as transformers' loader does (``glyd.hf.keys``) and says which 2-D bf16 tensors to
keep as they are (a router, BART's ``final_logits_bias``); a tensor that transformers converts
(experts stored one matrix per expert) or renames into a packable weight is refused up front, with
the command that packs it through the loader instead.

>>> tensors = {"model.embed_tokens.weight": ("bfloat16", [151936, 896])}    # doctest: +SKIP
>>> loader_plan(Path("Qwen2.5-0.5B"), tensors).keep                          # doctest: +SKIP
frozenset()
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from torch import nn

from glyd.errors import FormatError, GlydError, UnsupportedError, cause, show_path
from glyd.hf._model import is_packable_embedding, is_packable_linear, kept_unpacked
from glyd.hf.checks import ignored, missing_tensors, tied_output
from glyd.hf.keys import checkpoint_resolver
from glyd.store._safetensors import dtype_name

log = logging.getLogger(__name__)

#: The most layers, experts or labels (beyond those id2label names) a config may claim for the plan
#: to build its model (glyd fit's bound too): check_counts bounds them by the tensors stored, or their
#: widest dimension, which empty tensors make cheap, and each costs up to a millisecond and 17 kB to
#: build, even on the meta device (transformers names each label it is not given: 10^6 took 13 s).
MAX_MODULES = 4096

__all__ = ["MAX_MODULES", "LoaderPlan", "loader_plan", "packed_weights", "through_loader", "unused_tensors"]


@dataclass(frozen=True)
class LoaderPlan:
    """``keep``: 2-D bf16 keys the loader would not run packed (kept as they are); ``model``: the
    class the loader builds (for messages); ``unused``: keys the loader finds no place for (it
    refuses the folder: ``glyd pack`` warns, and keeps them, as ``glyd unpack`` gives every tensor back);
    ``mismatched``: (key, stored, the model's: ``"bfloat16[64, 96]"``) of tensors the loader refuses for
    their dtype or shape;
    ``missing``: tensors of the model the folder lacks (the loader refuses the folder)."""

    keep: frozenset[str]
    model: str
    unused: tuple[str, ...] = ()
    mismatched: tuple[tuple[str, str, str], ...] = ()
    missing: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.keep, frozenset):
            raise TypeError(f"LoaderPlan.keep must be a frozenset, got {type(self.keep).__name__}")


def packed_weights(model: nn.Module) -> set[str]:
    """The weight names the loader runs packed: every ``nn.Linear`` / ``nn.Embedding`` weight that
    passes the packer's own predicates (a tied output projection included: stored, it is packed)."""
    kept = kept_unpacked(model)  # run in float32 by the model (Switch Transformers' routers): stored as they are
    return {f"{name}.weight" if name else "weight" for name, m in model.named_modules(remove_duplicate=False)
            if (is_packable_linear(m) or is_packable_embedding(m)) and name not in kept}


def through_loader(src: Path, dst: Path, layout: str) -> str:
    """The command that packs ``src`` through the loader (transformers' conversions applied) into ``dst``."""
    q = json.dumps  # a Python string literal in double quotes, for the shell's single ones
    code = (f"import glyd; glyd.save_pretrained(glyd.from_pretrained({q(str(src))}, device={q('cpu')}, "
            f"layout={q(layout)}), {q(str(dst))})")
    return f"python -c {shlex.quote(code)}"


def safe_creation():
    # transformers' own guard for meta-device construction (torch.linspace kept on the CPU), where it has one
    from transformers import initialization

    guard = getattr(initialization, "meta_device_safe_creation_ops", None)
    return guard() if guard is not None else contextlib.nullcontext()


def _warn_refused(check: Any, config: Any, where: Path) -> bool:
    """Whether ``check(config, where)`` passed; its FormatError is a warning: the model builds all the
    same, so the plan is made and the packed folder kept as the source's, which the loaders refuse."""
    try:
        check(config, where)
    except FormatError as exc:
        log.warning("%s: glyd.from_pretrained will refuse the packed folder (correct config.json to load it)", exc)
        return False
    return True


def _meta_model(src: Path, shapes: list[list[int]]) -> nn.Module:
    """The model the glyd-folder loader builds from ``src``'s config, on the meta device; FormatError
    (one line) for a config that cannot be built here (``shapes``: the stored tensors', which bound
    the config's counts before transformers builds a module a count)."""
    import torch
    from transformers import AutoConfig

    from glyd.hf.checks import check_built_top_k, check_counts, check_top_k, count_fields
    from glyd.hf.classes import build_empty, pick_class, read_config

    try:
        config = read_config(src)
        check_counts(config, shapes, src / "config.json", top_k=False)
        top_k_ok = _warn_refused(check_top_k, config, src / "config.json")
        named = config.get("id2label")
        named = len(named) if isinstance(named, dict) else 0  # labels the file itself spells out
        for key, name, value in count_fields(config):
            most = max(MAX_MODULES, named) if name == "num_labels" else MAX_MODULES
            if value > most:
                raise FormatError(f"{show_path(src / 'config.json')}: {key} is {value}, more than the {most} glyd "
                                  "pack builds to check which tensors the model runs packed (no model has as many)")
        cls = pick_class(None, config)
        # never the folder's own code (auto_map): transformers would ask on stdin, and run it on "y"
        hf_config = AutoConfig.from_pretrained(src, trust_remote_code=False)
        if top_k_ok:  # again with the class's default experts count (one warning, not two)
            _warn_refused(check_built_top_k, hf_config, src / "config.json")
        # everything on meta, buffers too, as transformers' loader builds it: nothing is allocated or
        # computed at the config's sizes (a claimed head_dim of 2**33 made 4 TiB on the CPU first)
        with torch.device("meta"), safe_creation():
            return build_empty(cls, hf_config, trust_remote_code=False)
    except GlydError as exc:
        raise FormatError(str(exc)) from exc
    except Exception as exc:  # any failure inside transformers: this config cannot be built here
        raise FormatError(f"{show_path(src / 'config.json')}: transformers cannot build the model "
                          f"({cause(exc)})") from exc


def loader_plan(src: Path, tensors: dict[str, tuple[str, list[int]]], *, dst: Path | None = None,
                layout: str = "fixed12") -> LoaderPlan:
    """The plan for packing ``src``, whose shards hold ``tensors`` (name -> (dtype name, shape)).

    Raises UnsupportedError (one line, naming the tensor and the command to use instead) for a 2-D
    bf16 key that transformers converts or renames into a weight the loader runs packed: packed under
    its checkpoint name, no module of the model would take it. FormatError: transformers cannot build
    the model from ``src``'s config (the caller decides what to do without a plan).
    """
    model = _meta_model(src, [list(shape) for _, shape in tensors.values()])
    state = model.state_dict(keep_vars=True)
    names = set(state)
    packable = packed_weights(model)
    resolve = checkpoint_resolver(model, names, str(src))
    keep = set()
    for key, (dtype, shape) in tensors.items():
        if dtype != "bfloat16" or len(shape) != 2 or key in packable:
            continue
        name, converter, _ = resolve(key)
        if converter is not None or name in packable:
            how = "converts" if converter is not None else "renames"
            instead = through_loader(src, dst if dst is not None else Path(f"{src.name}-glyd"), layout)
            raise UnsupportedError(
                f"{show_path(src)}: tensor {key!r} is stored in a layout that transformers {how} into {name!r} while "
                "loading, and glyd pack keeps tensors as the folder "
                "stores them; pack through the loader instead (it holds "
                f"the packed model in memory): {instead}")
        keep.add(key)
    if keep:
        log.debug("%s: kept as they are (not run packed by %s): %s", show_path(src), type(model).__name__, sorted(keep))
    # a config that contradicts the weights (edited, or another model's): the loader checks every dtype and shape
    held = {k: f"{dtype_name(_loaded_dtype(model, k, t))}{list(t.shape)}" for k, t in state.items()}
    mismatched = tuple((k, f"{dtype}{list(shape)}", held[k]) for k, (dtype, shape) in sorted(tensors.items())
                       if k in held and held[k] != f"{dtype}{list(shape)}")
    return LoaderPlan(frozenset(keep), type(model).__name__, tuple(sorted(unused_tensors(model, tensors))),
                      mismatched, tuple(missing_tensors(model, tensors)))


def _loaded_dtype(model: nn.Module, name: str, t: Any) -> Any:
    """The dtype transformers' loader gives the model's tensor ``name`` (``t`` on the meta model, built
    in bf16): float32 where the model's ``_keep_in_fp32_modules_strict`` names it (DeepSeek-V3's
    ``e_score_correction_bias``), as ``from_pretrained`` upcasts it while loading."""
    import torch

    strict = getattr(model, "_keep_in_fp32_modules_strict", None) or ()
    if t.dtype == torch.bfloat16 and any(m in name for m in strict):  # transformers matches them so
        return torch.float32
    return t.dtype


def unused_tensors(model: nn.Module, keys: Iterable[str]) -> list[str]:
    """The ``keys`` a glyd folder's loader finds no place for in ``model`` (``glyd.hf.checks.check_complete``
    refuses them): not a tensor of the model under that name, nor one transformers ignores."""
    names = set(model.state_dict(keep_vars=True))
    skip = ignored(model, "_keys_to_ignore_on_load_unexpected")
    tied = tied_output(model)
    return [k for k in keys if k not in names and k not in tied and not any(p.search(k) for p in skip)]
