"""The reference for the tokens of glyd's static KV pool (tests/kv, tests/hf): a bf16 ``DynamicCache``'s keys
and values read by the same decode attention as ``GlydStaticCache``'s (``use_reference(model, page, context)``).

On the tests' path as ``tiny_models`` is for tests/hf (``tests/conftest.py``'s folder is on ``sys.path``).
"""

from __future__ import annotations

REF = "glyd_kv_bf16_reference"


def bf16_pool_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, *, page, context,
                        **kwargs):
    """The reference for GlydStaticCache's tokens: a bf16 cache's keys and values (a DynamicCache's), packed
    afresh into a pool of ``context`` positions each decode step and read by the same attention as
    GlydStaticCache's (same pages, same splits: on a GPU the splits depend on the pool's context)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from glyd.kv.hf_attention import _valid
    from glyd.kv.pool import FixedPagePool

    if query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, h, t, d = key.shape
    pool = FixedPagePool(1, b, h, d, context, page=page, v_head_dim=value.shape[3], device=key.device,
                         exc_fraction=1 / 64)
    pool.advance(t)
    pool.write(0, key.contiguous(), value.contiguous())
    return pool.attend(0, query[:, :, 0], scale=scaling, valid=_valid(attention_mask))[:, None], None


def use_reference(model, page: int, context: int) -> None:
    """Switch ``model`` to :func:`bf16_pool_attention` (pages of ``page``, a pool of ``context`` positions)."""
    import functools

    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(REF, functools.partial(bf16_pool_attention, page=page, context=context))
    AttentionMaskInterface.register(REF, sdpa_mask)
    model.set_attn_implementation(REF)
