"""The ``"glyd_kv"`` attention function that transformers calls for glyd's KV caches (:func:`enable_fused`).

On a one-token decode step the cache's ``update`` returns only the new token's keys and values and
leaves word for this function, which reads the packed pages instead: ``GlydCache`` (growing stores)
through :func:`glyd.kv.decode_attention`, ``GlydStaticCache`` (the static pool) through
``glyd::kvf12_attention``. Every other call (a prompt, another cache) goes to transformers' SDPA.

How the word is left: ``GlydCache`` keys it by the identity of the key tensor it returned (a host
dict, for eager steps); the static pool by the layer index (``_LIVE``: set in ``update``, taken here),
which ``torch.compile`` traces (a dict of Python objects) and CUDA graphs replay without Python at all.
The entry holds the key tensor ``update`` returned, and is taken only by the call that gets that tensor: an
entry left by a step whose attention never ran (another attention, an exception) is dropped, never read by a
later one-token call of another cache.
"""

from __future__ import annotations

import torch

#: The attention implementation name :func:`enable_fused` registers with transformers.
ATTN_NAME = "glyd_kv"
# id(key tensor handed to attention) -> (that tensor, its GlydLayer): GlydCache's fused decode step.
_PENDING: dict[int, tuple[torch.Tensor, object]] = {}
# layer index -> (key tensor handed to attention, the GlydStaticLayer whose pool holds this step's token):
# GlydStaticCache's fused step.
_LIVE: dict[int, tuple[torch.Tensor, object]] = {}


def _valid(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The decode step's row of a 4-D mask, bool ``[B, S]`` (True: attended), a device op, no sync. In
    transformers 5.17 the ``"glyd_kv"`` attention (``sdpa_mask``) gets a bool ``[B, 1, 1, S]`` mask on a decode
    step (S: a static cache's whole context, or the tokens so far), or None (a growing cache, no padding);
    an additive float mask (0 where attended) is read too. Every masked position counts, not only the
    left padding: a second prompt's padding sits after a row's first attended position."""
    if attention_mask is None:
        return None
    row = attention_mask[:, 0, -1, :]
    return row if row.dtype == torch.bool else row == 0


def glyd_kv_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers attention function: fused decode over packed pages, SDPA for everything else."""
    layer_idx = getattr(module, "layer_idx", None)
    live = _LIVE.pop(layer_idx, None) if layer_idx is not None else None
    if live is not None and live[0] is key and query.shape[2] == 1:
        _check_plain(kwargs, layer_idx)
        out = live[1].attend(query[:, :, 0], scale=scaling, valid=_valid(attention_mask))
        return out[:, None], None  # [B, 1, Hq, D], as sdpa_attention_forward returns
    # GlydCache's eager steps only; asked only when one is waiting: torch 2.11's dynamo cannot trace id() of a
    # tensor made in the graph (a compiled prompt into GlydStaticCache broke there), and guards on the dict
    entry = _PENDING.pop(id(key), None) if _PENDING else None
    if entry is None or entry[0] is not key:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        if attention_mask is not None and attention_mask.shape[-1] > key.shape[-2]:
            # a static cache's mask spans its whole context; a prompt's keys are its first positions
            attention_mask = attention_mask[..., : key.shape[-2]]
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    from glyd.kv.attention import decode_attention

    layer = entry[1]
    layer._pending_id = None
    _check_plain(kwargs, layer_idx)
    out = decode_attention(query[:, :, 0].contiguous(), layer.k_store, layer.v_store, scale=scaling,
                           valid=_valid(attention_mask))
    return out[:, None], None


def _check_plain(kwargs: dict, layer_idx) -> None:
    """The fused decode is plain scaled softmax attention: refuse what would change it (never a silent
    wrong output). Gemma 2's logit soft-capping and gpt-oss's attention sinks come as these arguments."""
    from glyd.errors import UnsupportedError

    for name in ("softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise UnsupportedError(f"the fused {ATTN_NAME!r} decode attention (layer {layer_idx}) has no {name}; "
                                   f"this model passes one: use a GlydCache with fused=False")


def enable_fused(model) -> None:
    """Register the ``"glyd_kv"`` attention with transformers and switch ``model`` to it.

    >>> enable_fused(model)                                                  # doctest: +SKIP
    >>> model.generate(ids, past_key_values=GlydCache(model.config, fused=True))  # doctest: +SKIP
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, glyd_kv_attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
    model.set_attn_implementation(ATTN_NAME)


def check_fused(config, what: str) -> None:
    """Raise unless ``config`` runs the ``"glyd_kv"`` attention (a fused cache needs it)."""
    from glyd.errors import FormatError

    impl = getattr(config, "_attn_implementation", None) if config is not None else None
    if impl != ATTN_NAME:
        raise FormatError(f"{what}(fused=True) needs the model's attention set to {ATTN_NAME!r} (glyd.kv.enable_fused"
                          f"(model)) and its config passed; config._attn_implementation is {impl!r}")
