"""Triton kernel for decode attention straight from ``kvf12`` pages (kernel and thin launcher only).

The page code is in ``glyd.kv.fixed`` and ``docs/format.md``; the pure-torch twin is
``glyd.kv.attention.decode_attention_torch``. Each value decodes in a few integer operations
(``word = ((code & 8) * 15 + code) << 8 + (base << 8) + lo``); a block's rare exceptions are patched
into the decoded tile by a loop that runs only for blocks that have any. Channels ``c`` and
``c + D/2`` share a code byte, so the kernel keeps every key and value tile as two halves of ``D/2``
channels (the scores are the sum of two dots; the output is two accumulators): no shuffles.
The softmax, the split of the pages and the combine are those of ``glyd.kv._triton``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from glyd.errors import FormatError
from glyd.kernels._interp import isolated
from glyd.kv._triton import _combine, _dot, _interpreting, _split_state, _splits, qk_f32


@triton.jit
def _half(code, lo, bshift):
    """bf16 words of one half of a tile: 4-bit codes, raw low bytes, ``base << 8`` per channel."""
    w = (((code & 8) * 15 + code) << 8) + bshift + lo
    return w


@triton.jit
def _patch(wa, wb, exc_ptr, e0, ne, t0, TS: tl.constexpr, D: tl.constexpr):
    """Put the block's exceptions that fall in rows ``t0 .. t0+TS`` into the two half tiles (int32
    words): one ``where`` over the one half tile an exception is in, none for the block's other rows."""
    H: tl.constexpr = D // 2
    rows = tl.arange(0, TS)[:, None]
    cols = tl.arange(0, H)[None, :]
    for e in range(e0, e0 + ne):
        ent = tl.load(exc_ptr + e)
        idx = ent & 0xFFFF
        r = idx // D - t0
        c = idx % D
        if (r >= 0) & (r < TS):
            word = (ent >> 16) & 0xFFFF
            if c < H:
                wa = tl.where((rows == r) & (cols == c), word, wa)
            else:
                wb = tl.where((rows == r) & (cols == c - H), word, wb)
    return wa, wb


@triton.jit
def _decode(lo_ptr, code_ptr, exc_ptr, blk, t0, ba, bb, e0, ne, P: tl.constexpr, TS: tl.constexpr, D: tl.constexpr):
    """Rows ``t0 .. t0+TS`` of one block -> two bf16 half tiles ``[TS, D/2]`` (channels ``< D/2``, then the rest)."""
    H: tl.constexpr = D // 2
    rows = (t0 + tl.arange(0, TS))[:, None]
    cols = tl.arange(0, H)[None, :]
    code = tl.load(code_ptr + blk * (P * H) + rows * H + cols).to(tl.int32)
    lop = lo_ptr + blk * (P * D) + rows * D + cols
    wa = _half(code & 15, tl.load(lop).to(tl.int32), ba[None, :])
    wb = _half(code >> 4, tl.load(lop + H).to(tl.int32), bb[None, :])
    if ne > 0:
        wa, wb = _patch(wa, wb, exc_ptr, e0, ne, t0, TS, D)
    return (wa.to(tl.int16).to(tl.bfloat16, bitcast=True), wb.to(tl.int16).to(tl.bfloat16, bitcast=True))


@triton.jit
def _bases(base_ptr, meta_ptr, blk, D: tl.constexpr):
    """A block's ``base << 8`` for each channel of the two halves, and its exception range."""
    H: tl.constexpr = D // 2
    offs = tl.arange(0, H)
    bp = base_ptr + blk * (D // 16)
    ba = tl.load(bp + offs // 16).to(tl.int32) << 8
    bb = tl.load(bp + (offs + H) // 16).to(tl.int32) << 8
    return ba, bb, tl.load(meta_ptr + blk * 2), tl.load(meta_ptr + blk * 2 + 1)


@triton.jit
def _probs(qa, qb, ka, kb, valid, m_i, l_i, qk_scale, QK_F32: tl.constexpr):
    """Online-softmax step: the key tile's probabilities (bf16), the rescale factor, the new state."""
    s = (_dot(qa, tl.trans(ka), QK_F32) + _dot(qb, tl.trans(kb), QK_F32)) * qk_scale  # [GP, TS], log2 units
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a fully masked tile so far: no NaN
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    return p.to(tl.bfloat16), alpha, m_new, l_i * alpha + tl.sum(p, 1)


# Shape-dependent ints are not specialised (no recompile per batch size or length).
@isolated
@triton.jit(do_not_specialize=["H", "K_CAP", "V_CAP", "PAGES_PER_SPLIT", "S"])
def _kvf_decode_split_kernel(
    q_ptr, lens_ptr, starts_ptr,
    k_lo, k_code, k_base, k_meta, k_exc, k_raw,
    v_lo, v_code, v_base, v_meta, v_exc, v_raw,
    m_out, l_out, acc_out,
    qk_scale, H, K_CAP, V_CAP, PAGES_PER_SPLIT, S,
    G: tl.constexpr, GP: tl.constexpr, P: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    F32: tl.constexpr, TS: tl.constexpr, QK_F32: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    L = tl.load(lens_ptr + b)
    S0 = tl.load(starts_ptr + b)  # tokens before S0 are masked (left padding)
    n_full = L // P
    j0 = split * PAGES_PER_SPLIT
    j1 = tl.minimum(j0 + PAGES_PER_SPLIT, (L + P - 1) // P)
    HD: tl.constexpr = D // 2
    HV: tl.constexpr = DV // 2
    offs_g = tl.arange(0, GP)
    offs_hd = tl.arange(0, HD)
    offs_hv = tl.arange(0, HV)
    offs_ts = tl.arange(0, TS)
    qp = q_ptr + ((b * H + h) * G + offs_g)[:, None] * D + offs_hd[None, :]
    qa = tl.load(qp, mask=offs_g[:, None] < G, other=0.0)
    qb = tl.load(qp + HD, mask=offs_g[:, None] < G, other=0.0)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc_a = tl.zeros([GP, HV], tl.float32)
    acc_b = tl.zeros([GP, HV], tl.float32)
    for j in range(j0, tl.minimum(j1, n_full)):
        kblk = ((b * H + h) * K_CAP + j).to(tl.int64)
        vblk = ((b * H + h) * V_CAP + j).to(tl.int64)
        kba, kbb, ke0, kne = _bases(k_base, k_meta, kblk, D)
        vba, vbb, ve0, vne = _bases(v_base, v_meta, vblk, DV)
        for t0 in range(0, P, TS):
            ka, kb = _decode(k_lo, k_code, k_exc, kblk, t0, kba, kbb, ke0, kne, P, TS, D)
            valid = (j * P + t0 + offs_ts) >= S0
            p, alpha, m_i, l_i = _probs(qa, qb, ka, kb, valid, m_i, l_i, qk_scale, QK_F32)
            va, vb = _decode(v_lo, v_code, v_exc, vblk, t0, vba, vbb, ve0, vne, P, TS, DV)
            acc_a = acc_a * alpha[:, None] + _dot(p, va, F32)
            acc_b = acc_b * alpha[:, None] + _dot(p, vb, F32)
    if (n_full >= j0) & (n_full < j1):  # this split holds the raw, unfilled page
        raw = (b * H + h).to(tl.int64) * P
        for t0 in range(0, P, TS):
            offs_t = t0 + offs_ts
            valid = (offs_t < (L - n_full * P)) & ((n_full * P + offs_t) >= S0)
            kp = k_raw + (raw + offs_t[:, None]) * D + offs_hd[None, :]
            ka = tl.load(kp, mask=valid[:, None], other=0.0)
            kb = tl.load(kp + HD, mask=valid[:, None], other=0.0)
            p, alpha, m_i, l_i = _probs(qa, qb, ka, kb, valid, m_i, l_i, qk_scale, QK_F32)
            vp = v_raw + (raw + offs_t[:, None]) * DV + offs_hv[None, :]
            va = tl.load(vp, mask=valid[:, None], other=0.0)
            vb = tl.load(vp + HV, mask=valid[:, None], other=0.0)
            acc_a = acc_a * alpha[:, None] + _dot(p, va, F32)
            acc_b = acc_b * alpha[:, None] + _dot(p, vb, F32)
    o = pid_bh * S + split
    tl.store(m_out + o * GP + offs_g, m_i)
    tl.store(l_out + o * GP + offs_g, l_i)
    ap = acc_out + (o * GP + offs_g)[:, None] * DV + offs_hv[None, :]
    tl.store(ap, acc_a)
    tl.store(ap + HV, acc_b)


def _planes(st, name: str):
    for a in ("lo", "code", "base", "meta", "raw"):
        if not getattr(st, a).is_contiguous():
            raise FormatError(f"{name}.{a} must be contiguous")
    exc = st.exc if st.exc.numel() else torch.zeros(1, dtype=torch.int32, device=st.device)
    return st.lo, st.code, st.base, st.meta, exc, st.raw


# q [B, Hq, D] bf16; k_store/v_store FixedPageStores with B sequences, H KV heads (Hq = G*H); lens [B] int
# (tokens per sequence); starts [B] int or None (tokens before it are masked) -> out [B, Hq, DV] bf16.
# num_warps, sub_tile (tokens decoded at a time; >= 32 on the GPU: see glyd.kv._triton._scores),
# programs_per_sm (programs launched per SM) are tuning knobs, not measured yet on a GPU.
def decode_attention_fixed_triton(q, k_store, v_store, lens, scale=None, num_splits=None, num_warps=4,
                                  sub_tile=32, starts=None, programs_per_sm=16):
    b, hq, d = q.shape
    h, p, dv = k_store.heads, k_store.page, v_store.head_dim
    if q.dtype != torch.bfloat16:
        raise FormatError(f"q must be bf16, got {q.dtype}")
    if k_store.head_dim != d or hq % h or k_store.batch != b or v_store.batch != b or v_store.heads != h:
        raise FormatError(f"q {tuple(q.shape)} does not match the KV stores (B={k_store.batch}, H={h}, D={k_store.head_dim})")
    if v_store.page != p or d & (d - 1) or dv & (dv - 1) or p & (p - 1) or p < 16 or d < 32 or dv < 32:
        raise FormatError(f"page {p} (>= 16), head dims {d}/{dv} (>= 32) must be powers of two, pages equal")
    if sub_tile < 16 or sub_tile & (sub_tile - 1):
        raise FormatError(f"sub_tile {sub_tile} must be a power of two >= 16")
    ts = min(sub_tile, p)
    if ts < 32 and not _interpreting():
        raise FormatError(f"the fused kernel needs sub-tiles (and pages) of >= 32 tokens on the GPU, got {ts}")
    g = hq // h
    gp = max(16, triton.next_power_of_2(g))
    dev = q.device
    max_pages = (k_store.max_len + p - 1) // p  # a host int: no sync, so CUDA graphs can capture this
    num_splits, pages_per_split = _splits(max_pages, b * h, dev, num_splits, programs_per_sm)
    lens, starts, m, l_, acc = _split_state(q, lens, starts, b, h, num_splits, gp, dv)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    _kvf_decode_split_kernel[(b * h, num_splits)](
        q.contiguous(), lens, starts,
        *_planes(k_store, "k_store"), *_planes(v_store, "v_store"),
        m, l_, acc,
        scale * 1.4426950408889634, h, k_store.cap, v_store.cap, pages_per_split, num_splits,
        G=g, GP=gp, P=p, D=d, DV=dv, F32=_interpreting(), TS=ts, QK_F32=qk_f32(d // 2), num_warps=num_warps,
    )
    out = torch.empty(b, hq, dv, dtype=torch.bfloat16, device=dev)
    _combine(m, l_, acc, out, b, h, num_splits, g, gp, dv)
    return out

