"""Triton helpers that decode ``fixed12`` plane words, shared by every Triton fused-linear kernel.

Decode works on 32-bit words (SWAR, 4 weights an operation): a code word holds 8 nibbles, the
low nibbles of its 4 bytes are 4 weights of the group's first half, the high nibbles the same 4
positions of the second half, so no interleave is needed. ``hi = (n & 8) << 4 | (n & 7) + base``
runs on all 4 bytes at once; each weight's fp32 bits are then ``hi << 24 | lo << 16`` (a bf16
widened to fp32 is exact). ``PRMT`` helpers use ``prmt.b32`` on the GPU and shifts and masks under
the interpreter (which cannot run inline PTX).

Exceptions (weights outside the 16-exponent window) are a sparse correction: the programs that own
a row tile add ``x[col] * (true - placeholder)`` for its exceptions, found through a per-row pointer
array built once a matrix (``fixed12.exceptions.prepare``), a chunk of them a round, the rounds
shared among the tile's split-K programs.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def hi_bytes(n, b4):
    # 4 hi bytes from 4 codes (one a byte, values 0..15): sign bit to bit 7, offset + base below.
    return ((n & 0x08080808) << 4) | ((n & 0x07070707) + b4)


@triton.jit
def f32_bits(h, lo, T: tl.constexpr):
    # fp32 bits (hi << 24 | lo << 16) of the weight in byte T of the hi word h and lo word lo.
    if T == 0:
        r = (h << 24) | ((lo & 0xFF) << 16)
    elif T == 1:
        r = ((h << 16) & 0xFF000000) | ((lo << 8) & 0x00FF0000)
    elif T == 2:
        r = ((h << 8) & 0xFF000000) | (lo & 0x00FF0000)
    else:
        r = (h & 0xFF000000) | ((lo >> 8) & 0x00FF0000)
    return r


@triton.jit
def exc_rows(rowptr_ptr, pid_n, N, BN: tl.constexpr):
    # the exceptions e0..e1 of weight rows pid_n * BN ..
    return tl.load(rowptr_ptr + pid_n * BN), tl.load(rowptr_ptr + tl.minimum(pid_n * BN + BN, N))


@triton.jit
def exc_chunk(eidx_ptr, ehi_ptr, lo_ptr, base, K, stride_lo, e, em):
    # exceptions e (mask em): weight rows, columns and true and decoded (placeholder) fp32 values;
    # every exception's loads in one go (one round of dependent loads a chunk, not one an exception)
    # the index's own width (int32 where the matrix has < 2^31 weights): a 64-bit division is a
    # software call, 15-20% of an exception step's instructions (sm_90 SASS, 2026-12-06)
    idx = tl.load(eidx_ptr + e, mask=em, other=0)
    r = idx // K
    c = idx - r * K
    th = tl.load(ehi_ptr + e, mask=em, other=0).to(tl.uint32)
    lo = tl.load(lo_ptr + r.to(tl.int64) * stride_lo + c, mask=em, other=0).to(tl.uint32)
    tv = ((th << 24) | (lo << 16)).to(tl.float32, bitcast=True)
    pv = ((((th & 0x80) | base) << 24) | (lo << 16)).to(tl.float32, bitcast=True)
    return tl.where(em, r, -1), c, tv, pv


@triton.jit
def exception_delta(rowptr_ptr, eidx_ptr, ehi_ptr, lo_ptr, xrow, rn, base, pid_n, N, K, stride_lo, BN: tl.constexpr,
                    part, parts):
    # [BN] fp32: sum over the row tile's exceptions of x[col] * (true - placeholder), for one x row,
    # E a round, each summed onto its row by a one-hot mask. Program `part` of `parts` (the tile's
    # split-K programs) takes rounds part, part + parts, ... (a share each; no integer division).
    E: tl.constexpr = 2048 // BN
    delta = tl.zeros([BN], dtype=tl.float32)
    e0, e1 = exc_rows(rowptr_ptr, pid_n, N, BN)
    for es in range(e0 + part * E, e1, parts * E):
        e = es + tl.arange(0, E)
        em = e < e1
        r, c, tv, pv = exc_chunk(eidx_ptr, ehi_ptr, lo_ptr, base, K, stride_lo, e, em)
        xv = tl.load(xrow + c, mask=em, other=0.0).to(tl.float32)
        d = xv * tv - xv * pv
        delta += tl.sum(tl.where(rn.to(tl.int64)[:, None] == r[None, :], d[None, :], 0.0), axis=1)
    return delta


@triton.jit
def exception_delta_tile(rowptr_ptr, eidx_ptr, ehi_ptr, lo_ptr, x_ptr, rn, rm, mmask, stride_xm, base, pid_n,
                          N, K, stride_lo, BN: tl.constexpr, BM: tl.constexpr, part, parts):
    # [BN, BM] fp32: like exception_delta, for BM x rows at once (E a round: [BN, E, BM] at most 4096).
    E: tl.constexpr = 4096 // (BN * BM) if BN * BM < 4096 else 1
    delta = tl.zeros([BN, BM], dtype=tl.float32)
    e0, e1 = exc_rows(rowptr_ptr, pid_n, N, BN)
    for es in range(e0 + part * E, e1, parts * E):
        e = es + tl.arange(0, E)
        em = e < e1
        r, c, tv, pv = exc_chunk(eidx_ptr, ehi_ptr, lo_ptr, base, K, stride_lo, e, em)
        xv = tl.load(x_ptr + rm[None, :] * stride_xm + c[:, None], mask=em[:, None] & mmask[None, :],
                     other=0.0).to(tl.float32)  # [E, BM]
        d = xv * tv[:, None] - xv * pv[:, None]
        hit = rn.to(tl.int64)[:, None] == r[None, :]  # [BN, E]
        delta += tl.sum(tl.where(hit[:, :, None], d[None, :, :], 0.0), axis=1)
    return delta


@triton.jit
def hi_words(cw, b4):
    # hi bytes of a code word's two halves: low nibbles (first half) and high nibbles (second half)
    ha = ((cw << 4) & 0x80808080) | ((cw & 0x07070707) + b4)
    hb = (cw & 0x80808080) | (((cw >> 4) & 0x07070707) + b4)
    return ha, hb


@triton.jit
def gm_offsets(rn, N, stride_code, stride_lo, G: tl.constexpr, EVEN: tl.constexpr):
    # Offsets of a group-major [G, BN, 8] word tile in the code and lo planes (as int32 words),
    # and its row mask. EVEN: rows past N read row N-1 again (no masks; never stored).
    gi = tl.arange(0, G)[:, None, None]
    wi = tl.arange(0, 8)[None, None, :]
    if EVEN:
        r3 = tl.minimum(rn, N - 1)[None, :, None]
    else:
        r3 = rn[None, :, None]
    return r3 * stride_code + gi * 8 + wi, r3 * stride_lo + gi * 16 + wi, (rn < N)[None, :, None]


@triton.jit
def gm_planes(code_ptr, lo_ptr, code_off, lo_off, kb, lmask, BK: tl.constexpr, EVEN: tl.constexpr):
    # One step's plane words (code, lo of the first and second half) as uint32 tiles.
    kw = tl.multiple_of(kb // 8, BK // 8)
    kl = tl.multiple_of(kb // 4, BK // 4)
    if EVEN:
        cw = tl.load(code_ptr + code_off + kw)
        la = tl.load(lo_ptr + lo_off + kl)
        lb = tl.load(lo_ptr + lo_off + (kl + 8))
    else:
        cw = tl.load(code_ptr + code_off + kw, mask=lmask, other=0)
        la = tl.load(lo_ptr + lo_off + kl, mask=lmask, other=0)
        lb = tl.load(lo_ptr + lo_off + (kl + 8), mask=lmask, other=0)
    return (cw.to(tl.uint32, bitcast=True), la.to(tl.uint32, bitcast=True), lb.to(tl.uint32, bitcast=True))


@triton.jit
def prmt(a, b, SEL: tl.constexpr):
    # prmt.b32: each byte of the result picked from the 8 bytes of (b, a) by a nibble of SEL
    return tl.inline_asm_elementwise(f"prmt.b32 $0, $1, $2, {SEL};", "=r,r,r", [a, b], dtype=tl.uint32,
                                     is_pure=True, pack=1)


@triton.jit
def f32_lane(h, lo, t: tl.constexpr, PRMT: tl.constexpr):
    # fp32 of the weight in byte lane t (hi byte from h, low byte from lo): one prmt.b32 on the GPU
    # from lo with every other byte cleared, which supplies the two zero bytes.
    if PRMT:
        if t == 0:
            r = prmt(lo & 0x00FF00FF, h, 0x4011)
        elif t == 1:
            r = prmt(lo & 0xFF00FF00, h, 0x5100)
        elif t == 2:
            r = prmt(lo & 0x00FF00FF, h, 0x6211)
        else:
            r = prmt(lo & 0xFF00FF00, h, 0x7300)
    else:
        r = f32_bits(h, lo, t)
    return r.to(tl.float32, bitcast=True)


@triton.jit
def x_lane(x01, x23, t: tl.constexpr):
    # fp32 of x at byte lane t from two uint32 words holding bf16 pairs (x[0], x[1]) and (x[2], x[3])
    if t == 0:
        r = x01 << 16
    elif t == 1:
        r = x01 & 0xFFFF0000
    elif t == 2:
        r = x23 << 16
    else:
        r = x23 & 0xFFFF0000
    return r.to(tl.float32, bitcast=True)


@triton.jit
def bf16_lane(lo, h, t: tl.constexpr, PRMT: tl.constexpr):
    # bf16 of the weight in byte lane t: its hi byte (from h) over its lo byte (from lo); one
    # prmt.b32 on the GPU (the pair's upper half is dropped by the narrowing).
    if PRMT:
        r = tl.inline_asm_elementwise(f"prmt.b32 $0, $1, $2, {0x40 + 0x11 * t};", "=r,r,r", [lo, h],
                                      dtype=tl.uint32, is_pure=True, pack=1)
    else:
        r = (((h >> (8 * t)) & 0xFF) << 8) | ((lo >> (8 * t)) & 0xFF)
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def bf16x4(lo, h, PRMT: tl.constexpr):
    # [..., 4] bf16: the 4 weights of each word (byte lane t = column 4w + t), lanes joined in
    # order ([.., k, j] = lane 2k + j). (One packed asm call for all 4 lanes is wrong here: pack
    # groups a thread's elements in register order, which need not be a word's 4 lanes.)
    shp: tl.constexpr = (lo.shape[0], lo.shape[1], lo.shape[2], 4)
    l0 = bf16_lane(lo, h, 0, PRMT)
    l1 = bf16_lane(lo, h, 1, PRMT)
    l2 = bf16_lane(lo, h, 2, PRMT)
    l3 = bf16_lane(lo, h, 3, PRMT)
    return tl.reshape(tl.join(tl.join(l0, l2), tl.join(l1, l3)), shp)
