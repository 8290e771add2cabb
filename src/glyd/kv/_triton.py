"""Triton kernels for decode attention straight from packed KV pages (kernels and thin launchers only).

Imported only when a CUDA tensor (or ``TRITON_INTERPRET=1``) asks for the fused path: ``import glyd``
and ``import glyd.kv`` never import Triton. The page code is documented in ``glyd.kv.pages`` and
``docs/format.md``; the pure-torch twin of these kernels is ``glyd.kv.attention.decode_attention_torch``.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from glyd.errors import FormatError


@triton.jit
def _rank(m, TS: tl.constexpr, D: tl.constexpr, RANK: tl.constexpr):
    """0-based rank of each set flag of ``m [TS, D]`` among the tile's flags in token-major order."""
    mi = m.to(tl.int32)
    if RANK == 0:  # one scan over the flattened tile
        r = tl.reshape(tl.cumsum(tl.reshape(mi, [TS * D]), 0), [TS, D])
    else:  # per-row scans plus a scan of the row counts (no reshape of the tile)
        cnt = tl.sum(mi, 1)
        r = (tl.cumsum(cnt, 0) - cnt)[:, None] + tl.cumsum(mi, 1)
    return r - 1, tl.sum(mi)


@triton.jit
def _decode_rows(sm_ptr, dig_ptr, tail_ptr, blk, t0, top, s2, s3, s4, c2, c3, c4,
                 P: tl.constexpr, TS: tl.constexpr, D: tl.constexpr, RANK: tl.constexpr):
    """Rows ``t0 .. t0+TS`` of one packed block (page x head) -> bf16 [TS, D], in registers.

    ``s2, s3, s4`` are the block's tier-2/3/4 starts in ``tail``; ``c2, c3, c4`` how many values of
    the rows before ``t0`` sit in each of those tiers. Returns the tile and the updated counts.
    """
    offs_t = t0 + tl.arange(0, TS)
    offs_c = tl.arange(0, D)
    # Scalar block base pointers, 32-bit offsets inside the block: one 64-bit add per element.
    sm = tl.load((sm_ptr + blk * (P * D)) + (offs_t[:, None] * D + offs_c[None, :])).to(tl.int32)
    db = tl.load((dig_ptr + blk * (P * D // 4)) + (offs_t[:, None] * (D // 4) + (offs_c[None, :] >> 2))).to(tl.int32)
    d1 = (db >> ((offs_c[None, :] & 3) * 2)) & 3
    m1 = d1 == 3
    r2, n = _rank(m1, TS, D, RANK)
    r2 += c2
    c2 += n
    t2 = tl.load((tail_ptr + s2) + (r2 >> 2), mask=m1, other=0).to(tl.int32)
    d2 = (t2 >> ((r2 & 3) * 2)) & 3
    m2 = m1 & (d2 == 3)
    r3, n = _rank(m2, TS, D, RANK)
    r3 += c3
    c3 += n
    t3 = tl.load((tail_ptr + s3) + (r3 >> 2), mask=m2, other=0).to(tl.int32)
    d3 = (t3 >> ((r3 & 3) * 2)) & 3
    m3 = m2 & (d3 == 3)
    r4, n = _rank(m3, TS, D, RANK)
    r4 += c4
    c4 += n
    e4 = tl.load((tail_ptr + s4) + r4, mask=m3, other=0).to(tl.int32)
    e = tl.where(m1, tl.where(m2, tl.where(m3, e4, top - 6 - d3), top - 3 - d2), top - d1)
    bits = ((sm & 0x80) << 8) | ((e & 0xFF) << 7) | (sm & 0x7F)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True), c2, c3, c4


@triton.jit
def _block_starts(top_ptr, meta_ptr, blk, D: tl.constexpr):
    top = tl.load(top_ptr + blk * D + tl.arange(0, D)).to(tl.int32)[None, :]
    s2 = tl.load(meta_ptr + blk * 4)  # int32: PageStore keeps the tail stream under 2**31 bytes
    s3 = s2 + (tl.load(meta_ptr + blk * 4 + 1) + 3) // 4
    s4 = s3 + (tl.load(meta_ptr + blk * 4 + 2) + 3) // 4
    return top, s2, s3, s4


@triton.jit
def _dot(a, b, F32: tl.constexpr):
    # Triton 3.6's interpreter computes bf16 tl.dot wrongly (seen here: 1e10 for unit inputs); both
    # operands hold bf16 values, so an exact fp32 product gives the same numbers there.
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _softmax_step(q, k, v, valid, m_i, l_i, acc, qk_scale, F32: tl.constexpr):
    s = _dot(q, tl.trans(k), F32) * qk_scale  # [GP, P], log2 units
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a fully masked tile so far: no NaN
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(tl.bfloat16), v, F32)
    return m_new, l_i, acc


@triton.jit
def _kv_decode_split_kernel(
    q_ptr, lens_ptr, starts_ptr,
    k_sm, k_dig, k_top, k_meta, k_tail, k_raw,
    v_sm, v_dig, v_top, v_meta, v_tail, v_raw,
    m_out, l_out, acc_out,
    qk_scale, H, K_CAP, V_CAP, PAGES_PER_SPLIT, S,
    G: tl.constexpr, GP: tl.constexpr, P: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    F32: tl.constexpr, RANK: tl.constexpr, TS: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    L = tl.load(lens_ptr + b)
    S0 = tl.load(starts_ptr + b)  # tokens before S0 are masked (left padding)
    n_full = L // P
    n_total = (L + P - 1) // P
    j0 = split * PAGES_PER_SPLIT
    j1 = tl.minimum(j0 + PAGES_PER_SPLIT, n_total)
    offs_g = tl.arange(0, GP)
    offs_d = tl.arange(0, D)
    offs_v = tl.arange(0, DV)
    offs_t = tl.arange(0, P)
    q = tl.load(q_ptr + ((b * H + h) * G + offs_g)[:, None] * D + offs_d[None, :], mask=offs_g[:, None] < G, other=0.0)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DV], tl.float32)
    offs_ts = tl.arange(0, TS)
    for j in range(j0, tl.minimum(j1, n_full)):
        kblk = ((b * H + h) * K_CAP + j).to(tl.int64)
        vblk = ((b * H + h) * V_CAP + j).to(tl.int64)
        ktop, ks2, ks3, ks4 = _block_starts(k_top, k_meta, kblk, D)
        vtop, vs2, vs3, vs4 = _block_starts(v_top, v_meta, vblk, DV)
        kc2 = tl.zeros([], tl.int32)
        kc3 = tl.zeros([], tl.int32)
        kc4 = tl.zeros([], tl.int32)
        vc2 = tl.zeros([], tl.int32)
        vc3 = tl.zeros([], tl.int32)
        vc4 = tl.zeros([], tl.int32)
        for t0 in range(0, P, TS):  # sub-tiles of TS tokens keep the decode in registers
            kb, kc2, kc3, kc4 = _decode_rows(k_sm, k_dig, k_tail, kblk, t0, ktop, ks2, ks3, ks4, kc2, kc3, kc4,
                                             P, TS, D, RANK)
            vb, vc2, vc3, vc4 = _decode_rows(v_sm, v_dig, v_tail, vblk, t0, vtop, vs2, vs3, vs4, vc2, vc3, vc4,
                                             P, TS, DV, RANK)
            m_i, l_i, acc = _softmax_step(q, kb, vb, (j * P + t0 + offs_ts) >= S0, m_i, l_i, acc, qk_scale, F32)
    if (n_full >= j0) & (n_full < j1):  # this split holds the raw, unfilled page
        valid = (offs_t < (L - n_full * P)) & ((n_full * P + offs_t) >= S0)
        raw = (b * H + h).to(tl.int64) * P
        kb = tl.load(k_raw + (raw + offs_t[:, None]) * D + offs_d[None, :], mask=valid[:, None], other=0.0)
        vb = tl.load(v_raw + (raw + offs_t[:, None]) * DV + offs_v[None, :], mask=valid[:, None], other=0.0)
        m_i, l_i, acc = _softmax_step(q, kb, vb, valid, m_i, l_i, acc, qk_scale, F32)
    o = pid_bh * S + split
    tl.store(m_out + o * GP + offs_g, m_i)
    tl.store(l_out + o * GP + offs_g, l_i)
    tl.store(acc_out + (o * GP + offs_g)[:, None] * DV + offs_v[None, :], acc)


@triton.jit
def _kv_combine_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, S, G: tl.constexpr, GP: tl.constexpr, DV: tl.constexpr):
    pid_bh = tl.program_id(0)
    offs_g = tl.arange(0, GP)
    offs_v = tl.arange(0, DV)
    mx = tl.full([GP], float("-inf"), tl.float32)
    for s in range(0, S):
        mx = tl.maximum(mx, tl.load(m_ptr + (pid_bh * S + s) * GP + offs_g))
    num = tl.zeros([GP, DV], tl.float32)
    den = tl.zeros([GP], tl.float32)
    for s in range(0, S):
        o = pid_bh * S + s
        w = tl.exp2(tl.load(m_ptr + o * GP + offs_g) - mx)
        w = tl.where(mx == float("-inf"), 0.0, w)
        den += w * tl.load(l_ptr + o * GP + offs_g)
        num += w[:, None] * tl.load(acc_ptr + (o * GP + offs_g)[:, None] * DV + offs_v[None, :])
    out = num / den[:, None]
    tl.store(out_ptr + (pid_bh * G + offs_g)[:, None] * DV + offs_v[None, :], out.to(tl.bfloat16),
             mask=offs_g[:, None] < G)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # interpreter: a small number still exercises several splits


def _planes(st, name: str):
    for a in ("sm", "dig", "top", "meta", "raw"):
        if not getattr(st, a).is_contiguous():
            raise FormatError(f"{name}.{a} must be contiguous")
    tail = st.tail if st.tail.numel() else torch.zeros(1, dtype=torch.uint8, device=st.device)
    return st.sm, st.dig, st.top, st.meta, tail, st.raw


# q [B, Hq, D] bf16; k_store/v_store PageStores with B sequences, H KV heads (Hq = G*H); lens [B] int (tokens per
# sequence); starts [B] int or None (tokens before it are masked) -> out [B, Hq, DV] bf16
def decode_attention_triton(q, k_store, v_store, lens, scale=None, num_splits=None, rank_mode=1, num_warps=4,
                            sub_tile=16, starts=None):
    b, hq, d = q.shape
    h, p, dv = k_store.heads, k_store.page, v_store.head_dim
    if q.dtype != torch.bfloat16:
        raise FormatError(f"q must be bf16, got {q.dtype}")
    if k_store.head_dim != d or hq % h or k_store.batch != b or v_store.batch != b or v_store.heads != h:
        raise FormatError(f"q {tuple(q.shape)} does not match the KV stores (B={k_store.batch}, H={h}, D={k_store.head_dim})")
    if v_store.page != p or d & (d - 1) or dv & (dv - 1) or p & (p - 1) or p < 16 or d < 16 or dv < 16:
        raise FormatError(f"page {p}, head dims {d}/{dv} must be powers of two >= 16 (and pages equal)")
    if sub_tile < 16 or sub_tile & (sub_tile - 1):
        raise FormatError(f"sub_tile {sub_tile} must be a power of two >= 16")
    g = hq // h
    gp = max(16, triton.next_power_of_2(g))
    lens = lens.to(device=q.device, dtype=torch.int32).contiguous()
    starts = (torch.zeros_like(lens) if starts is None else starts.to(device=q.device, dtype=torch.int32)).contiguous()
    dev = q.device
    max_pages = (k_store.max_len + p - 1) // p  # a host int: no sync, so CUDA graphs can capture this
    if num_splits is None:
        num_splits = max(1, min(max_pages, math.ceil(2 * _sm_count(dev) / (b * h))))
    pages_per_split = max(1, math.ceil(max_pages / num_splits))
    num_splits = max(1, math.ceil(max_pages / pages_per_split))
    m = torch.empty(b * h * num_splits * gp, dtype=torch.float32, device=dev)
    l_ = torch.empty_like(m)
    acc = torch.empty(b * h * num_splits * gp * dv, dtype=torch.float32, device=dev)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    _kv_decode_split_kernel[(b * h, num_splits)](
        q.contiguous(), lens, starts,
        *_planes(k_store, "k_store"), *_planes(v_store, "v_store"),
        m, l_, acc,
        scale * 1.4426950408889634, h, k_store.cap, v_store.cap, pages_per_split, num_splits,
        G=g, GP=gp, P=p, D=d, DV=dv, F32=_interpreting(), RANK=rank_mode, TS=min(sub_tile, p), num_warps=num_warps,
    )
    out = torch.empty(b, hq, dv, dtype=torch.bfloat16, device=dev)
    _kv_combine_kernel[(b * h,)](m, l_, acc, out, num_splits, G=g, GP=gp, DV=dv, num_warps=4)
    return out


@triton.jit
def _bf16_pages_split_kernel(
    q_ptr, k_ptr, v_ptr, m_out, l_out, acc_out, qk_scale, H, T, PAGES_PER_SPLIT, S,
    G: tl.constexpr, GP: tl.constexpr, P: tl.constexpr, D: tl.constexpr, F32: tl.constexpr,
):
    """The split kernel's skeleton over plain bf16 [B, H, T, D] keys and values (a benchmark baseline)."""
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    n_total = tl.cdiv(T, P)
    j0 = split * PAGES_PER_SPLIT
    j1 = tl.minimum(j0 + PAGES_PER_SPLIT, n_total)
    offs_g = tl.arange(0, GP)
    offs_d = tl.arange(0, D)
    offs_t = tl.arange(0, P)
    q = tl.load(q_ptr + ((b * H + h) * G + offs_g)[:, None] * D + offs_d[None, :], mask=offs_g[:, None] < G, other=0.0)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    base = (b * H + h).to(tl.int64) * T
    for j in range(j0, j1):
        tok = j * P + offs_t
        valid = tok < T
        kb = tl.load(k_ptr + (base + tok)[:, None] * D + offs_d[None, :], mask=valid[:, None], other=0.0)
        vb = tl.load(v_ptr + (base + tok)[:, None] * D + offs_d[None, :], mask=valid[:, None], other=0.0)
        m_i, l_i, acc = _softmax_step(q, kb, vb, valid, m_i, l_i, acc, qk_scale, F32)
    o = pid_bh * S + split
    tl.store(m_out + o * GP + offs_g, m_i)
    tl.store(l_out + o * GP + offs_g, l_i)
    tl.store(acc_out + (o * GP + offs_g)[:, None] * D + offs_d[None, :], acc)


# q [B, Hq, D] bf16; k, v [B, H, T, D] bf16 contiguous -> [B, Hq, D] bf16 (benchmark baseline only)
def decode_attention_bf16_pages(q, k, v, page=64, scale=None, num_splits=None, num_warps=4):
    b, hq, d = q.shape
    _, h, t, _ = k.shape
    g = hq // h
    gp = max(16, triton.next_power_of_2(g))
    dev = q.device
    max_pages = triton.cdiv(t, page)
    if num_splits is None:
        num_splits = max(1, min(max_pages, math.ceil(2 * _sm_count(dev) / (b * h))))
    pages_per_split = max(1, math.ceil(max_pages / num_splits))
    num_splits = max(1, math.ceil(max_pages / pages_per_split))
    m = torch.empty(b * h * num_splits * gp, dtype=torch.float32, device=dev)
    l_ = torch.empty_like(m)
    acc = torch.empty(b * h * num_splits * gp * d, dtype=torch.float32, device=dev)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    _bf16_pages_split_kernel[(b * h, num_splits)](
        q.contiguous(), k, v, m, l_, acc, scale * 1.4426950408889634, h, t, pages_per_split, num_splits,
        G=g, GP=gp, P=page, D=d, F32=_interpreting(), num_warps=num_warps,
    )
    out = torch.empty(b, hq, d, dtype=torch.bfloat16, device=dev)
    _kv_combine_kernel[(b * h,)](m, l_, acc, out, num_splits, G=g, GP=gp, DV=d, num_warps=4)
    return out
