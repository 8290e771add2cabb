"""Decode attention from packed KV pages with explicit register layouts (Triton's Gluon; CUDA sm_80+).

The Triton kernel (``_triton.py``) lets Triton choose layouts: its decoded tiles go through shared
memory (one 16-bit store a value) to the tensor cores, its prefix sums take barriers, and each
value walks the escape tiers with its own running counts (52 instructions a value executed on the
H200). Here every layout is given, and the decode works on whole 16-value groups (one 32-bit word
of tier-1 digits, ``glyd.kv.pages``) in a thread's registers, 4 values at a time in byte lanes:

* Tiers 2 and 3: each group's escape digits are put back at their values' places, one escape a
  step for every group at once (``_expand``; steps = the most escapes a group of the chunk has).
  The offsets ``top - exponent`` are then sums of 2-bit digits in nibbles (``se``, ``so``).
* Raw exponents (tier 4): each value's rank among its group's raw values as a nibble (a prefix
  sum in nibbles), so that one ``prmt`` picks 4 values' raw bytes from the group's raw window.
* Per 4 values (``_quad``): the exponent bytes are ``top - offset`` bytewise, raw bytes swapped in
  by a ``prmt``, and the bf16 words assembled with 4 logic ops and 2 ``prmt``.

The decoded words are the MMA v2 A operands as they stand: no shared memory, no barriers.

* Scores ``S^T = K @ q^T``: K is the A operand ``[16 tokens, 128 k']``, q^T the B operand
  ``[k', heads]`` (the heads are the MMA's N: 8 or 16, so a group of 7 wastes little). The k'
  order is a fixed permutation of the channels (``_k_channel``) that gives each thread 2 whole
  groups of each of its tokens; q is loaded in the same order, which leaves the product unchanged.
* Values ``O^T += V^T @ P^T``: V^T is the A operand ``[128 rows, 16 tokens]``, row m is channel
  ``16 (m % 8) + m // 8``, so each thread holds whole groups of 4 tokens.
* Tokens: row (or k) x of a 16-token chunk is token ``_tok(x)``, which makes each thread's tokens of
  a group column consecutive, so a group's place in tiers 2-4 (its column's directory entry plus
  the escapes of the groups above it) is a scan in registers and across a few lanes.

One warp a program, one 16-token chunk of keys and values a loop step (a dynamic loop: small code),
an online softmax a chunk, and on sm_90+ a bulk L2 prefetch of the next chunk's fixed planes a step; programs split the pages of a (sequence, KV head) and
``_triton._kv_combine_kernel`` merges the splits, as for the Triton kernel. Page 64, head dim 128.
Gluon has no interpreter. The group decode's twin is ``glyd.kv.pages.unpack_blocks_swar`` (the same
steps in torch, checked bit for bit on the CPU, every bf16 pattern included); the attention's twin is
``glyd.kv.attention.decode_attention_torch``, and ``tests/kv/test_kv_gluon.py`` compares the kernel with
the reference on a GPU. Measured in
``benchmarks/RESULTS.md`` ("KV cache") and ``docs/kv.md``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from glyd.errors import FormatError
from glyd.kernels._gluon_bits import split16
from glyd.kernels._fields import flags, ints
from glyd.kv import _triton as T
from glyd.kv.registry import KVKernel

#: the one shape this kernel takes (others use the Triton kernel)
PAGE = 64
HEAD_DIM = 128
GP = 16  # the most query heads a KV head (the MMA's N: 8 or 16)


@gluon.jit
def _popc(x):
    return gl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [x], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _shr64(lo, hi, sh):
    # (hi:lo) >> sh, low 32 bits (funnel shift), sh in [0, 31]
    return gl.inline_asm_elementwise("shf.r.clamp.b32 $0, $1, $2, $3;", "=r,r,r,r", [lo, hi, sh], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _l2_prefetch(ptr, nbytes):
    # ask L2 for nbytes (a multiple of 16) from ptr (16-byte aligned), from lane 0 only (sm_90 bulk prefetch:
    # no registers, no shared memory)
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 l; mov.u32 l, %laneid; setp.eq.u32 p, l, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr, nbytes], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _excl_rows(n):
    # exclusive prefix sum down each column of per-group counts [16 tokens, 8 groups]
    return gl.associative_scan(n, 0, _add) - n


@gluon.jit
def _window(tailw_ptr, sw, base, has):
    # per group: 16 consecutive 2-bit digits of a tier from digit `base` on (the tier starts at 32-bit
    # word `sw` of the tail), from two aligned word loads
    wi = sw + (base >> 4)
    lo = gl.load(tailw_ptr + wi, mask=has, other=0)
    hi = gl.load(tailw_ptr + wi + 1, mask=has, other=0)
    return _shr64(lo, hi, (base & 15) * 2)


@gluon.jit
def _prmt(a, b, sel):
    # bytes of (b:a) picked by the selector's 4 low nibbles (PTX prmt)
    return gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, sel], dtype=gl.uint32,
                                     is_pure=True, pack=1)


@gluon.jit
def _expand(win, m, n_max):
    # each group's first popc(m) 2-bit digits of `win`, placed in order at m's set bits (bit 2j: value
    # j), every other value 0; n_max >= every group's popc(m). One escaped value a step.
    out = gl.zeros_like(m)
    for _ in range(n_max):
        low = m & (0 - m)
        out += (win & 3) * low
        win = win >> 2
        m = m ^ low
    return out


@gluon.jit
def _part1by1(x):
    # bit p of a 16-bit x -> bit 2p
    x = (x | (x << 8)) & 0x00FF00FF
    x = (x | (x << 4)) & 0x0F0F0F0F
    x = (x | (x << 2)) & 0x33333333
    return (x | (x << 1)) & 0x55555555


@gluon.jit
def _excl_nibbles(x):
    # exclusive prefix sum over the 8 nibbles of x
    x = x << 4
    x += x << 4
    x += x << 8
    return x + (x << 16)


@gluon.jit
def _quad(k: gl.constexpr, se, so, tw, sm, rq, fsel):
    # values 4k .. 4k+3 of every group, 4 at a time in byte lanes: exponent = top - offset (the offsets
    # as nibbles of se, so), or the raw exponent (rq's byte) where fsel's nibble picks it; then the
    # bf16 words. Returns 2 words of bf16 pairs (values 4k, 4k+1 and 4k+2, 4k+3).
    a = _prmt(se, so, gl.full(se.shape, k | ((4 + k) << 4) | (k << 8) | ((4 + k) << 12), gl.uint32, se.type.layout))
    off = (a & 0x00000F0F) | ((a >> 4) & 0x0F0F0000)
    e = ((tw | 0x80808080) - off) ^ (~tw & 0x80808080)  # bytewise tw - off, no borrow between bytes
    e = _prmt(e, rq, fsel)
    hi = (sm & 0x80808080) | ((e >> 1) & 0x7F7F7F7F)
    lo = (sm & 0x7F7F7F7F) | ((e << 7) & 0x80808080)
    return (_prmt(lo, hi, gl.full(se.shape, 0x5140, gl.uint32, se.type.layout)),
            _prmt(lo, hi, gl.full(se.shape, 0x7362, gl.uint32, se.type.layout)))


@gluon.jit
def _raw_wide(w4a, w4b, w4c, w4d, sel):
    # the raw bytes of ranks up to 15 (sel: 4 rank nibbles): two 8-byte halves, chosen by each nibble's bit 3
    s7 = sel & 0x7777
    hb = (sel >> 3) & 0x1111
    hb = (hb & 0x11) | ((hb & 0x1100) << 8)
    hb = ((hb | (hb << 4)) & 0x01010101) * 0xFF
    return (_prmt(w4a, w4b, s7) & ~hb) | (_prmt(w4c, w4d, s7) & hb)


@gluon.jit
def _group_values(se, so, tw0, tw1, tw2, tw3, sm0, sm1, sm2, sm3, rq0, rq1, rq2, rq3, flo, fhi):
    # the 16 values of every group as 4 more dims of 2 (j3, j2, j1, j0)
    p0, p1 = _quad(0, se, so, tw0, sm0, rq0, flo)
    p2, p3 = _quad(1, se, so, tw1, sm1, rq1, flo >> 16)
    p4, p5 = _quad(2, se, so, tw2, sm2, rq2, fhi)
    p6, p7 = _quad(3, se, so, tw3, sm3, rq3, fhi >> 16)
    v0, v1 = split16(p0)
    v2, v3 = split16(p1)
    v4, v5 = split16(p2)
    v6, v7 = split16(p3)
    v8, v9 = split16(p4)
    v10, v11 = split16(p5)
    v12, v13 = split16(p6)
    v14, v15 = split16(p7)
    # the innermost join pairs values j and j + 8, the outermost j and j + 1: dims (j3, j2, j1, j0)
    return gl.join(gl.join(gl.join(gl.join(v0, v8), gl.join(v4, v12)), gl.join(gl.join(v2, v10), gl.join(v6, v14))),
                   gl.join(gl.join(gl.join(v1, v9), gl.join(v5, v13)), gl.join(gl.join(v3, v11), gl.join(v7, v15))))


# One 16-token chunk of a packed block (page x head, 64 x 128) is decoded in four stages, each ending
# on the loads the next one needs (running the keys' and the values' stages in turn, to keep both
# chains of loads in flight, measured slower: more registers, spills). Group tensors are [16 tokens,
# 8 groups] in layout GL; c2, c3, c4 [1, 8]: each column's escapes to tiers 2, 3, 4 before the chunk.


@gluon.jit
def _stage1(sm_ptr, dig_ptr, tailw_ptr, blk, c, s2w, c2, GL: gl.constexpr, G3: gl.constexpr):
    # tier-1 digit words, the sign/mantissa words (loaded first: needed last), escape flags, and the
    # tier-2 windows
    t = 16 * c + gl.arange(0, 16, layout=gl.SliceLayout(1, GL))[:, None]
    g = gl.arange(0, 8, layout=gl.SliceLayout(0, GL))[None, :]
    w1 = gl.load(dig_ptr + blk * 512 + t * 8 + g).to(gl.uint32, bitcast=True)
    t3 = 16 * c + gl.arange(0, 16, layout=gl.SliceLayout(1, gl.SliceLayout(2, G3)))[:, None, None]
    g3 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, G3)))[None, :, None]
    q3 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, G3)))[None, None, :]
    smv = gl.load(sm_ptr + blk * 2048 + (t3 * 8 + g3) * 4 + q3)  # the group's 16 sign/mantissa bytes
    m1 = w1 & (w1 >> 1) & 0x55555555  # bit 2j: value j escaped tier 1
    n1 = _popc(m1)
    win2 = _window(tailw_ptr, s2w, _excl_rows(n1) + c2, n1 > 0).to(gl.uint32, bitcast=True)
    return w1, smv, m1, win2, c2 + gl.sum(n1, 0)[None, :], gl.max(gl.max(n1, 1), 0)


@gluon.jit
def _stage2(w1, m1, win2, n1max, tailw_ptr, s3w, c3):
    # tier-2 digits at their values, tier-2 escape flags, and the tier-3 windows
    w2 = _expand(win2, m1, n1max)
    m2 = w2 & (w2 >> 1) & 0x55555555
    n2 = _popc(m2)
    win3 = _window(tailw_ptr, s3w, _excl_rows(n2) + c3, n2 > 0).to(gl.uint32, bitcast=True)
    return w2, m2, win3, c3 + gl.sum(n2, 0)[None, :], gl.max(gl.max(n2, 1), 0)


@gluon.jit
def _stage3(m2, win3, n2max, tailw_ptr, s4, c4):
    # tier-3 digits at their values, raw flags, and the raw windows (8 bytes from each group's first raw
    # exponent)
    w3 = _expand(win3, m2, n2max)
    r = w3 & (w3 >> 1) & 0x55555555  # raw (tier-4) values
    n3 = _popc(r)
    b4 = s4 + _excl_rows(n3) + c4  # the group's first raw exponent: a byte of the tail
    ww = tailw_ptr + (b4 >> 2)
    x0 = gl.load(ww, mask=n3 > 0, other=0)
    x1 = gl.load(ww + 1, mask=n3 > 0, other=0)
    x2 = gl.load(ww + 2, mask=n3 > 4, other=0)
    return w3, r, n3, b4, x0, x1, x2, c4 + gl.sum(n3, 0)[None, :]




@gluon.jit
def _stage4(w1, w2, w3, r, n3, b4, x0, x1, x2, smv, tailw_ptr, tw0, tw1, tw2, tw3, GL: gl.constexpr):
    # -> bf16 [16 tokens, 8 groups, 16 values] as 11 dims of 2 (t3..t0, g2..g0, j3..j0)
    a, b = gl.split(gl.reshape(smv.to(gl.uint32, bitcast=True), [16, 8, 2, 2]))
    sm0, sm2 = gl.split(a)
    sm1, sm3 = gl.split(b)
    sm0 = gl.convert_layout(sm0, GL)
    sm1 = gl.convert_layout(sm1, GL)
    sm2 = gl.convert_layout(sm2, GL)
    sm3 = gl.convert_layout(sm3, GL)
    # offsets top - exponent as nibbles: even values in se, odd in so (9: raw)
    mk = 0x33333333
    se = (w1 & mk) + (w2 & mk) + (w3 & mk)
    so = ((w1 >> 2) & mk) + ((w2 >> 2) & mk) + ((w3 >> 2) & mk)
    # raw flags one nibble a value (values 0-7 in plo, 8-15 in phi): prmt selectors that take a value's
    # byte from the raw word where it is raw; and each value's rank among the group's raw values
    plo = _part1by1(r & 0xFFFF)
    phi = _part1by1(r >> 16)
    flo = (plo << 2) | 0x32103210
    fhi = (phi << 2) | 0x32103210
    rlo = _excl_nibbles(plo)
    rhi = _excl_nibbles(phi) + (_popc(r & 0xFFFF) * 0x11111111).to(gl.uint32, bitcast=True)
    sh = (b4 & 3) * 8
    w4a = _shr64(x0, x1, sh).to(gl.uint32, bitcast=True)
    w4b = _shr64(x1, x2, sh).to(gl.uint32, bitcast=True)
    if gl.max(gl.max(n3, 1), 0) <= 8:  # every group's raw exponents in one 8-byte window (all but rare data)
        rq0 = _prmt(w4a, w4b, rlo)
        rq1 = _prmt(w4a, w4b, rlo >> 16)
        rq2 = _prmt(w4a, w4b, rhi)
        rq3 = _prmt(w4a, w4b, rhi >> 16)
    else:
        ww = tailw_ptr + (b4 >> 2)
        x3 = gl.load(ww + 3, mask=n3 > 8, other=0)
        x4 = gl.load(ww + 4, mask=n3 > 12, other=0)
        w4c = _shr64(x2, x3, sh).to(gl.uint32, bitcast=True)
        w4d = _shr64(x3, x4, sh).to(gl.uint32, bitcast=True)
        rq0 = _raw_wide(w4a, w4b, w4c, w4d, rlo)
        rq1 = _raw_wide(w4a, w4b, w4c, w4d, rlo >> 16)
        rq2 = _raw_wide(w4a, w4b, w4c, w4d, rhi)
        rq3 = _raw_wide(w4a, w4b, w4c, w4d, rhi >> 16)
    x = _group_values(se, so, tw0, tw1, tw2, tw3, sm0, sm1, sm2, sm3, rq0, rq1, rq2, rq3, flo, fhi)
    return gl.reshape(x, [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])


@gluon.jit
def _chunk(sm_ptr, dig_ptr, tailw_ptr, tail_ptr, meta_ptr, top_ptr, blk, c, r2, r3, r4, GL: gl.constexpr,
           G3: gl.constexpr):
    # rows 16c .. 16c+15 of one packed block -> bf16 (11 dims of 2, _stage4); r2, r3, r4 [1, 8]: each
    # column's escapes to tiers 2, 3, 4 in the chunks above this one (updated)
    s2w, s3w, s4, c2, c3, c4, tw0, tw1, tw2, tw3 = _dir(meta_ptr, tail_ptr, top_ptr, blk, GL)
    w1, smv, m1, win2, d2, n1max = _stage1(sm_ptr, dig_ptr, tailw_ptr, blk, c, s2w, c2 + r2, GL, G3)
    w2, m2, win3, d3, n2max = _stage2(w1, m1, win2, n1max, tailw_ptr, s3w, c3 + r3)
    w3, r, n3, b4, x0, x1, x2, d4 = _stage3(m2, win3, n2max, tailw_ptr, s4, c4 + r4)
    x = _stage4(w1, w2, w3, r, n3, b4, x0, x1, x2, smv, tailw_ptr, tw0, tw1, tw2, tw3, GL)
    return x, d2 - c2, d3 - c3, d4 - c4


@gluon.jit
def _dir(meta_ptr, tail_ptr, top_ptr, blk, GL: gl.constexpr):
    # a block's tier starts (32-bit words of the tail for tiers 2-3, bytes for tier 4), its column
    # directory [1, 8] (escapes to tiers 2, 3, 4 in the columns before each; glyd.kv.pages) and its
    # `top` bytes as 4 int32 words a group column
    t0 = gl.load(meta_ptr + blk * 4)
    s2w = (t0 + 48) >> 2  # the directory of 8 columns is 48 bytes
    s3w = s2w + (gl.load(meta_ptr + blk * 4 + 1) + 15) // 16
    s4 = (s3w + (gl.load(meta_ptr + blk * 4 + 2) + 15) // 16) * 4
    dp = tail_ptr + t0 + gl.arange(0, 8, layout=gl.SliceLayout(0, GL))[None, :] * 6
    c2 = gl.load(dp).to(gl.int32) | (gl.load(dp + 1).to(gl.int32) << 8)
    c3 = gl.load(dp + 2).to(gl.int32) | (gl.load(dp + 3).to(gl.int32) << 8)
    c4 = gl.load(dp + 4).to(gl.int32) | (gl.load(dp + 5).to(gl.int32) << 8)
    tp = top_ptr + blk * 32 + gl.arange(0, 8, layout=gl.SliceLayout(0, GL))[None, :] * 4  # `top` as int32 words
    tw0 = gl.load(tp).to(gl.uint32, bitcast=True)
    tw1 = gl.load(tp + 1).to(gl.uint32, bitcast=True)
    tw2 = gl.load(tp + 2).to(gl.uint32, bitcast=True)
    tw3 = gl.load(tp + 3).to(gl.uint32, bitcast=True)
    return s2w, s3w, s4, c2, c3, c4, tw0, tw1, tw2, tw3


@gluon.jit
def _k_channel(kp):
    # channel of slot k' of the scores' reduction: k' bits (0..6) = j0, g1, g2, j1, j2, j3, g0
    j = (kp & 1) | ((kp >> 2) & 2) | ((kp >> 2) & 4) | ((kp >> 2) & 8)
    g = ((kp >> 6) & 1) | (kp & 6)
    return 16 * g + j


@gluon.jit
def _v_channel(m):
    # channel of row m of the value product (V^T's rows): group m % 8, value m // 8
    return 16 * (m % 8) + m // 8


@gluon.jit
def _tok(x):
    # token of page position x (a row of S^T, a k of the value product): in each 16, bits (0, 1, 2, 3)
    # hold token bits (1, 2, 3, 0), so that each thread's tokens of a chunk are consecutive
    return (x & 48) | ((x & 7) << 1) | ((x >> 3) & 1)


@gluon.jit
def _k_operand(x, AL: gl.constexpr):
    # decoded key chunk (t3..t0, g2..g0, j3..j0) -> A operand [16 rows (t0 t3 t2 t1), 128 k' (g0 j3 j2 j1 g2 g1 j0)]
    return gl.convert_layout(gl.reshape(gl.permute(x, [3, 0, 1, 2, 6, 7, 8, 9, 4, 5, 10]), [16, 128]), AL)


@gluon.jit
def _v_operand(x, AL: gl.constexpr):
    # decoded value chunk -> A operand of V^T [128 rows (j3 j2 j1 j0 g2 g1 g0), 16 k (t0 t3 t2 t1)]
    return gl.convert_layout(gl.reshape(gl.permute(x, [7, 8, 9, 10, 4, 5, 6, 3, 0, 1, 2]), [128, 16]), AL)


@gluon.jit
def _raw_k(k_raw, raw, c, valid_n, AL: gl.constexpr):
    # rows 16c.. of the unfilled page's keys as the A operand [16, 128 k']
    r = _tok(16 * c + gl.arange(0, 16, layout=gl.SliceLayout(1, AL)))[:, None]
    kk = _k_channel(gl.arange(0, 128, layout=gl.SliceLayout(0, AL)))[None, :]
    return gl.load(k_raw + (raw + r) * 128 + kk, mask=(r < valid_n) & (kk >= 0), other=0.0)


@gluon.jit
def _raw_v(v_raw, raw, c, valid_n, AL: gl.constexpr):
    # tokens 16c.. of the unfilled page's values as the A operand of V^T [128, 16]
    m = _v_channel(gl.arange(0, 128, layout=gl.SliceLayout(1, AL)))[:, None]
    r = _tok(16 * c + gl.arange(0, 16, layout=gl.SliceLayout(0, AL)))[None, :]
    return gl.load(v_raw + (raw + r) * 128 + m, mask=(r < valid_n) & (m >= 0), other=0.0)


@gluon.jit
def _softmax(s, tok0, S0, n_valid, vrow, VS, m_i, l_i, qk_scale, ML: gl.constexpr, BL: gl.constexpr,
             HAS_VALID: gl.constexpr):
    # online softmax over one chunk's scores S^T [16 tokens, GP]; tok0: the chunk's first token, n_valid:
    # the chunk's tokens held; vrow: the sequence's row of the attention mask (VS bytes, read when
    # HAS_VALID). Returns the probabilities (bf16, the value product's B operand), the rescale factor
    # and the new state.
    r = _tok(gl.arange(0, 16, layout=gl.SliceLayout(1, ML)))
    keep = (tok0 + r >= S0) & (r < n_valid)
    if HAS_VALID:
        keep = keep & (gl.load(vrow + tok0 + r, mask=keep & (tok0 + r < VS), other=0) != 0)
    s = gl.where(keep[:, None], s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 0))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # everything masked so far: no NaN
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[None, :])
    l_i = l_i * alpha + gl.sum(p, 0)
    return gl.convert_layout(p.to(gl.bfloat16), BL), alpha, m_new, l_i


@gluon.jit(do_not_specialize=["H", "K_CAP", "V_CAP", "PAGES_PER_SPLIT", "S", "VS"])
def _kv_gluon_kernel(
    q_ptr, lens_ptr, starts_ptr, valid_ptr, VS,
    k_sm, k_dig, k_top, k_meta, k_tailw, k_tail, k_raw,
    v_sm, v_dig, v_top, v_meta, v_tailw, v_tail, v_raw,
    m_out, l_out, acc_out,
    qk_scale, H, K_CAP, V_CAP, PAGES_PER_SPLIT, S,
    G: gl.constexpr, GP: gl.constexpr, GK: gl.constexpr, GK3: gl.constexpr, GV: gl.constexpr,
    GV3: gl.constexpr, ML: gl.constexpr, AL: gl.constexpr, BL: gl.constexpr, QL: gl.constexpr,
    PREFETCH: gl.constexpr = False, HAS_VALID: gl.constexpr = False,
):
    # S^T [64 tokens, GP heads] = K [64, 128] @ q^T and O^T [128, GP] += V^T [128, 64] @ P^T, 16 tokens a
    # chunk; the query heads are the MMA's N (GP = 8 or 16), keys and values its A operand
    pid_bh = gl.program_id(0)
    split = gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    L = gl.load(lens_ptr + b)
    S0 = gl.load(starts_ptr + b)  # tokens before S0 are masked (left padding)
    vrow = valid_ptr + b.to(gl.int64) * VS  # the attention mask's row (masked positions anywhere)
    n_full = L // 64
    n_total = (L + 63) // 64
    j0 = split * PAGES_PER_SPLIT
    j1 = gl.minimum(j0 + PAGES_PER_SPLIT, n_total)
    # q^T [128 k', GP] in the scores' k' order, heads past G zero
    qk = _k_channel(gl.arange(0, 128, layout=gl.SliceLayout(1, QL)))[:, None]
    qh = gl.arange(0, GP, layout=gl.SliceLayout(0, QL))[None, :]
    q = gl.load(q_ptr + ((b * H + h) * G + qh) * 128 + qk, mask=(qh < G) & (qk >= 0), other=0.0)
    qb = gl.convert_layout(q, BL)
    m_i = gl.full([GP], float("-inf"), gl.float32, gl.SliceLayout(0, ML))
    l_i = gl.zeros([GP], gl.float32, gl.SliceLayout(0, ML))
    acc = gl.zeros([128, GP], gl.float32, ML)
    zs = gl.zeros([16, GP], gl.float32, ML)
    zc = gl.zeros([1, 8], gl.int32, GK)
    zv = gl.zeros([1, 8], gl.int32, GV)
    kr2, kr3, kr4 = zc, zc, zc
    vr2, vr3, vr4 = zv, zv, zv
    # one 16-token chunk of keys and values a step (a dynamic loop keeps the code small): the escapes a
    # column has before the chunk are its directory entry plus the chunks above it in the page (kr*, vr*)
    it_end = gl.minimum(j1, n_full) * 4
    for it in range(j0 * 4, it_end):
        j = it // 4
        c = it % 4
        kblk = ((b * H + h) * K_CAP + j).to(gl.int64)
        vblk = ((b * H + h) * V_CAP + j).to(gl.int64)
        if PREFETCH:  # the next chunk's sign/mantissa and digit rows into L2 (the last step: its own again)
            nx = gl.minimum(it + 1, it_end - 1)
            kn = ((b * H + h) * K_CAP + nx // 4).to(gl.int64)
            vn = ((b * H + h) * V_CAP + nx // 4).to(gl.int64)
            _l2_prefetch(k_sm + kn * 2048 + (nx % 4) * 512, 2048)
            _l2_prefetch(k_dig + kn * 512 + (nx % 4) * 128, 512)
            _l2_prefetch(v_sm + vn * 2048 + (nx % 4) * 512, 2048)
            _l2_prefetch(v_dig + vn * 512 + (nx % 4) * 128, 512)
        first = c == 0
        kr2 = gl.where(first, 0, kr2)
        kr3 = gl.where(first, 0, kr3)
        kr4 = gl.where(first, 0, kr4)
        vr2 = gl.where(first, 0, vr2)
        vr3 = gl.where(first, 0, vr3)
        vr4 = gl.where(first, 0, vr4)
        x, kr2, kr3, kr4 = _chunk(k_sm, k_dig, k_tailw, k_tail, k_meta, k_top, kblk, c, kr2, kr3, kr4, GK, GK3)
        s = mma_v2(_k_operand(x, AL), qb, zs)
        p, alpha, m_i, l_i = _softmax(s, j * 64 + 16 * c, S0, 64, vrow, VS, m_i, l_i, qk_scale, ML, BL, HAS_VALID)
        x, vr2, vr3, vr4 = _chunk(v_sm, v_dig, v_tailw, v_tail, v_meta, v_top, vblk, c, vr2, vr3, vr4, GV, GV3)
        acc = mma_v2(_v_operand(x, AL), p, acc * alpha[None, :])
    if (n_full >= j0) & (n_full < j1):  # this split holds the raw, unfilled page
        raw = (b * H + h).to(gl.int64) * 64
        nv = L - n_full * 64
        for c in range(0, (nv + 15) // 16):
            s = mma_v2(_raw_k(k_raw, raw, c, nv, AL), qb, zs)
            p, alpha, m_i, l_i = _softmax(s, n_full * 64 + 16 * c, S0, nv - 16 * c, vrow, VS, m_i, l_i, qk_scale,
                                          ML, BL, HAS_VALID)
            acc = mma_v2(_raw_v(v_raw, raw, c, nv, AL), p, acc * alpha[None, :])
    o = pid_bh * S + split
    hh = gl.arange(0, GP, layout=gl.SliceLayout(0, ML))
    gl.store(m_out + o * GP + hh, m_i)
    gl.store(l_out + o * GP + hh, l_i)
    ch = _v_channel(gl.arange(0, 128, layout=gl.SliceLayout(1, ML)))[:, None]
    gl.store(acc_out + (o * GP + hh[None, :]) * 128 + ch, acc)


@functools.lru_cache(maxsize=None)
def layouts() -> dict:
    """The kernel's layouts (one warp): a chunk's groups [16 tokens, 8 groups] for keys (GK) and values
    (GV), the same with a group's 4 sign/mantissa words in registers (GK3, GV3), the MMA accumulator
    (ML), its A and B operands (AL, BL) and the q load (QL)."""
    # Blocked layouts (Triton's scan takes no other). Keys: lanes (g1, g2, t1, t2, t3) = the A operand's
    # lanes (k' bits 1-2, rows 0-2), registers g0, t0. Values: lanes (t2, t3, g0, g1, g2) = V^T's A
    # operand lanes (k bits 1-2, rows 0-2), registers t0, t1.
    def blk(spt, tpw, order):
        return gl.BlockedLayout(size_per_thread=spt, threads_per_warp=tpw, warps_per_cta=[1] * len(spt), order=order)

    mma = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    return {
        "GK": blk([2, 2], [8, 4], [1, 0]), "GK3": blk([2, 2, 4], [8, 4, 1], [2, 1, 0]),
        "GV": blk([4, 1], [4, 8], [0, 1]), "GV3": blk([4, 1, 4], [4, 8, 1], [2, 0, 1]),
        "ML": mma, "AL": gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2),
        "BL": gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2),
        "QL": blk([1, 1], [32, 1], [0, 1]),
    }


def _planes(st, name: str):
    # the Triton kernel's planes, with `top` read as int32 words (4 channels a word)
    sm, dig, top, meta, tailw, tail, raw = T._planes(st, name)
    return sm, dig, top.view(torch.int32), meta, tailw, tail, raw


def default_programs_per_sm(pages: int) -> int:
    """Programs launched per SM for ``pages`` = sequences x KV heads x pages a sequence (the longest).

    Measured on the H200, 132 SMs (benchmarks/RESULTS.md): from 2,048 to 4,096 pages, 8
    programs an SM (2-4 pages each, 1,024 programs: under one wave of 12 an SM) are 8-11% faster than
    32 (one page each, 1.3-2.6 waves); elsewhere 32 is the fastest or within 1-4%.

    >>> default_programs_per_sm(16 * 4 * 64), default_programs_per_sm(64 * 4 * 256)
    (8, 32)
    """
    return 8 if 1024 < pages <= 4096 else 32


# q [B, Hq, 128] bf16; k_store/v_store PageStores (page 64, head dim 128) with B sequences, H KV heads
# (Hq = G*H, G <= 16); lens [B] int; starts [B] int or None; valid [B, S] bool/uint8 or None (the attention
# mask's row: position t attended only where t < S and valid[b, t]) -> out [B, Hq, 128] bf16.
# Tuning (H200): programs_per_sm (programs launched per SM: splits of the pages; None:
# default_programs_per_sm), maxnreg (register cap: 168 lets 12 one-warp programs share an SM), prefetch
# (each loop step asks L2 for the next chunk's sign/mantissa and digit rows with a bulk prefetch: 3-5%
# faster from 16 sequences on; None: on where the GPU has it, sm_90+).
def decode_attention_gluon(q, k_store, v_store, lens, scale=None, num_splits=None, starts=None,
                           programs_per_sm=None, maxnreg=168, prefetch=None, valid=None):
    b, hq, d = q.shape
    h = k_store.heads
    if q.dtype != torch.bfloat16:
        raise FormatError(f"q must be bf16, got {q.dtype}")
    if k_store.batch != b or v_store.batch != b or v_store.heads != h or hq % h:
        raise FormatError(f"q {tuple(q.shape)} does not match the KV stores (B={k_store.batch}, H={h})")
    if (k_store.page, d, k_store.head_dim, v_store.head_dim, v_store.page) != (PAGE, HEAD_DIM, HEAD_DIM, HEAD_DIM, PAGE):
        raise FormatError(f"the Gluon kernel takes page {PAGE} and head dims {HEAD_DIM}: got page {k_store.page}, "
                          f"q {d}, keys {k_store.head_dim}, values {v_store.head_dim}")
    g = hq // h
    gp = 8 if g <= 8 else 16
    if g > 16:
        raise FormatError(f"the Gluon kernel takes at most {GP} query heads a KV head, got {g}")
    bulk = q.is_cuda and torch.cuda.get_device_capability(q.device)[0] >= 9  # cp.async.bulk.prefetch: sm_90+
    if prefetch is None:
        prefetch = bulk
    elif prefetch and not bulk:
        raise ValueError("prefetch=True needs a CUDA GPU of compute capability 9.0 or newer")
    dev = q.device
    max_pages = (k_store.max_len + PAGE - 1) // PAGE  # a host int: no sync, so CUDA graphs can capture this
    if programs_per_sm is None:
        programs_per_sm = default_programs_per_sm(b * h * max_pages)
    num_splits, pages_per_split = T._splits(max_pages, b * h, dev, num_splits, programs_per_sm)
    lens, starts, m, l_, acc = T._split_state(q, lens, starts, b, h, num_splits, gp, HEAD_DIM)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.contiguous()
    vbytes, vs, has_valid = T._valid_arg(valid, b, q)
    _kv_gluon_kernel[(b * h, num_splits)](
        q, lens, starts, vbytes, vs,
        *_planes(k_store, "k_store"), *_planes(v_store, "v_store"),
        m, l_, acc,
        scale * 1.4426950408889634, h, k_store.cap, v_store.cap, pages_per_split, num_splits,
        G=g, GP=gp, PREFETCH=bool(prefetch), HAS_VALID=has_valid, num_warps=1, **layouts(),
        **({} if maxnreg is None else {"maxnreg": maxnreg}),
    )
    out = torch.empty(b, hq, HEAD_DIM, dtype=torch.bfloat16, device=dev)
    T._combine(m, l_, acc, out, b, h, num_splits, g, gp, HEAD_DIM)
    return out


@dataclass(frozen=True)
class GluonConfig:
    """``programs_per_sm``: programs an SM (0: ``default_programs_per_sm``); ``maxnreg``: register cap
    (0: none); ``prefetch``: the sm_90 bulk L2 prefetch (None: where the GPU has it)."""

    programs_per_sm: int = 0
    maxnreg: int = 168
    prefetch: bool | None = None

    def __post_init__(self) -> None:
        ints(self, 0, None, "programs_per_sm")
        ints(self, 0, 255, "maxnreg")
        if self.prefetch is not None:
            flags(self, "prefetch")
        if self.programs_per_sm < 0 or self.maxnreg < 0:
            raise ValueError(f"programs_per_sm and maxnreg must be >= 0, got {self.programs_per_sm}, {self.maxnreg}")


class TieredGluonKernel(KVKernel):
    """The kvtiered code's Gluon decode kernel: CUDA sm_80+, pages of 64, head dim 128, <= 16 query heads a KV head."""

    name = "kvtiered_attention_gluon"
    code = "kvtiered"
    op = "attention"
    Config = GluonConfig

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if not ok:
            return ok, why
        if "gluon" not in device.features or (device.capability or (0, 0))[0] < 8:
            return False, "needs Gluon on a CUDA GPU of compute capability 8.0 or newer (no interpreter)"
        if (problem.page, problem.head_dim, problem.v_head_dim) != (PAGE, HEAD_DIM, HEAD_DIM) or problem.group > GP:
            return False, f"takes pages of {PAGE}, head dim {HEAD_DIM} and <= {GP} query heads a KV head"
        if problem.where != "store":
            return False, "reads PageStores only"
        return True, ""

    @classmethod
    def launch(cls, q, k_store, v_store, lens, scale, starts, num_splits, *, config, valid=None):
        return decode_attention_gluon(q, k_store, v_store, lens, scale=scale, num_splits=num_splits, starts=starts,
                                      valid=valid,
                                      programs_per_sm=config.programs_per_sm or None, maxnreg=config.maxnreg or None,
                                      prefetch=config.prefetch)
