"""Triton kernels for decode attention straight from packed KV pages (kernels and thin launchers only).

Imported only when a CUDA tensor (or ``TRITON_INTERPRET=1``) asks for the fused path: ``import glyd``
and ``import glyd.kv`` never import Triton. The page code is documented in ``glyd.kv.pages`` and
``docs/format.md``; the pure-torch twin of these kernels is ``glyd.kv.attention.decode_attention_torch``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from glyd import _env
from glyd.errors import FormatError
from glyd.kernels._common import gdc_wait
from glyd.kernels._interp import isolated
from glyd.kernels._fields import check_int, ints
from glyd.kv.registry import KVKernel


@triton.jit
def _popc(x, INTERP: tl.constexpr):
    """Set bits of each int32 (libdevice ``popc``; a bit-twiddling twin under the interpreter)."""
    if INTERP:
        x = x - ((x >> 1) & 0x55555555)
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        return ((x * 0x01010101) >> 24) & 0xFF
    else:
        return libdevice.popc(x)


@triton.jit
def _excl_rows(n):
    """Exclusive prefix sum down each column of per-group counts ``n [R, W]``."""
    return tl.cumsum(n, 0) - n


@triton.jit
def _window(tailw_ptr, sw, base, has):
    """Per group: 16 consecutive 2-bit digits of a tier from digit ``base`` on (the tier starts at
    32-bit word ``sw``), from two aligned word loads."""
    wi = sw + (base >> 4)
    lo = tl.load(tailw_ptr + wi, mask=has, other=0).to(tl.uint32, bitcast=True).to(tl.uint64)
    hi = tl.load(tailw_ptr + wi + 1, mask=has, other=0).to(tl.uint32, bitcast=True).to(tl.uint64)
    both = lo | (hi << 32)
    return (both >> ((base & 15) * 2).to(tl.uint64)).to(tl.uint32).to(tl.int32, bitcast=True)


@triton.jit
def _value(j: tl.constexpr, wd, m1, win2, m2, win3, m3, raw4, smw, top_j, k2, k3, k4):
    """Value ``j`` of every group: its bf16 word and the running escape counts (``k2, k3``: bit offsets
    in the tier-2/3 windows; ``k4``: raw exponents so far, read from ``raw4 + k4``)."""
    d1 = (wd >> (2 * j)) & 3
    f1 = (m1 >> (2 * j)) & 1
    d2 = (win2 >> k2) & 3
    f2 = (m2 >> k2) & f1
    k2 += 2 * f1
    d3 = (win3 >> k3) & 3
    f3 = (m3 >> k3) & f2
    k3 += 2 * f2
    e4 = tl.load(raw4 + k4, mask=f3 != 0, other=0).to(tl.int32)
    k4 += f3
    off = d1 + tl.where(f1 != 0, d2 + tl.where(f2 != 0, d3, 0), 0)
    e = tl.where(f3 != 0, e4, top_j - off)
    s = (smw >> (8 * (j % 4))) & 0xFF
    bits = ((s & 0x80) << 8) | (e << 7) | (s & 0x7F)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True), k2, k3, k4


@triton.jit
def _group_values(wd, m1, win2, m2, win3, m3, raw4, sm0, sm1, sm2, sm3, tops):
    """The 16 values of every group, joined to ``[R, W, 2, 2, 2, 2]`` in channel order."""
    k2 = tl.zeros_like(wd)
    k3 = tl.zeros_like(wd)
    k4 = tl.zeros_like(wd)
    t0_, t1_, t2_, t3_, t4_, t5_, t6_, t7_, t8_, t9_, t10_, t11_, t12_, t13_, t14_, t15_ = tops
    v0, k2, k3, k4 = _value(0, wd, m1, win2, m2, win3, m3, raw4, sm0, t0_, k2, k3, k4)
    v1, k2, k3, k4 = _value(1, wd, m1, win2, m2, win3, m3, raw4, sm0, t1_, k2, k3, k4)
    v2, k2, k3, k4 = _value(2, wd, m1, win2, m2, win3, m3, raw4, sm0, t2_, k2, k3, k4)
    v3, k2, k3, k4 = _value(3, wd, m1, win2, m2, win3, m3, raw4, sm0, t3_, k2, k3, k4)
    v4, k2, k3, k4 = _value(4, wd, m1, win2, m2, win3, m3, raw4, sm1, t4_, k2, k3, k4)
    v5, k2, k3, k4 = _value(5, wd, m1, win2, m2, win3, m3, raw4, sm1, t5_, k2, k3, k4)
    v6, k2, k3, k4 = _value(6, wd, m1, win2, m2, win3, m3, raw4, sm1, t6_, k2, k3, k4)
    v7, k2, k3, k4 = _value(7, wd, m1, win2, m2, win3, m3, raw4, sm1, t7_, k2, k3, k4)
    v8, k2, k3, k4 = _value(8, wd, m1, win2, m2, win3, m3, raw4, sm2, t8_, k2, k3, k4)
    v9, k2, k3, k4 = _value(9, wd, m1, win2, m2, win3, m3, raw4, sm2, t9_, k2, k3, k4)
    v10, k2, k3, k4 = _value(10, wd, m1, win2, m2, win3, m3, raw4, sm2, t10_, k2, k3, k4)
    v11, k2, k3, k4 = _value(11, wd, m1, win2, m2, win3, m3, raw4, sm2, t11_, k2, k3, k4)
    v12, k2, k3, k4 = _value(12, wd, m1, win2, m2, win3, m3, raw4, sm3, t12_, k2, k3, k4)
    v13, k2, k3, k4 = _value(13, wd, m1, win2, m2, win3, m3, raw4, sm3, t13_, k2, k3, k4)
    v14, k2, k3, k4 = _value(14, wd, m1, win2, m2, win3, m3, raw4, sm3, t14_, k2, k3, k4)
    v15, k2, k3, k4 = _value(15, wd, m1, win2, m2, win3, m3, raw4, sm3, t15_, k2, k3, k4)
    # value j at index (j>>3, (j>>2)&1, (j>>1)&1, j&1): row-major order is channel order
    return tl.join(tl.join(tl.join(tl.join(v0, v8), tl.join(v4, v12)), tl.join(tl.join(v2, v10), tl.join(v6, v14))),
                   tl.join(tl.join(tl.join(v1, v9), tl.join(v5, v13)), tl.join(tl.join(v3, v11), tl.join(v7, v15))))


@triton.jit
def _decode_rows(sm_ptr, dig_ptr, tailw_ptr, tailb_ptr, blk, t0, tops, s2w, s3w, s4, c2, c3, c4,
                 P: tl.constexpr, R: tl.constexpr, D: tl.constexpr, INTERP: tl.constexpr):
    """Rows ``t0 .. t0+R`` of one packed block (page x head) -> bf16 [R, D], in registers.

    Works on groups of 16 values (one 32-bit word of tier-1 digits) as ``[R, W]`` tensors, ``W = D/16``,
    one per value position ``j`` of the group. ``tops`` is the block's 16 ``top`` tensors ``[1, W]``;
    ``s2w, s3w`` its tier-2/3 starts in 32-bit words of the tail, ``s4`` its tier-4 start in bytes;
    ``c2, c3, c4 [W]`` each column's escapes to tiers 2/3/4 before row ``t0`` (the column directory
    plus the rows above): the tiers list groups column by column, so no count crosses columns.
    Returns the tile and the updated counts. The torch twin is ``glyd.kv.pages.unpack_blocks_grouped``.
    """
    W: tl.constexpr = D // 16
    offs_r = t0 + tl.arange(0, R)
    offs_w = tl.arange(0, W)
    grp = offs_r[:, None] * W + offs_w[None, :]  # [R, W]: the group's word in the block's dig plane
    wd = tl.load((dig_ptr + blk * (P * W)) + grp)  # int32: 16 tier-1 digits
    smp = (sm_ptr + blk * (P * W * 4)) + grp * 4  # the group's 16 sign/mantissa bytes as 4 int32 words
    sm0 = tl.load(smp)
    sm1 = tl.load(smp + 1)
    sm2 = tl.load(smp + 2)
    sm3 = tl.load(smp + 3)
    m1 = wd & (wd >> 1) & 0x55555555  # bit 2j: value j escaped tier 1
    n1 = _popc(m1, INTERP)
    b2 = _excl_rows(n1) + c2[None, :]
    c2 += tl.sum(n1, 0)
    win2 = _window(tailw_ptr, s2w, b2, n1 > 0)
    m2 = win2 & (win2 >> 1) & 0x55555555
    m2 = tl.where(n1 >= 16, m2, m2 & ((1 << (2 * n1)) - 1))  # only the group's own n1 digits
    n2 = _popc(m2, INTERP)
    b3 = _excl_rows(n2) + c3[None, :]
    c3 += tl.sum(n2, 0)
    win3 = _window(tailw_ptr, s3w, b3, n2 > 0)
    m3 = win3 & (win3 >> 1) & 0x55555555
    m3 = tl.where(n2 >= 16, m3, m3 & ((1 << (2 * n2)) - 1))
    n3 = _popc(m3, INTERP)
    b4 = _excl_rows(n3) + c4[None, :]
    c4 += tl.sum(n3, 0)
    x = _group_values(wd, m1, win2, m2, win3, m3, tailb_ptr + (s4 + b4), sm0, sm1, sm2, sm3, tops)
    return tl.reshape(x, [R, D]), c2, c3, c4


@triton.jit
def _block_starts(top_ptr, meta_ptr, tail_ptr, blk, D: tl.constexpr):
    DB: tl.constexpr = (6 * (D // 16) + 3) // 4 * 4  # the directory's bytes (glyd.kv.pages.dir_bytes)
    W: tl.constexpr = D // 16
    tp = top_ptr + blk * D + tl.arange(0, W)[None, :] * 16
    tops = (tl.load(tp).to(tl.int32), tl.load(tp + 1).to(tl.int32), tl.load(tp + 2).to(tl.int32),
            tl.load(tp + 3).to(tl.int32), tl.load(tp + 4).to(tl.int32), tl.load(tp + 5).to(tl.int32),
            tl.load(tp + 6).to(tl.int32), tl.load(tp + 7).to(tl.int32), tl.load(tp + 8).to(tl.int32),
            tl.load(tp + 9).to(tl.int32), tl.load(tp + 10).to(tl.int32), tl.load(tp + 11).to(tl.int32),
            tl.load(tp + 12).to(tl.int32), tl.load(tp + 13).to(tl.int32), tl.load(tp + 14).to(tl.int32),
            tl.load(tp + 15).to(tl.int32))
    t0 = tl.load(meta_ptr + blk * 4)  # int32: PageStore keeps the tail stream under 2**31 bytes
    # column directory (uint16 little-endian, 3 a column): escapes to tiers 2/3/4 in the columns before
    dp = tail_ptr + t0 + tl.arange(0, W) * 6
    c2 = tl.load(dp).to(tl.int32) | (tl.load(dp + 1).to(tl.int32) << 8)
    c3 = tl.load(dp + 2).to(tl.int32) | (tl.load(dp + 3).to(tl.int32) << 8)
    c4 = tl.load(dp + 4).to(tl.int32) | (tl.load(dp + 5).to(tl.int32) << 8)
    s2w = (t0 + DB) >> 2
    s3w = s2w + (tl.load(meta_ptr + blk * 4 + 1) + 15) // 16
    s4 = (s3w + (tl.load(meta_ptr + blk * 4 + 2) + 15) // 16) * 4
    return tops, s2w, s3w, s4, c2, c3, c4


@triton.jit
def _dot(a, b, F32: tl.constexpr):
    # Triton 3.6's interpreter computes bf16 tl.dot wrongly (seen here: 1e10 for unit inputs); both
    # operands hold bf16 values, so an exact fp32 product gives the same numbers there.
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _scores(q, k, valid, m_i, l_i, qk_scale, QK_F32: tl.constexpr):
    """Online-softmax step, first half: probabilities (bf16) of a key tile, rescale factor, new state.

    ``QK_F32``: the scores as an exact fp32 product (``_dot``'s ``F32`` path). The launchers set it for
    head dims under 32: Triton 3.6 lowers a bf16 ``tl.dot`` whose reduction dim is 16 wrongly on sm_90
    when it gives both operands ``kWidth = 8`` (they come through shared memory): 4 lanes x 8 values
    span 32 of the dim, and the compiled sm_90 code reads half of the 16 channels twice and the other
    half not at all (0.58 relative error at head dim 16 on the H200, 2026-11-30;
    ``tests/kv/test_kv_kernel_layout.py`` checks the compiled dots).
    """
    s = _dot(q, tl.trans(k), QK_F32) * qk_scale  # [GP, P], log2 units
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a fully masked tile so far: no NaN
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    return p.to(tl.bfloat16), alpha, m_new, l_i


@triton.jit
def _softmax_step(q, k, v, valid, m_i, l_i, acc, qk_scale, QK_F32: tl.constexpr, F32: tl.constexpr):
    p, alpha, m_i, l_i = _scores(q, k, valid, m_i, l_i, qk_scale, QK_F32)
    acc = acc * alpha[:, None] + _dot(p, v, F32)
    return m_i, l_i, acc


@triton.jit
def _kept(valid_ptr, b, VS, pos, HAS_VALID: tl.constexpr):
    # the attention mask's verdict on positions pos of sequence b (a byte a position; past its row of VS:
    # masked); without a mask every position is kept (lens and starts still apply)
    keep = pos >= 0
    if HAS_VALID:
        keep = tl.load(valid_ptr + b.to(tl.int64) * VS + pos, mask=pos < VS, other=0) != 0
    return keep


# Shape-dependent ints are not specialised (no recompile per batch size or length).
@isolated
@triton.jit(do_not_specialize=["H", "K_CAP", "V_CAP", "PAGES_PER_SPLIT", "S", "VS"])
def _kv_decode_split_kernel(
    q_ptr, lens_ptr, starts_ptr, valid_ptr, VS,
    k_sm, k_dig, k_top, k_meta, k_tailw, k_tail, k_raw,
    v_sm, v_dig, v_top, v_meta, v_tailw, v_tail, v_raw,
    m_out, l_out, acc_out,
    qk_scale, H, K_CAP, V_CAP, PAGES_PER_SPLIT, S,
    G: tl.constexpr, GP: tl.constexpr, P: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    F32: tl.constexpr, TS: tl.constexpr, QK_F32: tl.constexpr, HAS_VALID: tl.constexpr,
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
        ktop, ks2, ks3, ks4, kc2, kc3, kc4 = _block_starts(k_top, k_meta, k_tail, kblk, D)
        vtop, vs2, vs3, vs4, vc2, vc3, vc4 = _block_starts(v_top, v_meta, v_tail, vblk, DV)
        for t0 in range(0, P, TS):  # sub-tiles of TS tokens keep the decode in registers
            kb, kc2, kc3, kc4 = _decode_rows(k_sm, k_dig, k_tailw, k_tail, kblk, t0, ktop, ks2, ks3, ks4,
                                             kc2, kc3, kc4, P, TS, D, F32)
            # the key tile's scores first, then the value tile: fewer tiles live at once
            pos = j * P + t0 + offs_ts
            keep = (pos >= S0) & _kept(valid_ptr, b, VS, pos, HAS_VALID)
            pb, alpha, m_i, l_i = _scores(q, kb, keep, m_i, l_i, qk_scale, QK_F32)
            vb, vc2, vc3, vc4 = _decode_rows(v_sm, v_dig, v_tailw, v_tail, vblk, t0, vtop, vs2, vs3, vs4,
                                             vc2, vc3, vc4, P, TS, DV, F32)
            acc = acc * alpha[:, None] + _dot(pb, vb, F32)
    if (n_full >= j0) & (n_full < j1):  # this split holds the raw, unfilled page
        pos = n_full * P + offs_t
        valid = (offs_t < (L - n_full * P)) & (pos >= S0) & _kept(valid_ptr, b, VS, pos, HAS_VALID)
        raw = (b * H + h).to(tl.int64) * P
        kb = tl.load(k_raw + (raw + offs_t[:, None]) * D + offs_d[None, :], mask=valid[:, None], other=0.0)
        vb = tl.load(v_raw + (raw + offs_t[:, None]) * DV + offs_v[None, :], mask=valid[:, None], other=0.0)
        m_i, l_i, acc = _softmax_step(q, kb, vb, valid, m_i, l_i, acc, qk_scale, QK_F32, F32)
    o = pid_bh * S + split
    tl.store(m_out + o * GP + offs_g, m_i)
    tl.store(l_out + o * GP + offs_g, l_i)
    tl.store(acc_out + (o * GP + offs_g)[:, None] * DV + offs_v[None, :], acc)


@isolated
@triton.jit(do_not_specialize=["S"])
def _kv_combine_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, S, G: tl.constexpr, GP: tl.constexpr, DV: tl.constexpr,
                       SB: tl.constexpr, DB: tl.constexpr, PDL: tl.constexpr = 0):
    """One program per (sequence x KV head, query head of the group, DB output channels): merge the
    splits' softmax states in one pass (a running maximum over chunks of SB splits; usually one chunk)."""
    if PDL & 1:  # launched while the split kernel runs: its state is complete and visible after the wait
        gdc_wait()
    pid_bh = tl.program_id(0)
    g = tl.program_id(1)
    offs_d = tl.program_id(2) * DB + tl.arange(0, DB)
    offs_s = tl.arange(0, SB)
    mx = tl.full([], float("-inf"), tl.float32)
    num = tl.zeros([DB], tl.float32)
    den = tl.zeros([], tl.float32)
    for s0 in range(0, S, SB):
        ss = s0 + offs_s
        o = pid_bh * S + ss
        m = tl.load(m_ptr + o * GP + g, mask=ss < S, other=float("-inf"))
        m_new = tl.maximum(mx, tl.max(m, 0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # every split empty so far: no NaN
        scale = tl.exp2(mx - m_use)
        w = tl.where(ss < S, tl.exp2(m - m_use), 0.0)
        a = tl.load(acc_ptr + (o * GP + g)[:, None] * DV + offs_d[None, :], mask=(ss < S)[:, None], other=0.0)
        num = num * scale + tl.sum(w[:, None] * a, 0)
        den = den * scale + tl.sum(w * tl.load(l_ptr + o * GP + g, mask=ss < S, other=0.0), 0)
        mx = m_new
    tl.store(out_ptr + (pid_bh * G + g) * DV + offs_d, (num / den).to(tl.bfloat16))


def _combine(m, l_, acc, out, b, h, num_splits, g, gp, dv, pdl=0):
    # one pass over up to 256 splits at a time, 32 channels a program: enough programs to fill the GPU
    # at one sequence (the earlier two-pass kernel, one program a query head, took 9-15 us there); pdl: the
    # split kernel's flags for its dependent (bit 1: launched early, so it waits first)
    sb = max(2, min(triton.next_power_of_2(num_splits), 256))
    db = min(32, dv)
    opts = {"launch_pdl": True} if pdl & 1 else {}
    _kv_combine_kernel[(b * h, g, dv // db)](m, l_, acc, out, num_splits, G=g, GP=gp, DV=dv, SB=sb, DB=db, PDL=pdl,
                                             num_warps=4, **opts)


def _interpreting() -> bool:
    return _env.interpreting()


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # interpreter: a small number still exercises several splits


def _planes(st, name: str):
    for a in ("sm", "dig", "top", "meta", "raw"):
        if not getattr(st, a).is_contiguous():
            raise FormatError(f"{name}.{a} must be contiguous")
    if st.page * st.head_dim % 64:
        raise FormatError(f"{name}: the kernel reads tier-1 digits as 32-bit words (page * head_dim % 64 == 0)")
    tail = st.tail
    if tail.numel() < st.tail_len + 8 or tail.numel() % 4:  # the window loads read past the used length
        tail = torch.zeros(st.tail_len + 16, dtype=torch.uint8, device=st.device)
        tail[: st.tail_len] = st.tail[: st.tail_len]
    return st.sm.view(torch.int32), st.dig.view(torch.int32), st.top, st.meta, tail.view(torch.int32), tail, st.raw


def qk_f32(d: int) -> bool:
    """Whether the kernels take the scores ``q @ k^T`` as an exact fp32 product rather than a bf16
    ``tl.dot``: under the interpreter (its bf16 dot is wrong) and for head dims under 32, where Triton
    3.6 miscompiles the bf16 dot on sm_90 (see ``_scores``)."""
    return _interpreting() or d < 32


def kernel_warps(num_warps: int, d: int, dv: int) -> int:
    """Warps for the decode kernel: at most one per column of 16-value groups (``D / 16``).

    With more warps than columns Triton 3.6 replicates the ``[sub-tile rows, D/16]`` group counts
    over the warps; the cap keeps ``tl.cumsum`` off replicated rows (``tests/kv/test_kv_kernel_layout.py``
    checks the compiled layouts). It was first blamed for the wrong outputs at head dim 16 on the
    H200; those were the K=16 score dot (``_scores``): 1 and 4 warps gave the same error there.
    """
    return max(1, min(num_warps, min(d, dv) // 16))


def _split_state(q: torch.Tensor, lens: torch.Tensor, starts, b: int, h: int, num_splits: int, gp: int, dv: int):
    """The launchers' shared set-up: lens and starts as int32 on q's device, and the splits' softmax
    states (m, l [B*H*splits*GP], acc [B*H*splits*GP*DV], fp32) that ``_combine`` merges."""
    dev = q.device
    if b * h * num_splits * gp * dv >= 2**31:  # the kernels index the state with 32-bit offsets
        raise FormatError(f"num_splits {num_splits} makes the splits' state {b} x {h} x {num_splits} x {gp} x {dv} "
                          f"(B x H x splits x GP x DV) = 2**31 or more elements; the kernels index it with 32 bits: "
                          f"take fewer splits")
    if num_splits > 65535:  # every kernel's grid takes the splits as its y (or z) dimension
        raise FormatError(f"at most 65,535 splits a launch, got {num_splits}")
    for name, t in (("lens", lens), ("starts", starts)):  # the kernels read t[b] for each sequence b
        if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (b,)):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise FormatError(f"{name} must be [{b}] (one a sequence), got {got}")
        if t is not None and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool):
            raise FormatError(f"{name} must hold integers (token counts), got {t.dtype}")  # .to(int32) would truncate
    lens = lens.to(device=dev, dtype=torch.int32).contiguous()
    starts = (torch.zeros_like(lens) if starts is None else starts.to(device=dev, dtype=torch.int32)).contiguous()
    m = torch.empty(b * h * num_splits * gp, dtype=torch.float32, device=dev)
    acc = torch.empty(b * h * num_splits * gp * dv, dtype=torch.float32, device=dev)
    return lens, starts, m, torch.empty_like(m), acc


def _valid_arg(valid, b: int, q: torch.Tensor) -> tuple[torch.Tensor, int, bool]:
    """``valid [B, S]`` (bool or uint8, one a position: 0 masks it) as the kernels read it: (its bytes, S,
    whether there is one). Without one, q's bytes stand in (never read). No host sync."""
    if valid is None:
        return q.view(torch.uint8), 0, False
    if valid.dim() != 2 or valid.shape[0] != b or valid.dtype not in (torch.bool, torch.uint8):
        raise FormatError(f"valid must be bool or uint8 [{b}, positions], got {valid.dtype} {tuple(valid.shape)}")
    v = valid.to(device=q.device).contiguous()
    return v.view(torch.uint8), v.shape[1], True


def _splits(max_pages: int, bh: int, device: torch.device, num_splits, programs_per_sm: int) -> tuple[int, int]:
    """(splits, pages per split): enough programs to fill the GPU ``programs_per_sm`` deep, and no more.

    Rounded down: rounding up launched up to ``bh - 1`` programs past ``programs_per_sm`` an SM, a partial
    second wave of whole splits where the table's count is what fits an SM (an H100, 2026-12-05: 3 splits of 86
    pages at 64 sequences x 4 heads took 972 us, 9 of 29 800 us; 2 of 128 form one wave).
    """
    if num_splits is not None:
        check_int("num_splits", num_splits, 1)
    if num_splits is None:
        check_int("programs_per_sm", programs_per_sm, 1)
        check_int("sequences x heads", bh, 1)
        num_splits = max(1, min(max_pages, programs_per_sm * _sm_count(device) // bh))
    pages_per_split = max(1, math.ceil(max_pages / num_splits))
    return max(1, math.ceil(max_pages / pages_per_split)), pages_per_split


# q [B, Hq, D] bf16; k_store/v_store PageStores with B sequences, H KV heads (Hq = G*H); lens [B] int (tokens per
# sequence); starts [B] int or None (tokens before it are masked); valid [B, S] bool/uint8 or None (position t of
# sequence b is attended only where t < S and valid[b, t]: the attention mask's row) -> out [B, Hq, DV] bf16.
# Tuning (measured on an H200, docs/kv.md): num_warps (capped by kernel_warps), sub_tile (tokens decoded at a
# time, >= 32 on the GPU), programs_per_sm (programs launched per SM), maxnreg (register cap: 128 lets four
# 4-warp programs share an SM; fastest in 9 of 10 measured shapes).
def decode_attention_triton(q, k_store, v_store, lens, scale=None, num_splits=None, num_warps=4,
                            sub_tile=32, starts=None, programs_per_sm=16, maxnreg=128, valid=None):
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
    ts = min(sub_tile, p)
    if ts < 32 and not _interpreting():
        # A 16-token sub-tile makes the probabilities-times-values dot reduce over 16 tokens: the bf16
        # tl.dot Triton 3.6 miscompiles on sm_90 (see _scores; wrong results on an H200, 2026-11-30).
        raise FormatError(f"the fused kernel needs sub-tiles (and pages) of >= 32 tokens on the GPU, got {ts}")
    g = hq // h
    gp = max(16, triton.next_power_of_2(g))
    num_warps = kernel_warps(num_warps, d, dv)
    dev = q.device
    max_pages = (k_store.max_len + p - 1) // p  # a host int: no sync, so CUDA graphs can capture this
    num_splits, pages_per_split = _splits(max_pages, b * h, dev, num_splits, programs_per_sm)
    lens, starts, m, l_, acc = _split_state(q, lens, starts, b, h, num_splits, gp, dv)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.contiguous()
    vbytes, vs, has_valid = _valid_arg(valid, b, q)
    _kv_decode_split_kernel[(b * h, num_splits)](
        q, lens, starts, vbytes, vs,
        *_planes(k_store, "k_store"), *_planes(v_store, "v_store"),
        m, l_, acc,
        scale * 1.4426950408889634, h, k_store.cap, v_store.cap, pages_per_split, num_splits,
        G=g, GP=gp, P=p, D=d, DV=dv, F32=_interpreting(), TS=ts, QK_F32=qk_f32(d), HAS_VALID=has_valid,
        num_warps=num_warps,
        **({} if maxnreg is None or _interpreting() else {"maxnreg": maxnreg}),
    )
    out = torch.empty(b, hq, dv, dtype=torch.bfloat16, device=dev)
    _combine(m, l_, acc, out, b, h, num_splits, g, gp, dv)
    return out


@dataclass(frozen=True)
class TieredTritonConfig:
    """Tuning of ``decode_attention_triton`` (measured on an H200, docs/kv.md); ``maxnreg`` 0: no cap."""

    num_warps: int = 4
    sub_tile: int = 32
    programs_per_sm: int = 16
    maxnreg: int = 128

    def __post_init__(self) -> None:
        ints(self, 1, 16, "num_warps")
        ints(self, 16, None, "sub_tile")
        ints(self, 1, None, "programs_per_sm")
        ints(self, 0, 255, "maxnreg")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.sub_tile < 16 or self.sub_tile & (self.sub_tile - 1):
            raise ValueError(f"num_warps {self.num_warps} (1-16, a power of two) or sub_tile {self.sub_tile} "
                             f"(a power of two >= 16) out of range")
        if self.programs_per_sm <= 0 or self.maxnreg < 0:
            raise ValueError(f"programs_per_sm must be positive and maxnreg >= 0, got {self.programs_per_sm}, "
                             f"{self.maxnreg}")


class TieredTritonKernel(KVKernel):
    """The kvtiered code's Triton decode kernel: pages and head dims powers of two >= 16 (pages >= 32 on the GPU)."""

    name = "kvtiered_attention_triton"
    code = "kvtiered"
    op = "attention"
    Config = TieredTritonConfig

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if not ok:
            return ok, why
        if device.type != "cuda" and not device.interpreting:
            return False, "needs a CUDA GPU (or Triton's interpreter)"
        p, d, dv = problem.page, problem.head_dim, problem.v_head_dim
        if p & (p - 1) or d & (d - 1) or dv & (dv - 1) or min(p, d, dv) < 16:
            return False, f"page {p} and head dims {d}/{dv} must be powers of two >= 16"
        if min(config.sub_tile, p) < 32 and not device.interpreting:
            return False, "sub-tiles (and pages) of >= 32 tokens on the GPU (Triton 3.6's K=16 dot on sm_90)"
        if problem.where != "store":
            return False, "reads PageStores only"
        return True, ""

    @classmethod
    def launch(cls, q, k_store, v_store, lens, scale, starts, num_splits, *, config, valid=None):
        return decode_attention_triton(q, k_store, v_store, lens, scale=scale, num_splits=num_splits, starts=starts,
                                       valid=valid,
                                       num_warps=config.num_warps, sub_tile=config.sub_tile,
                                       programs_per_sm=config.programs_per_sm, maxnreg=config.maxnreg or None)
