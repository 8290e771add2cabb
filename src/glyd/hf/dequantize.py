"""``model.dequantize()``: a packed model back into the plain bf16 transformers model, bit for bit.

Every packed module is replaced by the module it was packed from: ``GlydLinear`` (and each part
of a merged one) by ``nn.Linear``, ``GlydEmbedding`` by ``nn.Embedding`` (or the model's own
embedding class, e.g. a scaled one), a tied ``GlydTiedLinear`` by an ``nn.Linear`` that shares
the embedding's weight, a ``GlydExperts`` by the experts module it was (its 3-D weights unpacked).
Each weight is unpacked where its module lives, one matrix at a time.
transformers' ``model.dequantize()`` reaches it through ``GlydHfQuantizer._dequantize``; a model
packed by ``glyd.from_pretrained`` or ``glyd.compress`` carries it as ``model.dequantize``
(``glyd.hf.hooks``).

>>> model = glyd.from_pretrained("bf16-folder", device="cpu")   # doctest: +SKIP
>>> model = model.dequantize()                                   # doctest: +SKIP
>>> model.save_pretrained("bf16-again")                          # a plain bf16 folder  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
from torch import nn

from glyd.errors import UnsupportedError
from glyd.nn.experts import GlydExperts
from glyd.nn.modules import GlydEmbedding, GlydLinear, GlydLinearPart, GlydTiedEmbedding, GlydTiedLinear

log = logging.getLogger(__name__)

#: What a model may be dequantized to: bf16 itself, or float32 (every bf16 value is one, exactly).
DTYPES = (torch.bfloat16, torch.float32)

#: The instance attributes glyd puts on a packed model (its hooks and notes), dropped with the packing.
GLYD_ATTRIBUTES = ("save_pretrained", "dequantize", "_glyd_source", "_glyd_manifest")


def check_dtype(dtype: Any) -> torch.dtype:
    """The dtype to dequantize to (None: bfloat16); one that would round a bf16 weight is refused."""
    if dtype is None or dtype in ("bfloat16", "auto"):
        return torch.bfloat16
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype):
        dtype = getattr(torch, dtype)
    if dtype not in DTYPES:
        raise UnsupportedError(f"dequantize(dtype={dtype!r}): glyd gives back the bf16 weights as they are (dtype "
                               f"torch.bfloat16, or torch.float32, which holds them exactly); convert it yourself")
    return dtype


def dequantize(model: nn.Module, dtype: Any = None) -> nn.Module:
    """Unpack every packed module of ``model`` in place into the plain module it was; returns the model.

    >>> from glyd.hf.dequantize import dequantize                     # doctest: +SKIP
    >>> model = dequantize(glyd.from_pretrained("bf16-folder"))        # doctest: +SKIP
    """
    dtype = check_dtype(dtype)
    jobs = [(parent, attr, child) for _, parent in model.named_modules() for attr, child in parent._modules.items()
            if isinstance(child, (GlydLinear, GlydLinearPart, GlydEmbedding, GlydTiedLinear, GlydTiedEmbedding,
                                  GlydExperts))]
    if not jobs:
        raise UnsupportedError("dequantize: the model has no glyd-packed module")
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    packed_embeddings = {id(c) for _, _, c in jobs if isinstance(c, GlydEmbedding)}
    for _, attr, c in jobs:  # before anything changes: a refusal leaves the model as it was
        if isinstance(c, (GlydTiedLinear, GlydTiedEmbedding)) and id(c.source) not in packed_embeddings:
            raise UnsupportedError(f"dequantize: {names.get(id(c), attr)} is tied to an embedding that is not part "
                                   f"of the model")
    scaled = [(names.get(id(c), a), c) for _, a, c in jobs
              if isinstance(c, (GlydEmbedding, GlydTiedEmbedding)) and c.embed_scale is not None]
    reference = _reference(model) if scaled else None
    for name, c in scaled:  # before anything changes: the model's own class of every scaled embedding
        _scaled_embedding(reference, name, c)
    embeddings: dict[int, nn.Module] = {}
    parts: dict[int, tuple[torch.Tensor, ...]] = {}
    for parent, attr, child in jobs:  # tied projections after their embeddings
        if isinstance(child, GlydEmbedding):
            embeddings[id(child)] = new = _embedding(child, reference, names.get(id(child), attr))
        elif isinstance(child, GlydLinearPart):
            merged = child.merged
            if id(merged) not in parts:
                parts[id(merged)] = tuple(w.clone() for w in merged._unpack().split(merged.splits, dim=0))
            bias = child.bias
            new = _linear(parts[id(merged)][child.index], None if bias is None else bias.detach().clone(), child)
        elif isinstance(child, GlydLinear) and child.splits:
            new = None  # its parts become the modules; the merged module goes
        elif isinstance(child, GlydLinear):
            new = _linear(child._unpack(), None if child.bias is None else child.bias.detach(), child)
        elif isinstance(child, GlydExperts):  # the experts module it was, its 3-D weights unpacked
            new = child.dequantized().train(child.training)
        else:
            continue
        _replace(parent, attr, new)
    for parent, attr, child in jobs:
        if isinstance(child, GlydTiedLinear):
            _replace(parent, attr, _tied(embeddings[id(child.source)], child))
        elif isinstance(child, GlydTiedEmbedding):
            new = _embedding(child, reference, names.get(id(child), attr), embeddings[id(child.source)].weight)
            _replace(parent, attr, new)
    del parts, reference
    for m in model.modules():  # a packed layer a merged LoRA parked for unmerge (glyd.hf.peft): plain too
        parked = m.__dict__.get("_glyd_packed")
        if parked is not None:
            w = parked.weight.materialize().clone() if isinstance(parked, GlydLinearPart) else parked._unpack()
            m.__dict__["_glyd_packed"] = _linear(w, None if parked.bias is None else parked.bias.detach().clone(), parked)
    _retie(model)
    for a in GLYD_ATTRIBUTES:
        model.__dict__.pop(a, None)
    if dtype != torch.bfloat16:
        model.to(dtype)
    cfg = getattr(model, "config", None)
    if cfg is not None and not isinstance(cfg, dict):  # a diffusers config is a frozen dict holding no dtype
        cfg.dtype = dtype
    log.info("dequantized %d packed module(s) into bf16 modules", len(jobs))
    return model


def _replace(parent: nn.Module, attr: str, new: nn.Module | None) -> None:
    if new is None:
        del parent._modules[attr]
    else:
        setattr(parent, attr, new)


def _linear(w: torch.Tensor, bias: torch.Tensor | None, old: nn.Module) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, device="meta", dtype=torch.bfloat16)
    lin.weight = nn.Parameter(w)
    if bias is not None:
        lin.bias = nn.Parameter(bias)
    return lin.train(old.training)


def _tied(emb: nn.Module, old: GlydTiedLinear) -> nn.Linear:
    lin = nn.Linear(old.in_features, old.out_features, bias=False, device="meta", dtype=torch.bfloat16)
    lin.weight = emb.weight  # one Parameter, as transformers ties it
    return lin.train(old.training)


def _embedding(old: GlydEmbedding | GlydTiedEmbedding, reference: nn.Module | None, name: str,
               tied: nn.Parameter | None = None) -> nn.Module:
    """The plain embedding of ``old``: its table unpacked, or ``tied``, its source's (one Parameter)."""
    table = old._unpack() if tied is None else None
    if old.embed_scale is None:
        emb = nn.Embedding(old.num_embeddings, old.embedding_dim, old.padding_idx, device="meta", dtype=torch.bfloat16)
    else:
        emb = _scaled_embedding(reference, name, old)
        scale = old.embed_scale
        emb.embed_scale = scale.detach().clone() if isinstance(scale, torch.Tensor) else scale
    emb.weight = nn.Parameter(table) if tied is None else tied
    return emb.train(old.training)


def _scaled_embedding(reference: nn.Module | None, name: str, old: GlydEmbedding | GlydTiedEmbedding) -> nn.Embedding:
    """A scaled embedding (Gemma 3's) is the model's own class: its module in a meta-device copy."""
    try:
        emb = None if reference is None else reference.get_submodule(name)
    except AttributeError:
        emb = None
    if not isinstance(emb, nn.Embedding) or not hasattr(emb, "embed_scale") or \
            tuple(emb.weight.shape) != (old.num_embeddings, old.embedding_dim):
        raise UnsupportedError(f"dequantize: cannot rebuild the scaled embedding {name!r} (the model's own class is "
                               f"not known)")
    return emb


def _reference(model: nn.Module) -> nn.Module | None:
    """The model's class built on the meta device from its config (only its module classes are used)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    try:
        from accelerate import init_empty_weights

        config = copy.deepcopy(config)
        config.__dict__.pop("quantization_config", None)
        with init_empty_weights(include_buffers=False):
            return type(model)(config)
    except Exception:  # any model class: without its reference, the error names the module
        log.debug("dequantize: could not build %s from its config", type(model).__name__, exc_info=True)
        return None


def _retie(model: nn.Module) -> None:
    """transformers' tie entries again, those whose two weights are now one parameter."""
    expand = getattr(model, "get_expanded_tied_weights_keys", None)
    if expand is None:
        return
    params = dict(model.named_parameters(remove_duplicate=False))
    keys = expand(all_submodels=False)
    model.all_tied_weights_keys = {k: v for k, v in keys.items() if k in params and params[k] is params.get(v)}
