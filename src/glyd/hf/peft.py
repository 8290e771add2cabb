"""LoRA adapters (PEFT) on packed linears: train, save, load and merge a LoRA over a Glyd model.

PEFT picks a LoRA layer by the type of the module it wraps and knows only its own (``nn.Linear``,
...). Its supported way to teach it another base layer is a LoRA config's custom-module mapping
(``LoraConfig._register_custom_module``, PEFT's "custom models" guide): :func:`register` adds
glyd's to a config, after which ``peft.get_peft_model`` wraps every targeted ``GlydLinear`` (and
each part of a merged q|k|v or gate|up) in :class:`GlydLoraLinear`. The base stays packed: its
forward is the packed layer's own (``exact=True``: bf16's product, bit for bit), its backward
``grad @ W`` unpacks ``W`` again (``glyd::linear``'s autograd, or ``F.linear``'s in exact mode),
and the LoRA weights are PEFT's own modules, so a LoRA trained on a packed model with
``exact=True`` takes the same steps as on the bf16 model, bit for bit.

Merging writes the adapter into a plain bf16 ``nn.Linear`` (the packed weight unpacked, then
PEFT's own merge), so ``merge_and_unload()`` gives the layers PEFT gives on the bf16 base, bit for
bit; layers without an adapter stay packed, and :func:`merge_and_unload` also unpacks those (the
whole bf16 model). Unmerging puts the packed layer back as it was.

Refused, with a :class:`glyd.UnsupportedError` naming the module: LoRA on a packed embedding or a
tied output projection, on a merged product as a whole (target its parts), LoRA variants
(DoRA, ...: PEFT's code for them reads the base weight as an ``nn.Parameter``), and a packed module
in ``modules_to_save`` (or the task's head) or ``trainable_token_indices`` (its weight is a buffer:
nothing would train).

>>> import glyd, peft                                                        # doctest: +SKIP
>>> from glyd.hf import peft as glyd_peft                                    # doctest: +SKIP
>>> model = glyd.from_pretrained("path/to/bf16-model", exact=True)            # doctest: +SKIP
>>> config = glyd_peft.register(peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))  # doctest: +SKIP
>>> model = peft.get_peft_model(model, config)                               # doctest: +SKIP
>>> model.save_pretrained("adapter")                                         # the adapter only  # doctest: +SKIP
>>> bf16 = glyd_peft.merge_and_unload(model)                                 # a plain bf16 model  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Any

import torch
from torch import nn

from glyd.errors import MissingDependencyError, UnsupportedError
from glyd.nn.modules import GlydEmbedding, GlydLinear, GlydLinearPart, GlydTiedEmbedding, GlydTiedLinear

try:
    import peft as _peft
    from peft.tuners.lora import Linear as _LoraLinear
    from peft.tuners.lora import LoraConfig
    from peft.tuners.tuners_utils import BaseTunerLayer, check_adapters_to_merge
except ImportError as exc:  # glyd itself never needs peft: only this module does
    raise MissingDependencyError(f"glyd.hf.peft needs peft (pip install 'glyd-lossless[peft]'): {exc}") from exc

log = logging.getLogger(__name__)

__all__ = ["GlydLoraLinear", "register", "get_peft_model", "from_pretrained", "merge_and_unload", "LORA_MODULES"]

def _base_of(target: nn.Module) -> nn.Module:
    return target.get_base_layer() if isinstance(target, BaseTunerLayer) else target


def _bf16_linear(base: GlydLinear | GlydLinearPart) -> nn.Linear:
    """The plain ``nn.Linear`` a packed layer was packed from, on its device, frozen as PEFT's base."""
    # The bias is a copy: PEFT's merge of a lora_bias adds to it in place, and its unmerge's
    # subtraction does not round back in bf16; the packed layer kept for unmerge keeps its own.
    w = base.weight.materialize().clone() if isinstance(base, GlydLinearPart) else base._unpack()
    b = base.bias
    bias = None if b is None else nn.Parameter(b.detach().clone(), requires_grad=b.requires_grad)
    lin = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, device="meta", dtype=torch.bfloat16)
    lin.weight = nn.Parameter(w, requires_grad=False)
    if bias is not None:
        lin.bias = bias
    return lin.train(base.training)


class GlydLoraLinear(_LoraLinear):
    """PEFT's LoRA ``Linear`` over a packed ``GlydLinear`` or a part of a merged one.

    Forward and backward are PEFT's (the base's product plus ``B(A(x)) * scaling``); merging
    swaps the packed base for the bf16 ``nn.Linear`` it was packed from and merges into that with
    PEFT's own code; unmerging restores the packed base. Built by PEFT through :func:`register`.

    >>> import peft, torch, glyd                                             # doctest: +SKIP
    >>> from glyd.hf.peft import register                                     # doctest: +SKIP
    >>> net = torch.nn.Sequential(glyd.GlydLinear(glyd.pack(torch.randn(8, 4).bfloat16())))  # doctest: +SKIP
    >>> net = peft.get_peft_model(net, register(peft.LoraConfig(r=2, target_modules=["0"])))  # doctest: +SKIP
    >>> type(net.base_model.model[0]).__name__                               # doctest: +SKIP
    'GlydLoraLinear'
    """

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: LoraConfig, **kwargs: Any) -> None:
        base = _base_of(base_layer)
        if isinstance(base, GlydLinear) and base.splits:
            raise UnsupportedError(f"LoRA on a merged packed product ({base.splits} rows): its parts (q_proj, k_proj, "
                                   f"...) run it; target those, or load the model with merge=False")
        if config.fan_in_fan_out:
            log.warning("fan_in_fan_out=True is for Conv1D layers; a GlydLinear holds W as nn.Linear does: set to False")
            config.fan_in_fan_out = False
        super().__init__(base_layer, adapter_name, config=config, **kwargs)

    @property
    def lora_variants(self) -> dict:
        # A variant's own code reads or writes the base weight as an nn.Parameter (DoRA's norm, ...):
        # plain LoRA only, until one is checked on packed layers.
        return {(): None}

    def resolve_lora_variant(self, *, config: LoraConfig, **kwargs: Any) -> Any:
        try:
            return super().resolve_lora_variant(config=config, **kwargs)
        except ValueError as exc:
            raise UnsupportedError(f"LoRA on a packed layer: {exc} (glyd supports plain LoRA on packed layers, no variant such as use_dora)") from exc

    def _holder(self) -> nn.Module:
        """The module whose ``base_layer`` is the packed layer itself (this one, unless layers nest)."""
        holder = self
        while isinstance(holder.base_layer, BaseTunerLayer):
            holder = holder.base_layer
        return holder

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        """PEFT's merge into the bf16 ``nn.Linear`` the packed base was (the packed one is kept for unmerge)."""
        adapter_names = check_adapters_to_merge(self, adapter_names)
        if not adapter_names:
            return
        holder = self._holder()
        base = holder.base_layer
        swapped = isinstance(base, (GlydLinear, GlydLinearPart))
        if swapped:
            self.__dict__["_glyd_packed"] = base  # not a submodule: off the state_dict, back on unmerge
            holder.base_layer = _bf16_linear(base)
        try:
            super().merge(safe_merge=safe_merge, adapter_names=adapter_names)
        except Exception:  # PEFT refused (safe_merge's NaN check, ...): the packed layer goes back
            if swapped and not self.merged:
                holder.base_layer = self.__dict__.pop("_glyd_packed")
            raise

    def unmerge(self) -> None:
        """PEFT's unmerge; once no adapter is merged, the packed base comes back, every bit as before."""
        super().unmerge()
        packed = self.__dict__.get("_glyd_packed")
        if packed is not None and not self.merged:
            holder = self._holder()
            device = holder.base_layer.weight.device
            holder.base_layer = packed.to(device) if isinstance(packed, GlydLinear) else packed
            del self.__dict__["_glyd_packed"]

    def __repr__(self) -> str:
        return "glyd." + super().__repr__()


class _Refused(nn.Module):
    """Stands for a packed module LoRA cannot go on: building it raises a clear error."""

    WHY = {
        GlydEmbedding: "a packed embedding (LoRA on embeddings is not supported on glyd models; leave it out of "
                       "target_modules)",
        GlydTiedLinear: "an output projection tied to the packed embedding (leave it out of target_modules)",
        GlydTiedEmbedding: "an embedding tied to another packed embedding (leave it out of target_modules)",
    }

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: Any = None, **kwargs: Any) -> None:
        base = _base_of(base_layer)
        why = next((w for t, w in self.WHY.items() if isinstance(base, t)), type(base).__name__)
        raise UnsupportedError(f"LoRA adapter {adapter_name!r} targets {why}: {type(base).__name__}"
                               f"({base.extra_repr()})")


#: Base layer type -> the LoRA layer PEFT builds for it (``LoraConfig._register_custom_module``).
LORA_MODULES: dict[type[nn.Module], type[nn.Module]] = {
    GlydLinear: GlydLoraLinear,
    GlydLinearPart: GlydLoraLinear,
    GlydEmbedding: _Refused,
    GlydTiedLinear: _Refused,
    GlydTiedEmbedding: _Refused,
}


@contextlib.contextmanager
def _quiet():
    # PEFT warns "Unsupported layer type ... proceed at your own risk" for every custom base layer it
    # sizes; for glyd's, registered here, that is expected.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Unsupported layer type '<class 'glyd\.nn\.", category=UserWarning)
        yield


def register(config: LoraConfig) -> LoraConfig:
    """Teach a LoRA config glyd's packed layers (PEFT's custom-module mapping); returns the config.

    >>> import peft                                                          # doctest: +SKIP
    >>> config = register(peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))  # doctest: +SKIP
    >>> model = peft.get_peft_model(glyd_model, config)                      # doctest: +SKIP
    """
    if not isinstance(config, LoraConfig):
        raise UnsupportedError(f"glyd's packed layers take LoRA adapters (a peft.LoraConfig), not a "
                               f"{type(config).__name__}")
    config._register_custom_module(LORA_MODULES)
    return config


def _all_linear(model: nn.Module, config: LoraConfig) -> set[str]:
    """``target_modules="all-linear"`` as PEFT reads it, with the packed linears counted as linears."""
    from peft.utils.constants import SEQ_CLS_HEAD_NAMES

    skip = set()
    get_out = getattr(model, "get_output_embeddings", None)
    head = get_out() if get_out is not None else None
    if head is None and str(config.task_type) == "SEQ_CLS":
        head = next((getattr(model, n) for n in SEQ_CLS_HEAD_NAMES if getattr(model, n, None) is not None), None)
    names = set()
    for name, m in model.named_modules():
        if m is head:
            skip.add(name)
        elif isinstance(m, (nn.Linear, GlydLinearPart)) or (isinstance(m, GlydLinear) and not m.splits):
            names.add(name)
    return names - skip


PACKED = (GlydLinear, GlydLinearPart, GlydEmbedding, GlydTiedLinear, GlydTiedEmbedding)

#: The heads PEFT adds to ``modules_to_save`` by task type (its ``PeftModelFor...`` classes).
TASK_HEADS = {"SEQ_CLS": ("classifier", "score"), "TOKEN_CLS": ("classifier", "score"),
              "QUESTION_ANS": ("qa_outputs",)}


def _holds_packed(module: nn.Module) -> bool:
    return any(isinstance(m, PACKED) for m in module.modules())


def _matches(name: str, wanted: Any) -> bool:
    return any(name == w or name.endswith("." + w) for w in wanted)  # PEFT's suffix match of module names


def _check_config(model: nn.Module, config: LoraConfig) -> None:
    """Refuse, before PEFT changes the model, a whole-module copy (``modules_to_save``, the task's head)
    or trainable token rows of a packed module: its weight is a buffer, so nothing would train and the
    adapter would carry the packed weight."""
    save = set(config.modules_to_save or ()) | set(TASK_HEADS.get(str(getattr(config.task_type, "value",
                                                                               config.task_type)), ()))
    for name, m in model.named_modules():
        if name and _matches(name, save) and _holds_packed(m):
            raise UnsupportedError(f"modules_to_save: {name!r} holds packed weights, which do not train (a packed "
                                   f"weight is a buffer); leave it out, or train the bf16 model")
    tokens = config.trainable_token_indices
    if not tokens:
        return
    if isinstance(tokens, dict):
        hits = [(n, m) for n, m in model.named_modules() if n and _matches(n, tokens)]
    else:
        emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        hits = [(n, m) for n, m in model.named_modules() if m is emb]
    for name, m in hits:
        if _holds_packed(m):
            raise UnsupportedError(f"trainable_token_indices: {name!r} is a packed embedding; its rows do not train")


def get_peft_model(model: nn.Module, config: LoraConfig, *args: Any, **kwargs: Any) -> Any:
    """``peft.get_peft_model`` for a glyd model: :func:`register` first, and ``target_modules="all-linear"``
    finds the packed linears too (PEFT's own search sees only ``nn.Linear``).

    >>> import peft                                                          # doctest: +SKIP
    >>> model = get_peft_model(glyd_model, peft.LoraConfig(r=8, target_modules="all-linear"))  # doctest: +SKIP
    """
    register(config)
    _check_config(model, config)
    if isinstance(config.target_modules, str) and config.target_modules.lower() == "all-linear":
        config.target_modules = _all_linear(model, config)
    with _quiet():
        return _peft.get_peft_model(model, config, *args, **kwargs)


def from_pretrained(model: nn.Module, adapter: str | os.PathLike, **kwargs: Any) -> Any:
    """``peft.PeftModel.from_pretrained`` onto a packed base: the adapter's saved config, registered.

    >>> model = from_pretrained(glyd.from_pretrained("model-glyd", exact=True), "adapter")  # doctest: +SKIP
    """
    if "config" in kwargs:
        config = kwargs.pop("config")
    else:
        hub = {k: kwargs[k] for k in ("subfolder", "revision", "cache_dir", "token") if k in kwargs}
        config = _peft.PeftConfig.from_pretrained(str(adapter), **hub)
    _check_config(model, register(config))
    with _quiet():
        return _peft.PeftModel.from_pretrained(model, str(adapter), config=config, **kwargs)


def merge_and_unload(peft_model: Any, **kwargs: Any) -> nn.Module:
    """``peft_model.merge_and_unload()``, then every layer still packed unpacked: the plain bf16 model,
    equal bit for bit to what PEFT gives on the bf16 base.

    >>> bf16_model = merge_and_unload(peft_model)                            # doctest: +SKIP
    """
    from glyd.hf.dequantize import dequantize

    model = peft_model.merge_and_unload(**kwargs)
    if any(isinstance(m, PACKED) for m in model.modules()):
        dequantize(model)
    return model
