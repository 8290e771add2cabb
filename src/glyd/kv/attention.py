"""Decode-step attention over packed KV pages: fused (Gluon or Triton), pure-torch twin, and reference.

All three take ``q [B, Hq, D]`` (bf16, one new token per sequence), a key and a value
:class:`~glyd.kv.pages.PageStore` with ``B`` sequences and ``H`` KV heads (``Hq`` a multiple of
``H``: grouped-query attention, query head ``h * Hq/H + g`` reads KV head ``h``). Sequence ``b``
attends to its ``k_store.lens[b]`` tokens (stores built by ``PageStore.from_bf16(x, lens)``), or
to every token of the store. They return ``[B, Hq, DV]`` bf16.

* :func:`decode_attention_reference`: unpack to bf16, ``scaled_dot_product_attention`` (the
  inputs are the bf16 cache's bit for bit).
* :func:`decode_attention_torch`: the fused kernel's algorithm in torch (page by page, online
  softmax in fp32, probabilities rounded to bf16 before the value product, as the kernel does).
* :func:`decode_attention`: the Gluon kernel (``glyd.kv._gluon``) for CUDA tensors at pages of 64 and head
  dim 128, the Triton kernel (``glyd.kv._triton``) for other CUDA shapes, else the torch twin.

>>> import torch
>>> from glyd.kv import PageStore, decode_attention, decode_attention_reference
>>> k = torch.randn(2, 2, 100, 64).to(torch.bfloat16); v = torch.randn(2, 2, 100, 64).to(torch.bfloat16)
>>> q = torch.randn(2, 4, 64).to(torch.bfloat16)
>>> ks, vs = PageStore.from_bf16(k), PageStore.from_bf16(v)
>>> out = decode_attention(q, ks, vs)
>>> ref = decode_attention_reference(q, ks, vs)
>>> bool((out.float() - ref.float()).abs().max() < 0.05)
True
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from glyd.errors import FormatError
from glyd.kernels._fields import check_int
from glyd.kernels.registry import Device
from glyd.kv.fixed import FixedPageStore, store_view
from glyd.kv.pages import PageStore, unpack_blocks, unpack_blocks_grouped
from glyd.kv.pool_ops import TwinConfig
from glyd.kv.pool_twin import attention_torch, kept, softmax_step
from glyd.kv.registry import KVKernel, KVProblem, by_name, choose


def _lens(store: PageStore, device: torch.device) -> torch.Tensor:
    # A cache's store holds one length for every sequence; PageStore.from_bf16(x, lens) per-sequence ones.
    if store.n_tokens == 0:
        raise FormatError("decode attention over an empty KV store")
    if store.lens is not None:
        return store.lens.to(device=device, dtype=torch.int64)
    return torch.full((store.batch,), store.n_tokens, dtype=torch.int64, device=device)


def padded_bf16(store: PageStore, lens: torch.Tensor) -> torch.Tensor:
    """``[B, H, Tmax, D]`` bf16 where row ``b`` holds its ``lens[b]`` tokens first (the rest is junk)."""
    b, h, p, d = store.batch, store.heads, store.page, store.head_dim
    if store.lens is None:
        return store.to_bf16()
    n = store.n_pages
    out = torch.zeros(b, h, (n + 1) * p, d, dtype=torch.bfloat16, device=store.device)
    if n:
        out[:, :, : n * p] = store.pages()
    for i, first in enumerate(((store.lens // p) * p).tolist()):
        out[i, :, first : first + p] = store.raw[i]
    return out


def padded_dense(store: PageStore, lens: torch.Tensor) -> torch.Tensor:
    """Deprecated name of :func:`padded_bf16`."""
    warnings.warn("glyd.kv.attention.padded_dense is deprecated: use padded_bf16", DeprecationWarning, stacklevel=2)
    return padded_bf16(store, lens)


def _check(q: torch.Tensor, ks: PageStore, vs: PageStore) -> tuple[int, int, int]:
    if q.dim() != 3 or q.dtype != torch.bfloat16:
        raise FormatError(f"q must be bf16 [B, Hq, D], got {q.dtype} {tuple(q.shape)}")
    b, hq, d = q.shape
    if ks.batch != b or vs.batch != b or ks.heads != vs.heads or hq % ks.heads or ks.head_dim != d:
        raise FormatError(
            f"q {tuple(q.shape)} does not match k_store [{ks.batch}, {ks.heads}, T, {ks.head_dim}] "
            f"and v_store [{vs.batch}, {vs.heads}, T, {vs.head_dim}]"
        )
    return b, hq, d


def decode_attention_reference(
    q: torch.Tensor, k_store: PageStore, v_store: PageStore,
    scale: float | None = None, upcast: bool = False, starts: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Unpack to bf16 and run ``F.scaled_dot_product_attention`` (in fp32 when ``upcast``); ``starts`` and
    ``valid`` mask as in :func:`decode_attention`."""
    b, hq, d = _check(q, k_store, v_store)
    lens = _lens(k_store, q.device)
    k = padded_bf16(k_store, lens).to(q.device)
    v = padded_bf16(v_store, lens).to(q.device)
    g = hq // k_store.heads
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    t = k.shape[2]
    pos = torch.arange(t, device=q.device)[None, :]
    mask = ((pos < lens[:, None]) & kept(pos, starts, valid))[:, None, None, :]
    qq = q[:, :, None, :]
    if upcast:
        qq, k, v = qq.float(), k.float(), v.float()
    out = F.scaled_dot_product_attention(qq, k, v, attn_mask=mask, scale=scale)
    return out[:, :, 0].to(torch.bfloat16)


def decode_attention_torch(
    q: torch.Tensor, k_store: PageStore, v_store: PageStore,
    scale: float | None = None, starts: torch.Tensor | None = None, valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fused kernels' algorithm in torch: decode a page, online softmax, next page (kvf12 pages:
    :func:`glyd.kv.pool_twin.attention_torch` through the stores' block table)."""
    b, hq, d = _check(q, k_store, v_store)
    h, p, dv = k_store.heads, k_store.page, v_store.head_dim
    g = hq // h
    lens = _lens(k_store, q.device)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if isinstance(k_store, FixedPageStore) and isinstance(v_store, FixedPageStore):
        bidx, ks, vs = store_view(k_store, v_store)
        return attention_torch(q, lens, starts, bidx, ks, vs, scale, capped=False, valid=valid)
    qf = q.reshape(b, h, g, d).to(torch.bfloat16).float()
    m = torch.full((b, h, g), float("-inf"), device=q.device)
    l_ = torch.zeros(b, h, g, device=q.device)
    acc = torch.zeros(b, h, g, dv, device=q.device)
    n_full = lens // p
    max_pages = int(((lens + p - 1) // p).max())

    t_idx = torch.arange(p, device=q.device)

    def page(st: PageStore, j: int) -> torch.Tensor:
        # the kernel's group-wise decode where it applies (head dim a multiple of 16); same bits either way
        unpack = unpack_blocks_grouped if st.head_dim % 16 == 0 else unpack_blocks
        return unpack(st.sm[:, :, j].reshape(b * h, p, st.head_dim), st.dig[:, :, j].reshape(b * h, -1),
                      st.top[:, :, j].reshape(b * h, st.head_dim), st.meta[:, :, j].reshape(b * h, 4),
                      st.tail[: st.tail_len]).reshape(b, h, p, st.head_dim)

    for j in range(max_pages):
        if j < k_store.n_pages:
            kb, vb = page(k_store, j), page(v_store, j)
        else:
            kb = vb = None
        is_raw = (n_full == j)[:, None, None, None]  # sequences whose raw page is page j
        if kb is None:
            kb, vb = k_store.raw, v_store.raw
        else:
            kb = torch.where(is_raw, k_store.raw, kb)
            vb = torch.where(is_raw, v_store.raw, vb)
        pos = (j * p + t_idx)[None, :]
        keep = (pos < lens[:, None]) & kept(pos, starts, valid)
        # Slots past a sequence's length hold whatever the buffer had (an unwritten raw slot may be
        # a NaN pattern): zero them, since 0 * NaN would poison the sum even at weight 0.
        vb = torch.where(keep[:, None, :, None], vb, torch.zeros((), dtype=vb.dtype, device=vb.device))
        m, l_, acc = softmax_step(qf, kb, vb, keep, m, l_, acc, scale)
    return (acc / l_[..., None]).reshape(b, hq, dv).to(torch.bfloat16)


class TieredAttentionTorch(KVKernel):
    """The twin of the kvtiered code's decode kernels (:func:`decode_attention_torch`): every device."""

    name = "kvtiered_attention_torch"
    code = "kvtiered"
    op = "attention"
    Config = TwinConfig

    @classmethod
    def launch(cls, q, k_store, v_store, lens, scale, starts, num_splits, *, config, valid=None):
        return decode_attention_torch(q, k_store, v_store, scale=scale, starts=starts, valid=valid)


#: ``decode_attention(backend=...)``: the kernel each backend names, by page code.
BACKENDS = {
    "gluon": {"kvtiered": "kvtiered_attention_gluon"},
    "triton": {"kvtiered": "kvtiered_attention_triton", "kvf12": "kvf12_attention_triton"},
    "torch": {"kvtiered": "kvtiered_attention_torch", "kvf12": "kvf12_attention_torch"},
}


def decode_attention(
    q: torch.Tensor, k_store: PageStore, v_store: PageStore, scale: float | None = None,
    num_splits: int | None = None, backend: str = "auto", starts: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode-step attention reading the packed pages directly.

    ``backend="auto"`` takes the kernel ``glyd.kv.registry`` chooses from the GPU's table for CUDA
    tensors (kvtiered pages: the Gluon kernel, CUDA sm_80+, pages of 64 tokens, head dim 128, at most 16
    query heads a KV head; else the Triton kernel, pages of >= 32 tokens; kvf12 pages: the Triton kernel,
    pages of >= 32 tokens and head dims powers of two >= 32) and the torch twin elsewhere or where no
    kernel takes the shapes. ``"gluon"``, ``"triton"`` (also under ``TRITON_INTERPRET=1``) and ``"torch"``
    force one. ``starts[b]``: sequence ``b`` ignores its tokens before that index (left padding).
    ``valid [B, S]`` (bool or uint8: the attention mask's row for the query, as transformers builds it):
    sequence ``b`` attends position ``t`` only where ``t < S`` and ``valid[b, t]`` (masked positions anywhere,
    e.g. a second prompt's left padding); it subsumes ``starts``, and both may be given.

    >>> import torch
    >>> from glyd.kv import PageStore, decode_attention
    >>> k, v = torch.randn(2, 3, 70, 16).bfloat16(), torch.randn(2, 3, 70, 16).bfloat16()
    >>> out = decode_attention(torch.randn(2, 6, 16).bfloat16(), PageStore.from_bf16(k), PageStore.from_bf16(v))
    >>> out.shape
    torch.Size([2, 6, 16])
    """
    b, hq, d = _check(q, k_store, v_store)
    if backend not in ("auto", *BACKENDS):
        raise ValueError(f"backend must be 'auto', 'gluon', 'triton' or 'torch', got {backend!r}")
    if num_splits is not None:  # every backend: the twin has no splits, but the value is still wrong
        check_int("num_splits", num_splits, 1)
    fixed = isinstance(k_store, FixedPageStore)
    if fixed != isinstance(v_store, FixedPageStore):
        raise FormatError("k_store and v_store must hold the same page code (both kvf12 or both kvtiered)")
    code = "kvf12" if fixed else "kvtiered"
    if backend == "gluon" and fixed:
        raise FormatError("the Gluon kernel reads kvtiered pages only; kvf12 pages take backend='triton' or 'torch'")
    problem = KVProblem(code, "attention", k_store.page, d, v_store.head_dim, hq // k_store.heads, "store")
    device = Device.of(q.device)
    if backend == "auto" and q.is_cuda:
        kc, cfg = choose(problem, device)
    else:
        try:
            kc, cfg = by_name(BACKENDS["torch" if backend == "auto" else backend][code], problem, device)
        except RuntimeError as exc:
            raise FormatError(str(exc)) from None
    lens = _lens(k_store, q.device)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if fixed:
        bidx, ks, vs = store_view(k_store, v_store)
        return kc.launch(q.contiguous(), lens.to(torch.int32), starts, bidx, ks, vs, scale, config=cfg, capped=False,
                         num_splits=num_splits, valid=valid)
    return kc.launch(q, k_store, v_store, lens, scale, starts, num_splits, config=cfg, valid=valid)
