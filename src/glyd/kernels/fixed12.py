"""Triton kernels for the ``fixed12`` layout: GPU unpack and the fused linear.

Decode works on 32-bit words (SWAR, 4 weights an operation): a code word holds 8 nibbles, the
low nibbles of its 4 bytes are 4 weights of the group's first half, the high nibbles the same 4
positions of the second half, so no interleave is needed. ``hi = (n & 8) << 4 | (n & 7) + base``
runs on all 4 bytes at once; each weight's fp32 bits are then ``hi << 24 | lo << 16`` (a bf16
widened to fp32 is exact). Plain Triton only, so ``TRITON_INTERPRET=1`` runs every kernel.

The tensor-core path for 2 to 64 activation rows (``_mma_kernel``) decodes byte tiles instead,
with the weights as the MMA's A operand: Triton then reads the raw planes from shared memory
straight into the operand registers and decodes them there (see the kernel's comment for the one
condition that keeps it so: a compile-time base).

Exceptions (weights outside the 16-exponent window) are a sparse correction inside the fused
kernel: the program that owns the row adds ``x[col] * (true - placeholder)`` for each of its
row range's exceptions, found through a per-row pointer array built once per matrix.
"""

from __future__ import annotations

import functools
import logging

import torch
import triton
import triton.language as tl

from glyd.codec import fixed12 as _codec
from glyd.codec.packed import Packed
from glyd.kernels import _common as C
from glyd.kernels._interp import isolated

log = logging.getLogger(__name__)

GROUP = _codec.GROUP


@triton.jit
def _hi_bytes(n, b4):
    # 4 hi bytes from 4 codes (one a byte, values 0..15): sign bit to bit 7, offset + base below.
    return ((n & 0x08080808) << 4) | ((n & 0x07070707) + b4)


@triton.jit
def _f32_bits(h, lo, T: tl.constexpr):
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
def _exception_delta(rowptr_ptr, eidx_ptr, ehi_ptr, lo_ptr, xrow, rn, base, pid_n, N, K, stride_lo, BN: tl.constexpr):
    # [BN] fp32: sum over this row tile's exceptions of x[col] * (true - placeholder), for one x row.
    delta = tl.zeros([BN], dtype=tl.float32)
    e0 = tl.load(rowptr_ptr + pid_n * BN)
    e1 = tl.load(rowptr_ptr + tl.minimum(pid_n * BN + BN, N))
    for e in range(e0, e1):
        idx = tl.load(eidx_ptr + e).to(tl.int64)
        r = idx // K
        col = idx - r * K
        th = tl.load(ehi_ptr + e).to(tl.uint32)
        lo = tl.load(lo_ptr + r * stride_lo + col).to(tl.uint32)
        tv = ((th << 24) | (lo << 16)).to(tl.float32, bitcast=True)
        pv = ((((th & 0x80) | base) << 24) | (lo << 16)).to(tl.float32, bitcast=True)
        xv = tl.load(xrow + col).to(tl.float32)
        delta += tl.where(rn.to(tl.int64) == r, xv * tv - xv * pv, 0.0)
    return delta


@triton.jit
def _fma_row(acc3, wa, wb, xrow, ka, K, ok):
    # One more x row on the decoded group-major tile (rows past M read as 0).
    xa = tl.load(xrow + ka, mask=(ka < K) & ok, other=0.0).to(tl.float32)
    xb = tl.load(xrow + ka + 32, mask=(ka + 32 < K) & ok, other=0.0).to(tl.float32)
    acc3 += wa * xa
    acc3 += wb * xb
    return acc3


@triton.jit
def _put_row(out2, ri, r: tl.constexpr, acc3, rowptr_ptr, eidx_ptr, ehi_ptr, lo_ptr, xrow, valid, rn, base, pid_n,
             pid_k, N, K, stride_lo, BN: tl.constexpr, HAS_EXC: tl.constexpr):
    # Row r of a multi-row FMA program's output tile: its accumulator summed, plus its exceptions
    # (only for a row that exists: the exception pass reads x[row] unmasked).
    acc1 = tl.sum(tl.sum(acc3, axis=2), axis=0)
    if HAS_EXC:
        if (pid_k == 0) & valid:
            acc1 += _exception_delta(rowptr_ptr, eidx_ptr, ehi_ptr, lo_ptr, xrow, rn, base, pid_n, N, K, stride_lo, BN)
    return tl.where(ri[:, None] == r, acc1[None, :], out2)


@triton.jit
def _exception_delta_tile(rowptr_ptr, eidx_ptr, ehi_ptr, lo_ptr, x_ptr, rn, rm, mmask, stride_xm, base, pid_n,
                          N, K, stride_lo, BN: tl.constexpr, BM: tl.constexpr):
    # [BN, BM] fp32: like _exception_delta, for BM x rows at once.
    delta = tl.zeros([BN, BM], dtype=tl.float32)
    e0 = tl.load(rowptr_ptr + pid_n * BN)
    e1 = tl.load(rowptr_ptr + tl.minimum(pid_n * BN + BN, N))
    for e in range(e0, e1):
        idx = tl.load(eidx_ptr + e).to(tl.int64)
        r = idx // K
        c = idx - r * K
        th = tl.load(ehi_ptr + e).to(tl.uint32)
        lo = tl.load(lo_ptr + r * stride_lo + c).to(tl.uint32)
        tv = ((th << 24) | (lo << 16)).to(tl.float32, bitcast=True)
        pv = ((((th & 0x80) | base) << 24) | (lo << 16)).to(tl.float32, bitcast=True)
        xv = tl.load(x_ptr + rm * stride_xm + c, mask=mmask, other=0.0).to(tl.float32)
        delta += tl.where((rn.to(tl.int64) == r)[:, None], (xv * tv - xv * pv)[None, :], 0.0)
    return delta


@isolated
@triton.jit
def _linear_kernel(
    x_ptr, code_ptr, lo_ptr, lo8_ptr, base_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, bias_ptr, out_ptr, fin_ptr, cnt_ptr,
    M, N, K, KP, stride_xm, K_SPLIT, stride_code, stride_lo,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr, F32DOT: tl.constexpr,
    GROUP_MAJOR: tl.constexpr, STAGES: tl.constexpr, FIXUP: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    G: tl.constexpr = BK // 64  # 64-weight groups a step; a group is 8 code words (bytes 4w..4w+3)
    W: tl.constexpr = BK // 8
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    base = tl.load(base_ptr).to(tl.uint32)  # from device memory: no host sync
    b4 = base * 0x01010101
    # 3-D tiles [BN, G, 8] with explicit aranges (no // or %): the compiler sees 8 contiguous
    # words along the last axis and vectorises every plane load to 16 bytes.
    # GROUP_MAJOR (FMA path only) orders the tile [G, BN, 8]: Triton then lays threads along words
    # and groups before rows, so one thread holds several rows of the same columns and each x value
    # it loads serves all of them (in [BN, G, 8] every thread loads its own x: ~1 load a weight).
    if GROUP_MAJOR:
        gi = tl.arange(0, G)[:, None, None]
        r3 = rn[None, :, None]
        m3 = nmask[None, :, None]
    else:
        gi = tl.arange(0, G)[None, :, None]
        r3 = rn[:, None, None]
        m3 = nmask[:, None, None]
    wi = tl.arange(0, 8)[None, None, :]
    # Row strides come in as arguments (KP // 8, KP // 4): Triton specialises their divisibility by
    # 16, which proves 16-byte alignment of each row's words.
    code_off = r3 * stride_code + gi * 8 + wi
    lo_off = r3 * stride_lo + gi * 16 + wi
    kx = gi * 64 + wi * 4  # column (within the step) of byte 0 of each word, first half
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(k0 + K_SPLIT, KP)
    if DOT:
        rm = pid_m * BM + tl.arange(0, BM)
        mmask = rm < M
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        rm3 = rm[None, None, :]
        mm3 = mmask[None, None, :]
    elif GROUP_MAJOR:
        acc3 = tl.zeros([G, BN, 8], dtype=tl.float32)
        # BM = 2 or 4 (FMA path): the decoded tile serves that many x rows, one accumulator each
        if BM >= 2:
            acc3b = tl.zeros([G, BN, 8], dtype=tl.float32)
        if BM >= 4:
            acc3c = tl.zeros([G, BN, 8], dtype=tl.float32)
            acc3d = tl.zeros([G, BN, 8], dtype=tl.float32)
    else:
        acc3 = tl.zeros([BN, G, 8], dtype=tl.float32)
    # tl.range with num_stages: the pipeliner then streams the plane loads of the FMA path through
    # shared memory by async copy too (a plain range pipelines only loads that feed tl.dot).
    for kb in tl.range(k0, k1, BK, num_stages=STAGES):
        lmask = m3 & (kb + gi * 64 < KP)
        kw = tl.multiple_of(kb // 8, BK // 8)
        kl = tl.multiple_of(kb // 4, BK // 4)
        cw = tl.load(code_ptr + code_off + kw, mask=lmask, other=0).to(tl.uint32, bitcast=True)
        la = tl.load(lo_ptr + lo_off + kl, mask=lmask, other=0).to(tl.uint32, bitcast=True)
        lb = tl.load(lo_ptr + lo_off + (kl + 8), mask=lmask, other=0).to(tl.uint32, bitcast=True)
        ha = _hi_bytes(cw & 0x0F0F0F0F, b4)
        hb = _hi_bytes((cw >> 4) & 0x0F0F0F0F, b4)
        # Byte lane t of a word is column 4w + t of its half. Each lane multiplies the matching
        # strided x (order within K does not matter): no re-layout of the decoded tile.
        for t in tl.static_range(4):
            wa = _f32_bits(ha, la, t).to(tl.float32, bitcast=True)
            wb = _f32_bits(hb, lb, t).to(tl.float32, bitcast=True)
            if DOT:
                ka = (kb + t + kx).reshape(1, W)
                kb2 = ka + 32
                xa = tl.load(x_ptr + rm[None, :] * stride_xm + ka.reshape(W, 1),
                             mask=mmask[None, :] & (ka.reshape(W, 1) < K), other=0.0)
                xb = tl.load(x_ptr + rm[None, :] * stride_xm + kb2.reshape(W, 1),
                             mask=mmask[None, :] & (kb2.reshape(W, 1) < K), other=0.0)
                wa2 = wa.reshape(BN, W)
                wb2 = wb.reshape(BN, W)
                if F32DOT:  # the interpreter's tl.dot reads bf16 as raw integers
                    acc = tl.dot(wa2, xa.to(tl.float32), acc)
                    acc = tl.dot(wb2, xb.to(tl.float32), acc)
                else:
                    acc = tl.dot(wa2.to(tl.bfloat16), xa, acc)
                    acc = tl.dot(wb2.to(tl.bfloat16), xb, acc)
            else:
                # x is shared by the BN rows: a tall tile (BN >= 32) amortises these strided loads.
                ka = kb + t + kx
                xrow = x_ptr + pid_m * BM * stride_xm
                xa = tl.load(xrow + ka, mask=ka < K, other=0.0).to(tl.float32)
                xb = tl.load(xrow + ka + 32, mask=ka + 32 < K, other=0.0).to(tl.float32)
                acc3 += wa * xa  # two FMAs (one sum of two products costs FMUL + FFMA + FADD)
                acc3 += wb * xb
                if BM >= 2:
                    acc3b = _fma_row(acc3b, wa, wb, xrow + stride_xm, ka, K, pid_m * BM + 1 < M)
                if BM >= 4:
                    acc3c = _fma_row(acc3c, wa, wb, xrow + 2 * stride_xm, ka, K, pid_m * BM + 2 < M)
                    acc3d = _fma_row(acc3d, wa, wb, xrow + 3 * stride_xm, ka, K, pid_m * BM + 3 < M)
    if not DOT:
        if GROUP_MAJOR:
            acc1 = tl.sum(tl.sum(acc3, axis=2), axis=0)
        else:
            acc1 = tl.sum(tl.sum(acc3, axis=2), axis=1)
    if HAS_EXC:
        if pid_k == 0:
            if DOT:
                acc += _exception_delta_tile(rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, x_ptr, rn, rm, mmask, stride_xm,
                                             base, pid_n, N, K, KP, BN, BM)
            else:
                acc1 += _exception_delta(rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, x_ptr + pid_m * BM * stride_xm, rn,
                                         base, pid_n, N, K, KP, BN)
    tile = pid_m * tl.num_programs(0) + pid_n
    if DOT:
        C.store_out(acc, out_ptr, fin_ptr, cnt_ptr, bias_ptr, rm[None, :] * N + rn[:, None],
                    nmask[:, None] & mmask[None, :], rn[:, None] + 0 * rm[None, :], tile, pid_k, tl.num_programs(1),
                    M * N, PARTIAL, FIXUP, HAS_BIAS)
    elif BM == 1:
        C.store_out(acc1, out_ptr, fin_ptr, cnt_ptr, bias_ptr, pid_m * N + rn, nmask, rn, tile, pid_k,
                    tl.num_programs(1), M * N, PARTIAL, FIXUP, HAS_BIAS)
    else:  # BM rows of one program: one [BM, BN] tile, so one store (and one split-K counter)
        ri = tl.arange(0, BM)
        rows = pid_m * BM + ri
        out2 = tl.where(ri[:, None] == 0, acc1[None, :], 0.0)
        out2 = _put_row(out2, ri, 1, acc3b, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, x_ptr + (pid_m * BM + 1) * stride_xm,
                        pid_m * BM + 1 < M, rn, base, pid_n, pid_k, N, K, KP, BN, HAS_EXC)
        if BM >= 4:
            out2 = _put_row(out2, ri, 2, acc3c, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr,
                            x_ptr + (pid_m * BM + 2) * stride_xm, pid_m * BM + 2 < M, rn, base, pid_n, pid_k, N, K,
                            KP, BN, HAS_EXC)
            out2 = _put_row(out2, ri, 3, acc3d, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr,
                            x_ptr + (pid_m * BM + 3) * stride_xm, pid_m * BM + 3 < M, rn, base, pid_n, pid_k, N, K,
                            KP, BN, HAS_EXC)
        C.store_out(out2, out_ptr, fin_ptr, cnt_ptr, bias_ptr, rows[:, None] * N + rn[None, :],
                    (rows < M)[:, None] & nmask[None, :], rn[None, :] + 0 * rows[:, None], tile, pid_k,
                    tl.num_programs(1), M * N, PARTIAL, FIXUP, HAS_BIAS)


@triton.jit
def _hi_words(cw, b4):
    # hi bytes of a code word's two halves: low nibbles (first half) and high nibbles (second half)
    ha = ((cw << 4) & 0x80808080) | ((cw & 0x07070707) + b4)
    hb = (cw & 0x80808080) | (((cw >> 4) & 0x07070707) + b4)
    return ha, hb


@triton.jit
def _gm_offsets(rn, N, stride_code, stride_lo, G: tl.constexpr, EVEN: tl.constexpr):
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
def _gm_planes(code_ptr, lo_ptr, code_off, lo_off, kb, lmask, BK: tl.constexpr, EVEN: tl.constexpr):
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
def _prmt(a, b, SEL: tl.constexpr):
    # prmt.b32: each byte of the result picked from the 8 bytes of (b, a) by a nibble of SEL
    return tl.inline_asm_elementwise(f"prmt.b32 $0, $1, $2, {SEL};", "=r,r,r", [a, b], dtype=tl.uint32,
                                     is_pure=True, pack=1)


@triton.jit
def _f32_lane(h, lo, t: tl.constexpr, PRMT: tl.constexpr):
    # fp32 of the weight in byte lane t (hi byte from h, low byte from lo): one prmt.b32 on the GPU
    # from lo with every other byte cleared, which supplies the two zero bytes.
    if PRMT:
        if t == 0:
            r = _prmt(lo & 0x00FF00FF, h, 0x4011)
        elif t == 1:
            r = _prmt(lo & 0xFF00FF00, h, 0x5100)
        elif t == 2:
            r = _prmt(lo & 0x00FF00FF, h, 0x6211)
        else:
            r = _prmt(lo & 0xFF00FF00, h, 0x7300)
    else:
        r = _f32_bits(h, lo, t)
    return r.to(tl.float32, bitcast=True)


@triton.jit
def _x_lane(x01, x23, t: tl.constexpr):
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
def _gm_fma(acc, cw, la, lb, b4, x_ptr, x32_ptr, xoff, x32off, mmx, ka0, K, BM: tl.constexpr, EVEN: tl.constexpr,
            PRMT: tl.constexpr):
    # acc += decoded word tile * x, byte lane by byte lane. BM = 1: tiles [G, BN, 8], ka0 [G, 1, 8]
    # (column of each word's byte 0), xoff / x32off the row's offsets (scalars). BM > 1: every
    # tile carries a leading axis ([1, G, BN, 8], ka0 [1, G, 1, 8]), acc is [BM, G, BN, 8] and
    # xoff / x32off are [BM, 1, 1, 1]. (Planes loaded as 3-D tiles and expanded afterwards compile
    # to shared-memory round trips; a 4-D accumulator for one row does too: hence two shapes.)
    ha, hb = _hi_words(cw, b4)
    kw = ka0
    if EVEN:
        # a word's 4 columns are contiguous in x: two bf16 pairs a word and half, each pair one
        # 4-byte load (4 loads, where the byte lanes took 8 scalar loads with their own addresses)
        xo = x32off + (kw >> 1)
        xa01 = tl.load(x32_ptr + xo).to(tl.uint32, bitcast=True)
        xa23 = tl.load(x32_ptr + xo + 1).to(tl.uint32, bitcast=True)
        xb01 = tl.load(x32_ptr + xo + 16).to(tl.uint32, bitcast=True)
        xb23 = tl.load(x32_ptr + xo + 17).to(tl.uint32, bitcast=True)
    for t in tl.static_range(4):
        wa = _f32_lane(ha, la, t, PRMT)
        wb = _f32_lane(hb, lb, t, PRMT)
        if EVEN:
            xa = _x_lane(xa01, xa23, t)
            xb = _x_lane(xb01, xb23, t)
        else:
            ka = kw + t
            xa = tl.load(x_ptr + xoff + ka, mask=mmx & (ka < K), other=0.0).to(tl.float32)
            xb = tl.load(x_ptr + xoff + ka + 32, mask=mmx & (ka + 32 < K), other=0.0).to(tl.float32)
        acc += wa * xa
        acc += wb * xb
    return acc


@isolated
@triton.jit
def _gemv_gm_kernel(
    x_ptr, x32_ptr, code_ptr, lo_ptr, lo8_ptr, base_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, bias_ptr, out_ptr, fin_ptr,
    cnt_ptr, M, N, K, KP, stride_xm, K_SPLIT, stride_code, stride_lo,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN: tl.constexpr, PREFETCH: tl.constexpr,
    PRMT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr, FIXUP: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    if PDL & 1:  # launched early (C.PDL): nothing read before the previous kernel is done
        C.gdc_wait()
    if PDL & 2:
        C.gdc_launch_dependents()
    # The group-major word-tile GEMV: a [BN, BK] weight tile decoded once for BM x rows. Options for
    # its memory path: EVEN (K == KP, whole steps, x rows 4-byte aligned): no load masks at all
    # (rows past N or M read row N-1 / M-1 again, not stored) and x read as bf16 pairs through
    # x32_ptr; PREFETCH: the next step's plane words are loaded into registers before this step's
    # decode, so a program always has one step of loads in flight (shared-memory pipelining of
    # the same loads measured slower: notes-kernels run 11).
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    G: tl.constexpr = BK // 64
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    rm = pid_m * BM + tl.arange(0, BM)
    mmask = rm < M
    base = tl.load(base_ptr).to(tl.uint32)
    b4 = base * 0x01010101
    code_off, lo_off, m3 = _gm_offsets(rn, N, stride_code, stride_lo, G, EVEN)
    gi = tl.arange(0, G)[:, None, None]
    kx = gi * 64 + tl.arange(0, 8)[None, None, :] * 4
    rm4 = (tl.minimum(rm, M - 1) if EVEN else rm)[:, None, None, None]
    if BM > 1:
        code_off = code_off[None, :, :, :]
        lo_off = lo_off[None, :, :, :]
        m3 = m3[None, :, :, :]
        gi = gi[None, :, :, :]
        kx = kx[None, :, :, :]
    if BM == 1:
        mmx = pid_m < M
        xoff = pid_m * stride_xm
        x32off = pid_m * (stride_xm // 2)
    else:
        mmx = mmask[:, None, None, None]
        xoff = rm4 * stride_xm
        x32off = rm4 * (stride_xm // 2)
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(k0 + K_SPLIT, KP)
    if BM == 1:
        acc4 = tl.zeros([G, BN, 8], dtype=tl.float32)
    else:
        acc4 = tl.zeros([BM, G, BN, 8], dtype=tl.float32)
    if PREFETCH:
        cw, la, lb = _gm_planes(code_ptr, lo_ptr, code_off, lo_off, k0, m3 & (k0 + gi * 64 < KP), BK, EVEN)
        for kb in range(k0, k1, BK):
            # the last step re-reads its own words (no mask, no branch): they are in L2
            kn = tl.minimum(kb + BK, k1 - BK) if EVEN else kb + BK
            cn, lan, lbn = _gm_planes(code_ptr, lo_ptr, code_off, lo_off, kn, m3 & (kn + gi * 64 < k1), BK, EVEN)
            acc4 = _gm_fma(acc4, cw, la, lb, b4, x_ptr, x32_ptr, xoff, x32off, mmx, kb + kx, K, BM, EVEN, PRMT)
            cw = cn
            la = lan
            lb = lbn
    else:
        for kb in range(k0, k1, BK):
            cw, la, lb = _gm_planes(code_ptr, lo_ptr, code_off, lo_off, kb, m3 & (kb + gi * 64 < KP), BK, EVEN)
            acc4 = _gm_fma(acc4, cw, la, lb, b4, x_ptr, x32_ptr, xoff, x32off, mmx, kb + kx, K, BM, EVEN, PRMT)
    if BM == 1:
        acc = tl.sum(tl.sum(acc4, axis=2), axis=0)[None, :]
    else:
        acc = tl.sum(tl.sum(acc4, axis=3), axis=1)  # [BM, BN]
    if HAS_EXC:
        if pid_k == 0:
            if BM == 1:
                acc += _exception_delta(rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, x_ptr + pid_m * stride_xm, rn, base,
                                        pid_n, N, K, KP, BN)[None, :]
            else:
                acc += tl.trans(_exception_delta_tile(rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, x_ptr, rn, rm, mmask,
                                                      stride_xm, base, pid_n, N, K, KP, BN, BM))
    C.store_out(acc, out_ptr, fin_ptr, cnt_ptr, bias_ptr, rm[:, None] * N + rn[None, :],
                mmask[:, None] & nmask[None, :], rn[None, :] + 0 * rm[:, None], pid_m * tl.num_programs(0) + pid_n,
                pid_k, tl.num_programs(1), M * N, PARTIAL, FIXUP, HAS_BIAS)


@triton.jit
def _bf16_lane(lo, h, t: tl.constexpr, PRMT: tl.constexpr):
    # bf16 of the weight in byte lane t: its hi byte (from h) over its lo byte (from lo); one
    # prmt.b32 on the GPU (the pair's upper half is dropped by the narrowing).
    if PRMT:
        r = tl.inline_asm_elementwise(f"prmt.b32 $0, $1, $2, {0x40 + 0x11 * t};", "=r,r,r", [lo, h],
                                      dtype=tl.uint32, is_pure=True, pack=1)
    else:
        r = (((h >> (8 * t)) & 0xFF) << 8) | ((lo >> (8 * t)) & 0xFF)
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _bf16x4(lo, h, PRMT: tl.constexpr, PAIRS: tl.constexpr = False):
    # [..., 4] bf16: the 4 weights of each word (byte lane t = column 4w + t), lanes joined in
    # order ([.., k, j] = lane 2k + j). (One packed asm call for all 4 lanes is wrong here: pack
    # groups a thread's elements in register order, which need not be a word's 4 lanes.)
    # PAIRS (GPU only): one prmt.b32 builds the bf16 pair of lanes 0-1 (2-3) and a register split
    # hands out its halves, which ptxas can leave in place for the MMA operand (static sm_90 SASS
    # of the tc loop at bm16 bn64 bk256: 566 instructions a step against 633).
    shp: tl.constexpr = (lo.shape[0], lo.shape[1], lo.shape[2], 4)
    if PRMT and PAIRS:
        l0, l1 = _split16(_bf16_pair(lo, h, False, PRMT))
        l2, l3 = _split16(_bf16_pair(lo, h, True, PRMT))
    else:
        l0 = _bf16_lane(lo, h, 0, PRMT)
        l1 = _bf16_lane(lo, h, 1, PRMT)
        l2 = _bf16_lane(lo, h, 2, PRMT)
        l3 = _bf16_lane(lo, h, 3, PRMT)
    return tl.reshape(tl.join(tl.join(l0, l2), tl.join(l1, l3)), shp)


@triton.jit
def _split16(p):
    # the two bf16 halves of a 32-bit pair, low half first (PTX vector unpack)
    a, b = tl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [p], dtype=(tl.uint16, tl.uint16),
                                     is_pure=True, pack=1)
    return a.to(tl.bfloat16, bitcast=True), b.to(tl.bfloat16, bitcast=True)


@triton.jit
def _tc_step(acc, cw, la, lb, b4, x_ptr, rml, mmask, kk, kb, K, stride_xm, BK: tl.constexpr, BN: tl.constexpr,
             EVEN: tl.constexpr, PRMT: tl.constexpr, F32DOT: tl.constexpr, PAIRS: tl.constexpr):
    # acc [BM, BN] += x [BM, BK] @ decoded word tile [BK, BN]
    ha, hb = _hi_words(cw, b4)
    w = tl.join(_bf16x4(la, ha, PRMT, PAIRS), _bf16x4(lb, hb, PRMT, PAIRS))  # [G, BN, 8, 4, 2]
    w = tl.reshape(tl.permute(w, (0, 4, 2, 3, 1)), (BK, BN))
    if EVEN:
        xt = tl.load(x_ptr + rml[:, None] * stride_xm + (kb + kk)[None, :])
    else:  # padding columns: x is 0 there (the padded weights are finite)
        xt = tl.load(x_ptr + rml[:, None] * stride_xm + (kb + kk)[None, :],
                     mask=mmask[:, None] & (kb + kk < K)[None, :], other=0.0)
    if F32DOT:  # the interpreter's tl.dot reads bf16 as raw integers
        return tl.dot(xt.to(tl.float32), w.to(tl.float32), acc)
    return tl.dot(xt, w, acc)


@isolated
@triton.jit
def _tc_kernel(
    x_ptr, code_ptr, lo_ptr, lo8_ptr, base_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, bias_ptr, out_ptr, fin_ptr, cnt_ptr,
    M, N, K, KP, stride_xm, K_SPLIT, stride_code, stride_lo,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN: tl.constexpr, PRMT: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr, F32DOT: tl.constexpr, FIXUP: tl.constexpr,
    PREFETCH: tl.constexpr, PAIRS: tl.constexpr, PDL: tl.constexpr = 0,
):
    if PDL & 1:  # launched early (C.PDL): nothing read before the previous kernel is done
        C.gdc_wait()
    if PDL & 2:
        C.gdc_launch_dependents()
    # out tile [BM, BN] = x [BM, BK] @ W^T [BK, BN], the planes loaded as the GEMV loads them
    # (group-major [G, BN, 8] word tiles, 16-byte loads straight to registers) and decoded to bf16
    # there. The decoded tile is joined and reshaped into natural column order ([G, half, word,
    # lane] = column 64g + 32h + 4w + t), so x loads stay contiguous. Triton 3.6 then stores the
    # decoded tile to shared memory and reads it back as the MMA's B operand (ttgir: local_alloc
    # of the [BK, BN] bf16 tile; 32 KB at bk 256 bn 64), as it must for wgmma (bm 64).
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    G: tl.constexpr = BK // 64
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    rm = pid_m * BM + tl.arange(0, BM)
    mmask = rm < M
    base = tl.load(base_ptr).to(tl.uint32)
    b4 = base * 0x01010101
    code_off, lo_off, m3 = _gm_offsets(rn, N, stride_code, stride_lo, G, EVEN)
    gi = tl.arange(0, G)[:, None, None]
    rml = tl.minimum(rm, M - 1) if EVEN else rm
    kk = tl.arange(0, BK)
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(k0 + K_SPLIT, KP)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    if PREFETCH:  # the next step's plane words in flight while this step decodes (as in the GEMV)
        cw, la, lb = _gm_planes(code_ptr, lo_ptr, code_off, lo_off, k0, m3 & (k0 + gi * 64 < KP), BK, EVEN)
        for kb in range(k0, k1, BK):
            # the last step re-reads its own words (no mask, no branch): they are in L2
            kn = tl.minimum(kb + BK, k1 - BK) if EVEN else kb + BK
            cn, lan, lbn = _gm_planes(code_ptr, lo_ptr, code_off, lo_off, kn, m3 & (kn + gi * 64 < k1), BK, EVEN)
            acc = _tc_step(acc, cw, la, lb, b4, x_ptr, rml, mmask, kk, kb, K, stride_xm, BK, BN, EVEN, PRMT, F32DOT, PAIRS)
            cw = cn
            la = lan
            lb = lbn
    else:
        for kb in range(k0, k1, BK):
            cw, la, lb = _gm_planes(code_ptr, lo_ptr, code_off, lo_off, kb, m3 & (kb + gi * 64 < KP), BK, EVEN)
            acc = _tc_step(acc, cw, la, lb, b4, x_ptr, rml, mmask, kk, kb, K, stride_xm, BK, BN, EVEN, PRMT, F32DOT, PAIRS)
    if HAS_EXC:
        if pid_k == 0:
            acc += tl.trans(_exception_delta_tile(rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, x_ptr, rn, rm, mmask,
                                                  stride_xm, base, pid_n, N, K, KP, BN, BM))
    C.store_out(acc, out_ptr, fin_ptr, cnt_ptr, bias_ptr, rm[:, None] * N + rn[None, :],
                mmask[:, None] & nmask[None, :], rn[None, :] + 0 * rm[:, None], pid_m * tl.num_programs(0) + pid_n,
                pid_k, tl.num_programs(1), M * N, PARTIAL, FIXUP, HAS_BIAS)


@isolated
@triton.jit
def _gemv_bytes_kernel(
    x_ptr, code_ptr, lo_ptr, base_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, bias_ptr, out_ptr, fin_ptr, cnt_ptr,
    M, N, K, KP, stride_xm, K_SPLIT, stride_code, stride_lo,
    BN: tl.constexpr, G: tl.constexpr, EVEN: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr, STAGES: tl.constexpr,
    FIXUP: tl.constexpr,
):
    # One activation row a program, decode byte by byte on [BN, G, 32] tiles in column order, so
    # x is a contiguous [G, 32] vector shared by the tile's rows (the word-tile kernel above needs
    # one strided x load a weight). m is the fastest grid axis: the programs of one weight tile for
    # all M rows run together and the repeated plane reads hit L2.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    base = tl.load(base_ptr).to(tl.uint32)
    gi = tl.arange(0, G)[None, :, None]
    j = tl.arange(0, 32)[None, None, :]
    r3 = rn[:, None, None]
    m3 = nmask[:, None, None]
    code_off = r3 * stride_code + gi * 32 + j
    lo_off = r3 * stride_lo + gi * 64 + j
    xo = gi * 64 + j
    xrow = x_ptr + pid_m * stride_xm
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(k0 + K_SPLIT, KP)
    acc = tl.zeros([BN, G, 32], dtype=tl.float32)
    for kb in tl.range(k0, k1, 64 * G, num_stages=STAGES):
        if EVEN:  # K == KP and every step whole: no column masks
            lmask = m3
            xa = tl.load(xrow + kb + xo).to(tl.float32)
            xb = tl.load(xrow + kb + 32 + xo).to(tl.float32)
        else:
            lmask = m3 & (kb + gi * 64 < KP)
            xa = tl.load(xrow + kb + xo, mask=kb + xo < K, other=0.0).to(tl.float32)
            xb = tl.load(xrow + kb + 32 + xo, mask=kb + 32 + xo < K, other=0.0).to(tl.float32)
        c = tl.load(code_ptr + code_off + kb // 2, mask=lmask, other=0).to(tl.uint32)
        la = tl.load(lo_ptr + lo_off + kb, mask=lmask, other=0).to(tl.uint32)
        lb = tl.load(lo_ptr + lo_off + kb + 32, mask=lmask, other=0).to(tl.uint32)
        # fp32 bits of a bf16 weight: hi << 24 | lo << 16 (widening bf16 to fp32 is exact)
        wa = ((((c & 8) << 4) | ((c & 7) + base)) << 24 | (la << 16)).to(tl.float32, bitcast=True)
        wb = ((((c & 0x80) | (((c >> 4) & 7) + base)) << 24) | (lb << 16)).to(tl.float32, bitcast=True)
        acc += wa * xa
        acc += wb * xb
    acc1 = tl.sum(tl.sum(acc, axis=2), axis=1)
    if HAS_EXC:
        if pid_k == 0:
            acc1 += _exception_delta(rowptr_ptr, eidx_ptr, ehi_ptr, lo_ptr, xrow, rn, base, pid_n, N, K, stride_lo, BN)
    C.store_out(acc1, out_ptr, fin_ptr, cnt_ptr, bias_ptr, pid_m * N + rn, nmask, rn,
                pid_m * tl.num_programs(1) + pid_n, pid_k, tl.num_programs(2), M * N, PARTIAL, FIXUP, HAS_BIAS)


@isolated
@triton.jit
def _mma_kernel(
    x_ptr, code_ptr, lo_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, bias_ptr, out_ptr, fin_ptr, cnt_ptr,
    M, N, K, KP, stride_xm, K_SPLIT, stride_code, stride_lo,
    BASE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, EVEN: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr, F32DOT: tl.constexpr,
    FIXUP: tl.constexpr,
):
    # out^T tile [BN, BM] = W tile [BN, 32] @ x^T [32, BM], twice a 64-weight group (its two
    # halves share the code bytes). The weights are the MMA's A operand: Triton keeps A in
    # registers, and because the decode is element-wise from the loads with only constants in it,
    # it moves the layout change onto the shared-memory read of the raw planes (the pipeliner
    # streams them in by async copy). BASE is a compile-time constant for that reason: a runtime
    # base (even a scalar argument) stops that move, and the decoded tile then takes a round trip
    # through shared memory with barriers.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rn = pid_n * BN + tl.arange(0, BN)
    rm = pid_m * BM + tl.arange(0, BM)
    # Out-of-range rows read row N-1 / M-1 again (no load masks); their results are not stored.
    rnl = tl.minimum(rn, N - 1)
    rml = tl.minimum(rm, M - 1)
    j = tl.arange(0, 32)
    code_off = rnl[:, None] * stride_code + j[None, :]
    lo_off = rnl[:, None] * stride_lo + j[None, :]
    x_off = rml[None, :] * stride_xm + j[:, None]
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(k0 + K_SPLIT, KP)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for kb in range(k0, k1, 64 * G):
        for g in tl.static_range(G):
            kg = kb + 64 * g
            c = tl.load(code_ptr + code_off + kg // 2).to(tl.uint16)
            la = tl.load(lo_ptr + lo_off + kg).to(tl.uint16)
            lb = tl.load(lo_ptr + lo_off + kg + 32).to(tl.uint16)
            if EVEN:
                xa = tl.load(x_ptr + x_off + kg)
                xb = tl.load(x_ptr + x_off + kg + 32)
            else:  # padding columns: x is 0 there (the padded weights are finite)
                xa = tl.load(x_ptr + x_off + kg, mask=(kg + j < K)[:, None], other=0.0)
                xb = tl.load(x_ptr + x_off + kg + 32, mask=(kg + 32 + j < K)[:, None], other=0.0)
            # bf16 bits: sign = code bit 3 (7), exponent >> 1 = code bits 0-2 (4-6) + BASE, low byte = lo
            wa = ((((c & 8) << 12) | (((c & 7) + BASE) << 8)) | la).to(tl.bfloat16, bitcast=True)
            wb = ((((c & 0x80) << 8) | ((((c >> 4) & 7) + BASE) << 8)) | lb).to(tl.bfloat16, bitcast=True)
            if F32DOT:  # the interpreter's tl.dot reads bf16 as raw integers
                acc = tl.dot(wa.to(tl.float32), xa.to(tl.float32), acc)
                acc = tl.dot(wb.to(tl.float32), xb.to(tl.float32), acc)
            else:
                acc = tl.dot(wa, xa, acc)
                acc = tl.dot(wb, xb, acc)
    mmask = rm < M
    nmask = rn < N
    if HAS_EXC:
        if pid_k == 0:
            acc += _exception_delta_tile(rowptr_ptr, eidx_ptr, ehi_ptr, lo_ptr, x_ptr, rn, rm, mmask, stride_xm,
                                         BASE, pid_n, N, K, stride_lo, BN, BM)
    omask = nmask[:, None] & mmask[None, :]
    C.store_out(acc, out_ptr, fin_ptr, cnt_ptr, bias_ptr, rm[None, :] * N + rn[:, None], omask,
                rn[:, None] + 0 * rm[None, :], pid_m * tl.num_programs(0) + pid_n, pid_k, tl.num_programs(1), M * N,
                PARTIAL, FIXUP, HAS_BIAS)


@isolated
@triton.jit
def _unpack_kernel(code_ptr, lo_ptr, base_ptr, out_ptr, N, K, KP, BN: tl.constexpr, G: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    base = tl.load(base_ptr).to(tl.int32)
    j = tl.arange(0, 32)
    for gi in tl.static_range(G):
        col0 = (pid_k * G + gi) * 64
        m = nmask[:, None] & (col0 + j < KP)[None, :]
        c = tl.load(code_ptr + rn[:, None] * (KP // 2) + (col0 // 2 + j)[None, :], mask=m, other=0).to(tl.int32)
        la = tl.load(lo_ptr + rn[:, None] * KP + (col0 + j)[None, :], mask=m, other=0).to(tl.int32)
        lb = tl.load(lo_ptr + rn[:, None] * KP + (col0 + 32 + j)[None, :], mask=m, other=0).to(tl.int32)
        na = c & 0xF
        nb = c >> 4
        va = (((na & 8) << 4) | ((na & 7) + base)) << 8 | la
        vb = (((nb & 8) << 4) | ((nb & 7) + base)) << 8 | lb
        ca = col0 + j
        tl.store(out_ptr + rn[:, None] * K + ca[None, :], va.to(tl.int16),
                 mask=nmask[:, None] & (ca < K)[None, :])
        tl.store(out_ptr + rn[:, None] * K + (ca + 32)[None, :], vb.to(tl.int16),
                 mask=nmask[:, None] & (ca + 32 < K)[None, :])


@isolated
@triton.jit
def _unpack_flat_kernel(code_ptr, lo_ptr, base_ptr, out_ptr, NG, BG: tl.constexpr):
    # K == Kp: the planes and the output are one stream of 64-weight groups (code 32 bytes, lo 64,
    # out 64 bf16 each, rows back to back), so a program takes BG whole groups with no row math.
    g = tl.program_id(0).to(tl.int64) * BG + tl.arange(0, BG)[:, None]
    j = tl.arange(0, 32)[None, :]
    m = g < NG
    base = tl.load(base_ptr).to(tl.int32)
    c = tl.load(code_ptr + g * 32 + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int32)
    la = tl.load(lo_ptr + g * 64 + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int32)
    lb = tl.load(lo_ptr + g * 64 + 32 + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int32)
    na = c & 0xF
    nb = c >> 4
    va = (((na & 8) << 4) | ((na & 7) + base)) << 8 | la
    vb = (((nb & 8) << 4) | ((nb & 7) + base)) << 8 | lb
    tl.store(out_ptr + g * 64 + j, va.to(tl.int16), mask=m)
    tl.store(out_ptr + g * 64 + 32 + j, vb.to(tl.int16), mask=m)


@triton.jit
def _bf16_pair(lo, h, HI: tl.constexpr, PRMT: tl.constexpr):
    # uint32 holding the bf16 bits of byte lanes 0, 1 (HI False) or 2, 3 (HI True) of a word
    # (lane 2j + HI * 2 in half j): lo byte under hi byte, twice; one prmt.b32 on the GPU.
    if PRMT:
        r = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, " + ("0x7362;" if HI else "0x5140;"), "=r,r,r", [lo, h],
                                      dtype=tl.uint32, is_pure=True, pack=1)
    else:
        s = 16 if HI else 0
        r = ((lo >> s) & 0xFF) | (((h >> s) & 0xFF) << 8) | (((lo >> (s + 8)) & 0xFF) << 16) | (((h >> (s + 8)) & 0xFF) << 24)
    return r


@isolated
@triton.jit
def _unpack_words_kernel(code_ptr, lo_ptr, base_ptr, out_ptr, N, KP, BN: tl.constexpr, G: tl.constexpr,
                         PRMT: tl.constexpr):
    # Whole rows (K == Kp): [BN, G, 8] word tiles in, bf16 pairs out (out_ptr: the bf16 output
    # viewed as uint32). Each word gives 4 columns of each half: two pairs a half.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = tl.minimum(pid_n * BN + tl.arange(0, BN), N - 1)[:, None, None]  # rows past N: row N-1 again
    gi = (pid_k * G + tl.arange(0, G))[None, :, None]
    wi = tl.arange(0, 8)[None, None, :]
    base = tl.load(base_ptr).to(tl.uint32)
    b4 = base * 0x01010101
    cw = tl.load(code_ptr + rn * (KP // 8) + gi * 8 + wi).to(tl.uint32, bitcast=True)
    la = tl.load(lo_ptr + rn * (KP // 4) + gi * 16 + wi).to(tl.uint32, bitcast=True)
    lb = tl.load(lo_ptr + rn * (KP // 4) + gi * 16 + 8 + wi).to(tl.uint32, bitcast=True)
    ha, hb = _hi_words(cw, b4)
    pa = tl.join(_bf16_pair(la, ha, False, PRMT), _bf16_pair(la, ha, True, PRMT))  # [BN, G, 8, 2]
    pb = tl.join(_bf16_pair(lb, hb, False, PRMT), _bf16_pair(lb, hb, True, PRMT))
    o = (rn * (KP // 2) + gi * 32 + wi * 2)[:, :, :, None] + tl.arange(0, 2)[None, None, None, :]
    tl.store(out_ptr + o, pa.to(tl.int32, bitcast=True))
    tl.store(out_ptr + o + 16, pb.to(tl.int32, bitcast=True))


class Prepared:
    """Per-matrix data derived once from the packed arrays (host syncs allowed here, never in linear)."""

    def __init__(self, p: Packed) -> None:
        n, k = p.shape
        a = p.arrays
        idx = a["exc_idx"]
        self.nexc = int(idx.numel())
        dev = idx.device
        self.base = int(a["base"].reshape(-1)[0])  # the mma kernel compiles it in (one sync, here)
        if self.nexc:
            idx64 = idx.to(torch.int64)
            if int(idx64.min()) < 0 or int(idx64.max()) >= n * k:
                raise C.FormatError("fixed12 'exc_idx' holds indices outside the matrix")
            bounds = torch.arange(n + 1, device=dev, dtype=torch.int64) * k
            self.rowptr = torch.searchsorted(idx64, bounds).to(torch.int32)
            kp = a["lo"].shape[1]
            lo = a["lo"].reshape(-1)[(idx64 // k) * kp + idx64 % k].to(torch.int32)
            self.pos = idx64
            self.vals = ((a["exc_hi"].to(torch.int32) << 8) | lo).to(torch.int16)
        else:
            self.rowptr = torch.zeros(n + 1, dtype=torch.int32, device=dev)
            self.pos = self.vals = None
        # host copy for the chunked long-prompt path (which exceptions fall in a row range)
        self.rowptr_host = self.rowptr.cpu().tolist() if self.nexc else None


def prepare(p: Packed) -> Prepared:
    if p.layout != _codec.NAME:
        raise ValueError(f"expected a fixed12 packed matrix, got layout {p.layout!r}")
    return C.cached(p.arrays["exc_idx"], lambda: Prepared(p))


#: Word-tile unpack for whole rows (16-byte plane loads, one prmt.b32 a bf16 pair, 8-byte stores)
#: instead of the byte-tile kernel; its rows and 64-weight groups a program, and warps. Off until
#: timed on a GPU (tested bit-exact under the interpreter, whose path has no prmt; static sm_90
#: SASS: 5 instructions a weight, 16-byte loads, 8-byte stores). benchmarks/kernels.py times both.
UNPACK_WORDS = False
UNPACK_BN, UNPACK_G, UNPACK_WARPS = 32, 4, 4
#: The byte-tile unpack's rows and 64-weight groups a program, and warps (benchmarks/unpack_sweep.py).
UNPACK_BYTES_BN, UNPACK_BYTES_G, UNPACK_BYTES_WARPS = 32, 2, 4
#: Flat unpack (K == Kp: one stream of 64-weight groups) instead of the byte tiles: groups a
#: program and warps; 0 groups = off. 16 groups, 2 warps: 66.1 us an 18944 x 3584 matrix on the
#: H200 (3.6 TB/s, a bf16 copy_ of it 65.8 us) against 88.8 us for the byte tiles (run 24).
UNPACK_FLAT_G, UNPACK_FLAT_WARPS = 16, 2


#: tc builds bf16 pairs with one prmt.b32 each instead of one a weight (10% fewer instructions in
#: the static loop). Off: written after the session's device time was spent, so neither checked
#: on a GPU (the interpreter cannot run PTX) nor timed; tests/kernels/test_linear.py has the GPU
#: test that turns it on (benchmarks/notes-kernels.md, "Next device call").
TC_PAIRS = False


# packed: fixed12 [N, K] (lo uint8 [N, Kp], code uint8 [N, Kp/2], base uint8 [1]) -> bf16 [N, K]
def unpack(p: Packed, out: torch.Tensor | None = None) -> torch.Tensor:
    n, k = p.shape
    a = p.arrays
    kp = a["lo"].shape[1]
    C.check_size("fixed12 'lo'", n * kp)
    prep = prepare(p)
    if out is None:
        out = torch.empty(n, k, dtype=torch.bfloat16, device=a["lo"].device)
    elif out.shape != (n, k) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [{n}, {k}] tensor, got {out.dtype} {tuple(out.shape)}")
    if UNPACK_WORDS and n and k and k == kp and kp % (64 * UNPACK_G) == 0:
        # whole rows: word tiles in, bf16 pairs out (rows past N rewrite row N-1 with its own bits)
        grid = (triton.cdiv(n, UNPACK_BN), kp // (64 * UNPACK_G))
        _unpack_words_kernel[grid](a["code"].view(torch.int32), a["lo"].view(torch.int32), a["base"],
                                   out.view(torch.int32), n, kp, BN=UNPACK_BN, G=UNPACK_G,
                                   PRMT=not C.interpreting(), num_warps=UNPACK_WARPS)
        if prep.nexc:
            out.view(torch.int16).view(-1)[prep.pos] = prep.vals
    elif UNPACK_FLAT_G and n and k and k == kp:
        ng = n * kp // 64
        _unpack_flat_kernel[(triton.cdiv(ng, UNPACK_FLAT_G),)](a["code"], a["lo"], a["base"], out.view(torch.int16),
                                                               ng, BG=UNPACK_FLAT_G, num_warps=UNPACK_FLAT_WARPS)
        if prep.nexc:
            out.view(torch.int16).view(-1)[prep.pos] = prep.vals
    elif n and k:
        bn, g = UNPACK_BYTES_BN, UNPACK_BYTES_G
        grid = (triton.cdiv(n, bn), triton.cdiv(kp, 64 * g))
        _unpack_kernel[grid](a["code"], a["lo"], a["base"], out.view(torch.int16), n, k, kp, BN=bn, G=g,
                             num_warps=UNPACK_BYTES_WARPS)
        if prep.nexc:
            out.view(torch.int16).view(-1)[prep.pos] = prep.vals
    return out


# packed: fixed12 [N, K], rows r0:r1 -> out bf16 [r1 - r0, K] (written, contiguous)
def _unpack_rows(p: Packed, prep: Prepared, r0: int, r1: int, out: torch.Tensor) -> None:
    n, k = p.shape
    a = p.arrays
    kp = a["lo"].shape[1]
    rows = r1 - r0
    if out.shape != (rows, k) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{rows}, {k}] tensor, got {tuple(out.shape)}")
    bn, g = UNPACK_BYTES_BN, UNPACK_BYTES_G
    grid = (triton.cdiv(rows, bn), triton.cdiv(kp, 64 * g))
    _unpack_kernel[grid](a["code"][r0:r1], a["lo"][r0:r1], a["base"], out.view(torch.int16), rows, k, kp, BN=bn,
                         G=g, num_warps=UNPACK_BYTES_WARPS)
    if prep.nexc:
        e0, e1 = prep.rowptr_host[r0], prep.rowptr_host[r1]
        if e1 > e0:
            out.view(torch.int16).view(-1)[prep.pos[e0:e1] - r0 * k] = prep.vals[e0:e1]


# x: bf16 [M, K]; packed: fixed12 [N, K]; bias: [N] or None; out: bf16 [M, N] (written) -> out
def _linear_chunked(x2: torch.Tensor, p: Packed, bias, chunk: int, out: torch.Tensor) -> torch.Tensor:
    # Long prompts, `chunk` weight rows at a time: the bf16 chunk is written by the unpack and
    # read back by cuBLAS while it is still in L2. cuBLAS writes each chunk's columns of out in
    # place (a row stride of N is a valid leading dimension), with the bias in its epilogue.
    n, k = p.shape
    prep = prepare(p)
    buf = C.scratch(x2.device, min(chunk, n) * k)
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        w = buf[:(r1 - r0) * k].view(r1 - r0, k)
        _unpack_rows(p, prep, r0, r1, w)
        if bias is None:
            torch.mm(x2, w.t(), out=out[:, r0:r1])
        else:
            torch.addmm(bias[r0:r1].to(out.dtype), x2, w.t(), out=out[:, r0:r1])
    return out


@functools.lru_cache(maxsize=1)
def gluon_available() -> bool:
    """True where the Gluon kernel can run: a CUDA GPU, not the interpreter, a Triton with Gluon."""
    if C.interpreting() or not torch.cuda.is_available():
        return False
    try:
        from glyd.kernels import fixed12_gluon  # noqa: F401
    except ImportError as exc:
        log.info("no Gluon kernel (%s): the tc kernel runs instead", exc)
        return False
    return True


@functools.lru_cache(maxsize=1)
def wg_available() -> bool:
    """True where the wgmma kernel (``fixed12_wg``) can run: Gluon on a Hopper GPU (sm_90)."""
    if not (gluon_available() and torch.cuda.is_available()) or torch.cuda.get_device_capability()[0] != 9:
        return False
    try:
        from glyd.kernels import fixed12_wg  # noqa: F401
    except ImportError as exc:
        log.info("no wgmma kernel (%s)", exc)
        return False
    return True


@functools.lru_cache(maxsize=1)
def ws_available() -> bool:
    """True where the warp-specialized wgmma kernel (``fixed12_ws``: TMA, mbarriers) can run."""
    if not wg_available():
        return False
    try:
        from glyd.kernels import fixed12_ws  # noqa: F401
    except ImportError as exc:
        log.info("no warp-specialized wgmma kernel (%s)", exc)
        return False
    return True


def default_config(m: int, n: int, k: int) -> C.Config:
    """Block shapes per M bucket and matrix shape: the fastest of the configs timed on the H200 on
    2026-11-30 (``benchmarks/sweep_shapes.py`` per shape, ``benchmarks/kernels.py`` per decode
    step; benchmarks/notes-kernels.md lists every variant)."""
    if m >= LONG_M:
        return C.Config(long=True)
    small = n * k <= 1 << 24  # q, k, v, o of a 7B model: too few tiles to fill the GPU
    tall = k >= 8192 and k > n  # down projections
    if m <= 2:
        # group-major GEMV, one decoded tile for m x rows (sweep run 16: 0.77x bf16 on gate/up,
        # 0.69x on the lm_head, 0.98x on down, 1.03-1.35x on q/o and k/v at M = 1; the mma
        # kernel took 1.7-2.1x at M = 2)
        # k/v, and down at M = 1: exceptions in a pass beside the tile kernel (sweep run 37: k/v
        # 1.05-1.14x -> 0.83x, down 0.93x -> 0.84x; it costs 0.06-0.19 on the others)
        tiny = n * k <= 1 << 22
        qo = small and not tiny
        # a merged q|k|v (N a little over K): half the split-K programs, sweep round 37 (run 95)
        qkv = qo and k < n <= 2 * k
        if m == 2 and tall and k % 256 == 0 and gluon_available() and wg_available():
            # down: the wgmma tile of M = 3-8 (below), round 39 (run 102): 0.936x against 0.972x
            return C.Config(bm=8, bn=64, bk=128, gluon=True, wg=True, warps=4, waves=4, exc_tile=True, pipe=True)
        # M = 2 on the Gluon tile but for lm_heads (the GEMV: 0.82x against 0.84-0.86x, round 22)
        if m == 2 and (qo or not small) and n < 65536 and k % 128 == 0 and gluon_available():
            # gate/up, down and q/o: bn 32 with x rows 0-7 loaded in their step (round 21, run 51):
            # 0.96x against the GEMV's 1.03x and 0.98x; q/o 0.90x against 0.92x (rounds 21-22)
            return C.Config(bm=16, bn=32, bk=128, gluon=True, warps=4, waves=4 if tall else 8, prefetch=True,
                            exc_tile=True, x_ahead=False, x_rows8=True)
        if m == 2 and n >= 65536 and k % 128 == 0 and gluon_available() and ws_available():
            # lm_heads: the ws tile of M = 3-8 (below), round 38 (run 100): 0.815x against the GEMV's
            # 0.94-0.97x in the same run (0.82x in round 22)
            return C.Config(bm=8, bn=64, bk=128, gluon=True, wg=True, ws=True, warps=4, stages=2, waves=3,
                            exc_tile=True, maxnreg=80)
        if m == 2 and tiny and k % 128 == 0 and gluon_available():
            # k/v: the M = 3-16 tile (bn 32, the ring): 0.82-0.89x against 0.84-0.91x (rounds 19, 22)
            return C.Config(bm=16, bn=32, bk=128, gluon=True, warps=4, waves=8, prefetch=True, ring=2, ring_x=True,
                            exc_tile=True)
        if m == 1 and qo and k % 128 == 0 and gluon_available():
            # the Gluon tile with 15 padded MMA rows: 0.90x against the GEMV's 0.95x (round 19,
            # run 50); the GEMV stays on k/v, gate/up, down and lm_heads (0.78-0.82x against 0.87-0.99x);
            # the merged qkv with 2 programs an SM: 1.185x against 1.254x (round 37)
            return C.Config(bm=16, bn=64, bk=128, gluon=True, warps=4, waves=2 if qkv else 8, prefetch=True,
                            exc_tile=True)
        if small:  # one K step a program: the most programs in flight
            steps = max(1, -(-(-(-k // 64) * 64) // 256))
            return C.Config(bm=m, bn=16, bk=256, dot=False, group_major=True, stages=1, split=steps, exc_pass=tiny)
        return C.Config(bm=m, bn=16 if tall else 32, bk=256, dot=False, group_major=True, stages=1, waves=16,
                        exc_pass=tall and m == 1)
    tiny = n * k <= 1 << 22  # k and v projections
    wide = n >= 65536  # lm_heads
    qkv = small and not tiny and k < n <= 2 * k  # a merged q|k|v
    # The Gluon kernel with register prefetch (sweep runs 30-33, 2026-12-01): at M = 3-8 on down
    # 1.09-1.24x against 1.25-1.65x, q/o (M > 4) 1.30x against 1.69x, lm_heads 1.16-1.33x against
    # 1.21-1.39x; at M = 9-16 on k/v 1.34-1.36x against 1.58x, q/o 1.39x against 1.71-1.73x, down
    # 1.23-1.26x against 1.64-1.68x. Needs a CUDA GPU, Triton's Gluon and whole K steps.
    # Sweep round 14 (2026-12-01) moved every shape at M = 3-8 to it: k/v 0.88-0.99x against
    # 0.95-1.02x (GEMV), q/o at M = 4 1.13x against 1.26x, gate/up 1.20-1.33x against 1.28-1.40x (tc);
    # and at M = 9-16 gate/up and lm_heads to the async-copy ring with x in it (Config.ring 3,
    # ring_x): 1.36x against 1.44x and 1.345x against 1.37x.
    # Sweep round 17 (run 45): the exceptions inside the tile kernel (Config.exc_tile: the first
    # 16 of a tile's rows loaded before the K loop, summed by a one-hot MMA) instead of the pass
    # beside it: lm_heads 1.07-1.11x against 1.28-1.35x at M = 4-16 and 1.18x against 1.44x at
    # M = 32; k/v 0.90x / 1.03x against 1.22x / 1.40x at M = 32 / 64; q/o 0.98x, 1.42x, 1.97x
    # against 1.14x, 1.54x, 2.34x at M = 16 / 32 / 64; gate/up 1.29x against 1.74x at M = 32;
    # down 1.14x / 1.81x against 1.18x / 1.85x at M = 16 / 64.
    # Sweep round 18 (run 47) then found exc_tile faster on the rest at M = 3-16 with other tiles:
    # k/v bn 32 with the ring (0.80-0.93x against 0.90-1.01x), q/o and gate/up bn 64 4 warps
    # (0.94-0.95x against 1.13-1.15x; gate/up 0.95x / 1.07x / 1.12x against 1.20x / 1.33x /
    # 1.35x at M = 4 / 8 / 16), down bn 64 2 warps at M = 4 (0.95x against 1.00x) and bn 32 with
    # the ring at M = 8 (1.07x against 1.13x).
    # Round 20 (run 50): down with half the split-K programs (waves 4: longer K loops) at M = 2-64,
    # 0.95x / 0.96x / 1.06x / 1.13x / 1.58x against 1.01x / 1.04x / 1.08x / 1.19x / 1.69x at M = 2 /
    # 4 / 16 / 32 / 64; k/v ring 2 at M = 17-32 (0.87x against 0.93x with ring 3).
    gl_ok = k % 128 == 0 and gluon_available()
    wv = 4 if tall else 8
    # The wgmma tile (fixed12_wg: the decoded weights as the register operand, x from shared
    # memory, exceptions in the tile), sweep round 27 (runs 66-69): lm_heads at M = 3-16 0.93x
    # against 0.94-0.97x (no MMA in flight), gate/up at M = 4-16 0.92-0.95x against 0.94-1.10x
    # (the same), down at M = 3-16 0.96-1.03x against 0.98-1.07x (one MMA in flight); at
    # M = 17-32 gate/up 1.15x against 1.31x, lm_heads 1.04x against 1.07x; at M = 33-64 lm_heads
    # 1.35x against 1.53x, down 1.53x against 1.67x, q/o 1.80x against 1.95x. It loses on k/v
    # everywhere and on q/o up to M = 32; gate/up at M = 33-64 is a tie (tc stays).
    wg_ok = gl_ok and k % 256 == 0 and wg_available()
    gate = not (small or tall or wide)  # gate/up-like: large N, short K
    # The warp-specialized wgmma tile (fixed12_ws: a TMA warp fills a ring, a persistent stream-K
    # grid), sweep round 28 (run 78): lm_heads at M = 4-8 0.82x against 0.94x, M = 16 0.86x
    # against 0.95x, M = 32 0.92x against 1.04x, M = 64 1.00x against 1.36x; gate/up at M = 64
    # 1.48x against 1.79x (tc). It loses on gate/up up to M = 32 (0.96-1.17x against
    # 0.93-1.12x) and on q/o, down and k/v everywhere (their copy of x and too few steps).
    # Round 29 (run 82): three programs an SM with a ring of 2 (80 registers) beat two with a
    # ring of 3-4: lm_heads 0.815x / 0.826x / 0.884x / 0.951x at M = 4 / 16 / 32 / 64 against
    # 0.819x / 0.868x / 0.932x / 0.997x, gate/up at M = 64 1.458x against 1.498x.
    # Round 36 (run 93): on the merged gate_up (37888 x 3584) it beats the wgmma tile at M = 4-8 and
    # 32 (0.858x / 0.869x / 0.975x against 0.895x / 0.897x / 1.112x) and ties at M = 16 (0.876x
    # against 0.893x; round 35: 0.925x against 0.910x), so every "big" matrix takes it from M = 3.
    big = n * k >= 1 << 27 and not tall
    if gl_ok and ((wide or big) and 3 <= m <= 64 or gate and 32 < m <= 64) and ws_available():
        bt = 8 if m <= 8 else 16 if m <= 16 else 32 if m <= 32 else 64
        return C.Config(bm=bt, bn=64, bk=128, gluon=True, wg=True, ws=True, warps=4, stages=2, waves=3,
                        exc_tile=True, maxnreg=80)
    if wg_ok and ((wide and 3 <= m <= 16) or (gate and 4 <= m <= 16)):
        return C.Config(bm=16, bn=64, bk=128, gluon=True, wg=True, warps=4, waves=2 if wide else 4, exc_tile=True)
    if wg_ok and tall and 3 <= m <= 16:
        # bm 8 (wgmma's N = 8) at M <= 8, round 27 (run 80): 0.875x against 0.90-0.93x
        return C.Config(bm=8 if m <= 8 else 16, bn=64, bk=128, gluon=True, wg=True, warps=4, waves=4, exc_tile=True,
                        pipe=True)
    if wg_ok and 16 < m <= 32 and not (small or tall):
        return C.Config(bm=32, bn=64, bk=128, gluon=True, wg=True, warps=4, waves=2, exc_tile=True, pipe=True)
    if wg_ok and 32 < m <= 64 and (wide or tall or (small and not tiny)):
        return C.Config(bm=64, bn=64, bk=128, gluon=True, wg=True, warps=4, waves=2, exc_tile=True, pipe=True)
    if gl_ok and m <= 16:
        if tiny:
            return C.Config(bm=16, bn=32, bk=128, gluon=True, warps=4, waves=8, prefetch=True, ring=2, ring_x=True,
                            exc_tile=True)
        if wide:  # bn 64 2 warps (round 19, run 50): 0.99-1.03x against 1.09-1.13x (bn 32)
            return C.Config(bm=16, bn=64, bk=128, gluon=True, warps=2, waves=8, prefetch=True, exc_tile=True)
        if tall and 4 < m <= 8:  # x rows 0-7 only (round 21, run 51): 0.99x against 1.05x (the ring)
            return C.Config(bm=16, bn=64, bk=128, gluon=True, warps=4, waves=wv, prefetch=True, exc_tile=True,
                            x_rows8=True)
        if tall:  # bn 64 2 warps; at M = 9-16 with waves 4 1.03x against 1.07x (bn 32 ring, round 22)
            return C.Config(bm=16, bn=64, bk=128, gluon=True, warps=2, waves=wv, prefetch=True, exc_tile=True)
        if not small and m <= 8:  # gate/up: bn 32, x rows 0-7 in their step (round 21, run 51):
            # 0.96x / 1.00x against 1.06x / 1.09x at M = 4 / 8
            return C.Config(bm=16, bn=32, bk=128, gluon=True, warps=4, waves=8, prefetch=True, exc_tile=True,
                            x_ahead=False, x_rows8=True)
        # gate/up at M = 9-16: split-K summed in the kernel (Config.fixup), 1.10x against 1.12x in
        # sweep rounds 24-26 (runs 56-58); it lost on every other Gluon shape at M = 2-16. The
        # merged qkv with 2 programs an SM (round 37, run 95): 1.230x / 1.252x / 1.284x against
        # 1.295x / 1.316x / 1.408x at M = 4 / 8 / 16
        return C.Config(bm=16, bn=64, bk=128, gluon=True, warps=4, waves=2 if qkv else 8, prefetch=True,
                        exc_tile=True, fixup=not small)
    if gl_ok and m <= 32:
        # x tiles in the async ring (sweep round 15, run 41), exceptions in the tile (round 17)
        if tiny:
            return C.Config(bm=32, bn=32, bk=128, gluon=True, warps=4, waves=8, prefetch=True, ring=2, ring_x=True,
                            exc_tile=True)
        # bn 64 4 warps ring 2 on the rest (round 19, run 50): q/o 1.18x against 1.42x, down 1.22x
        # against 1.40x (2 warps ring 3), lm_heads 1.13x against 1.19x (ring 3)
        return C.Config(bm=32, bn=64, bk=128, gluon=True, warps=4, waves=wv, prefetch=True, ring=2, ring_x=True,
                        exc_tile=True)
    if gl_ok and m <= 64 and (small or tall):  # gate/up and lm_heads keep tc (1.81-1.82x, 1.53-1.54x)
        return C.Config(bm=64, bn=32 if tiny else 64, bk=128, gluon=True, warps=4, waves=wv, prefetch=True, ring=2,
                        ring_x=True, exc_tile=True)
    if m <= 4 and not (small or tall):  # tensor cores fed from register loads: 1.20-1.29x (sweep run 18)
        return C.Config(bm=16, bn=64, bk=256, tc=True, warps=4, waves=8, stages=1)
    if m <= 4 or (m <= 8 and tiny):  # four x rows a program: 1.32-1.59x against 1.73-2.09x (mma)
        # k/v with the exception pass beside: 0.92-0.96x against 1.24x (run 37)
        return C.Config(bm=4, bn=16, bk=128, dot=False, group_major=True, stages=1, waves=8, exc_pass=tiny)
    # tc from here to M = 64, per shape as sweep runs 18 and 21 measured it (ratios at M = 8-16 /
    # 32 / 64): q/o and k/v want narrow tiles (bn 16, then bk 128 pipelined: the most programs),
    # down the register prefetch, gate/up and the lm_head bn 64; at M = 64 bk 128 (bk 256 needs
    # 255 registers at bm 64: two programs an SM).
    if m <= 16:
        if small:  # k/v 1.60x, q/o 1.73-1.75x
            return C.Config(bm=16, bn=16, bk=256, tc=True, warps=4, waves=8, stages=1)
        if tall:  # 1.70-1.72x
            return C.Config(bm=16, bn=32, bk=256, tc=True, warps=4, waves=8, stages=1, prefetch=True)
        return C.Config(bm=16, bn=64, bk=256, tc=True, warps=4, waves=8, stages=1)  # 1.37-1.42x
    if m <= 32:
        if wide:  # 1.44x against 1.66x (tc)
            return C.Config(bm=32, bn=64, mma=True, g=2, stages=3)
        if small:  # 1.76-1.86x; k/v with exceptions in their own pass 1.35x against 1.69x (run 33)
            return C.Config(bm=32, bn=32, bk=128, tc=True, warps=4, waves=8, stages=3, exc_pass=tiny,
                            exc_after=tiny)  # after, not beside: 1.36x against 2.00x (run 37)
        if tall:  # 1.85x
            return C.Config(bm=32, bn=32, bk=256, tc=True, warps=4, waves=8, stages=1, prefetch=True)
        return C.Config(bm=32, bn=64, bk=256, tc=True, warps=4, waves=8, stages=1)  # 1.68x
    if m <= 64:
        if small or tall:  # 1.79x k/v (1.39x with exc_pass, run 33), 2.34x q/o, 1.97x down
            return C.Config(bm=64, bn=32, bk=128, tc=True, warps=4, waves=8, stages=3, exc_pass=tiny,
                            exc_after=tiny)
        return C.Config(bm=64, bn=64, bk=128, tc=True, warps=4, waves=8, stages=1)  # 1.53-1.83x (from 2.18-2.45x)
    return C.Config(bm=128, bn=128, bk=128, warps=8, stages=3)


#: From this M on, unpack into a reused scratch buffer and call cuBLAS: at M = 512 and 2048 it
#: measured 5x and 7x faster than the fused tile kernel (benchmarks/notes-kernels.md).
LONG_M = 256


# x: bf16 [..., K]; packed: fixed12 [N, K]; bias: [N] or None -> bf16 [..., N]
def linear(x: torch.Tensor, p: Packed, bias: torch.Tensor | None = None, config: C.Config | None = None) -> torch.Tensor:
    if not isinstance(p, Packed) or p.layout != _codec.NAME:
        raise TypeError("packed must be a fixed12 glyd.Packed")
    n, k = p.shape
    x2 = C.check_x(x, k)
    C.check_device(p, x2)
    bias = C.check_bias(bias, n, x2.device)
    m = x2.shape[0]
    a = p.arrays
    kp = a["lo"].shape[1]
    C.check_size("fixed12 'lo'", n * kp)
    C.check_size("output", m * n)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x2.device)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    if k == 0:  # an empty sum: just the bias
        out.zero_()
        if bias is not None:
            out += bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], n)
    cfg = config or default_config(m, n, k)
    if cfg.long and cfg.chunk and n > cfg.chunk:
        return _linear_chunked(x2, p, bias, cfg.chunk, out).reshape(*x.shape[:-1], n)
    if cfg.long:
        w = unpack(p, C.scratch(x2.device, n * k).view(n, k))
        return torch.nn.functional.linear(x2, w, bias).reshape(*x.shape[:-1], n)
    gemv = cfg.group_major and cfg.stages == 1 and cfg.gemv
    if gemv and cfg.bm > 16:
        raise ValueError("the group-major GEMV takes up to bm = 16 activation rows a program")
    if (not cfg.dot and not cfg.byte and not gemv
            and (cfg.bm not in (1, 2, 4) or (cfg.bm > 1 and not cfg.group_major))):
        raise ValueError("the FMA path takes bm = 1, or bm = 2 or 4 activation rows a program with group_major")
    prep = prepare(p)
    if cfg.byte:
        return _launch_gemv_bytes(x2, p, bias, cfg, prep, out).reshape(*x.shape[:-1], n)
    if cfg.mma:
        return _launch_mma(x2, p, bias, cfg, prep, out).reshape(*x.shape[:-1], n)
    if cfg.ws:
        from glyd.kernels import fixed12_ws  # Gluon on Hopper: imported only when asked for

        return fixed12_ws.launch(x2, p, bias, cfg, prep, out).reshape(*x.shape[:-1], n)
    if cfg.wg:
        from glyd.kernels import fixed12_wg  # Gluon on Hopper: imported only when asked for

        return fixed12_wg.launch(x2, p, bias, cfg, prep, out).reshape(*x.shape[:-1], n)
    if cfg.gluon:
        from glyd.kernels import fixed12_gluon  # Gluon: imported only when asked for

        return fixed12_gluon.launch(x2, p, bias, cfg, prep, out).reshape(*x.shape[:-1], n)
    if cfg.tc:
        return _launch_words(x2, p, bias, cfg, prep, out, tc=True).reshape(*x.shape[:-1], n)
    if gemv:
        return _launch_words(x2, p, bias, cfg, prep, out, tc=False).reshape(*x.shape[:-1], n)
    tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, cfg.bm)
    split, per = C.choose_split(tiles, kp, cfg.bk, x2.device, cfg.split, cfg.waves)
    partial = split > 1
    dst = torch.empty(split, m, n, dtype=torch.float32, device=x2.device) if partial else out
    fixup = partial and cfg.fixup
    cnt = C.counters(x2.device, tiles) if fixup else out
    grid = (triton.cdiv(n, cfg.bn), split, triton.cdiv(m, cfg.bm))
    _linear_kernel[grid](
        x2, a["code"].view(torch.int32), a["lo"].view(torch.int32), a["lo"], a["base"], prep.rowptr,
        a["exc_idx"], a["exc_hi"], bias if bias is not None else out, dst, out, cnt,
        m, n, k, kp, x2.stride(0), per, kp // 8, kp // 4,
        BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, DOT=cfg.dot, HAS_BIAS=bias is not None,
        HAS_EXC=prep.nexc > 0, PARTIAL=partial, F32DOT=C.interpreting(),
        GROUP_MAJOR=cfg.group_major, STAGES=cfg.stages, FIXUP=fixup, num_warps=cfg.warps, num_stages=cfg.stages,
    )
    if partial and not fixup:
        C.finalize(dst, bias, out)
    return out.reshape(*x.shape[:-1], n)


EXC_ROWS = 4  # weight rows an exception program corrects (swept: 4 against 16 and 64)
EXC_WARPS = 4
EXC_CHUNK = 16  # exceptions loaded at once (their loads overlap instead of queueing one by one)


@isolated
@triton.jit
def _exception_kernel(part_ptr, x_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, lo_ptr, base_ptr, M, N, K, stride_lo, stride_xm,
                      BM_: tl.constexpr, BN_: tl.constexpr, E: tl.constexpr, ADD: tl.constexpr):
    # part[0][rows, cols] += (true - decoded weight) * x summed over the exceptions of BN_ weight
    # rows, E exceptions a step: a row of a long matrix (down: K 18944) holds ~1.4 of them in
    # random weights, and one by one each costs two dependent memory round trips.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rn = pid_n * BN_ + tl.arange(0, BN_)
    rm = pid_m * BM_ + tl.arange(0, BM_)
    mmask = rm < M
    base = tl.load(base_ptr).to(tl.uint32)
    e0 = tl.load(rowptr_ptr + pid_n * BN_)
    e1 = tl.load(rowptr_ptr + tl.minimum(pid_n * BN_ + BN_, N))
    delta = tl.zeros([BN_, BM_], dtype=tl.float32)
    for eb in range(e0, e1, E):
        e = eb + tl.arange(0, E)
        em = e < e1
        idx = tl.load(eidx_ptr + e, mask=em, other=0).to(tl.int64)
        r = idx // K
        c = idx - r * K
        th = tl.load(ehi_ptr + e, mask=em, other=0).to(tl.uint32)
        lo = tl.load(lo_ptr + r * stride_lo + c, mask=em, other=0).to(tl.uint32)
        tv = ((th << 24) | (lo << 16)).to(tl.float32, bitcast=True)
        pv = ((((th & 0x80) | base) << 24) | (lo << 16)).to(tl.float32, bitcast=True)
        xv = tl.load(x_ptr + rm[None, :] * stride_xm + c[:, None], mask=em[:, None] & mmask[None, :],
                     other=0.0).to(tl.float32)  # [E, BM_]
        d = xv * tv[:, None] - xv * pv[:, None]
        hit = (rn.to(tl.int64)[:, None] == r[None, :]) & em[None, :]  # [BN_, E]
        delta += tl.sum(tl.where(hit[:, :, None], d[None, :, :], 0.0), axis=1)
    ptr = part_ptr + rm[None, :] * N + rn[:, None]
    omask = mmask[None, :] & (rn < N)[:, None]
    if ADD:
        delta += tl.load(ptr, mask=omask, other=0.0)
    tl.store(ptr, delta, mask=omask)  # ADD False: a partial of its own (zeros where no exception)


# part: fp32 [>= 1, M, N] (part[0] corrected in place, or written when add is False); x: bf16 [M, K];
# packed fixed12 [N, K]
def add_exceptions(part: torch.Tensor, x2: torch.Tensor, p, prep, add: bool = True) -> None:
    m, k = x2.shape
    n = p.shape[0]
    a = p.arrays
    if part.dtype != torch.float32 or part.dim() != 3 or tuple(part.shape[1:]) != (m, n) or not part.is_contiguous():
        raise ValueError(f"part must be contiguous float32 [splits, {m}, {n}], got {part.dtype} {tuple(part.shape)}")
    if prep.nexc or not add:
        grid = (triton.cdiv(n, EXC_ROWS), triton.cdiv(m, 16))
        _exception_kernel[grid](part, x2, prep.rowptr, a["exc_idx"], a["exc_hi"], a["lo"], a["base"], m, n, k,
                                a["lo"].shape[1], x2.stride(0), BM_=16, BN_=EXC_ROWS, E=EXC_CHUNK, ADD=add,
                                num_warps=EXC_WARPS)


#: CUDA: the separate exception pass (Gluon, Config.exc_pass) writes a partial of its own on a side
#: stream while the tile kernel runs (in a CUDA graph a parallel branch), filling the tile kernel's
#: last wave instead of running after it (sweep run 36: k/v M = 16 1.35x -> 0.94x, q/o 1.31-1.38x ->
#: 1.15x, down 1.09-1.27x -> 1.01-1.18x)
CONCURRENT_EXC = True


@functools.lru_cache(maxsize=None)
def _side_stream(device: torch.device) -> "torch.cuda.Stream":
    return torch.cuda.Stream(device)


# own: fp32 [1, M, N] (written: the corrections alone) -> join(), to call after the tile kernel
def exceptions_on_side_stream(own: torch.Tensor, x2: torch.Tensor, p, prep):
    cur = torch.cuda.current_stream(x2.device)
    side = _side_stream(x2.device)
    side.wait_stream(cur)  # x and the partial buffer are ready
    with torch.cuda.stream(side):
        add_exceptions(own, x2, p, prep, add=False)

    def join() -> None:
        # everything after on this stream, and any reuse of the buffers it frees, waits for the pass
        cur.wait_stream(side)

    return join


# x: bf16 [M, K]; packed: fixed12 [N, K]; out: bf16 [M, N] (written) -> out
def _launch_words(x2: torch.Tensor, p: Packed, bias, cfg: C.Config, prep: Prepared, out: torch.Tensor, tc: bool):
    # The two kernels on group-major word tiles: the GEMV (tc False) and the tensor-core tile.
    m, k = x2.shape
    n = p.shape[0]
    a = p.arrays
    kp = a["lo"].shape[1]
    tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, cfg.bm)
    split, per = C.choose_split(tiles, kp, cfg.bk, x2.device, cfg.split, cfg.waves)
    exc_pass = cfg.exc_pass and prep.nexc > 0  # exceptions in a pass of their own, on fp32 partials
    side = exc_pass and CONCURRENT_EXC and not cfg.exc_after and x2.is_cuda and not C.interpreting()
    partial = split > 1 or exc_pass
    dst = torch.empty(split + side, m, n, dtype=torch.float32, device=x2.device) if partial else out
    if side:
        join = exceptions_on_side_stream(dst[split:], x2, p, prep)
    even = k == kp and per % cfg.bk == 0 and kp % cfg.bk == 0
    if not tc:  # the GEMV also reads x as bf16 pairs: 4-byte aligned rows
        even = even and x2.stride(0) % 2 == 0 and x2.data_ptr() % 4 == 0
    fixup = partial and cfg.fixup and not exc_pass
    cnt = C.counters(x2.device, tiles) if fixup else out
    grid = (triton.cdiv(n, cfg.bn), split, triton.cdiv(m, cfg.bm))
    args = (a["code"].view(torch.int32), a["lo"].view(torch.int32), a["lo"], a["base"], prep.rowptr, a["exc_idx"],
            a["exc_hi"], bias if bias is not None else out, dst, out, cnt,
            m, n, k, kp, x2.stride(0), per, kp // 8, kp // 4)
    meta = dict(BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, EVEN=even, PRMT=not C.interpreting(), HAS_BIAS=bias is not None,
                HAS_EXC=prep.nexc > 0 and not exc_pass, PARTIAL=partial, FIXUP=fixup, PREFETCH=cfg.prefetch,
                num_warps=cfg.warps)
    flags = 0 if side else C.pdl_flags(x2.device)  # (a side-stream pass joins by events: plain launches)
    if flags:
        meta.update(PDL=flags, **({"launch_pdl": True} if flags & 1 else {}))
    if tc:  # stages > 1: Triton's software pipelining (async copies through shared memory)
        _tc_kernel[grid](x2, *args, F32DOT=C.interpreting(), PAIRS=TC_PAIRS, num_stages=cfg.stages, **meta)
    else:
        _gemv_gm_kernel[grid](x2, x2.view(torch.int32) if even else x2, *args, num_stages=1, **meta)
    if side:
        join()
    elif exc_pass:
        add_exceptions(dst, x2, p, prep)
    if partial and not fixup:
        C.finalize(dst, bias, out)
    return out


# x: bf16 [M, K]; packed: fixed12 [N, K]; out: bf16 [M, N] (written) -> out
def _launch_gemv_bytes(x2: torch.Tensor, p: Packed, bias, cfg: C.Config, prep: Prepared, out: torch.Tensor):
    m, k = x2.shape
    n = p.shape[0]
    a = p.arrays
    kp = a["lo"].shape[1]
    step = 64 * cfg.g
    split, per = C.choose_split(triton.cdiv(n, cfg.bn) * m, kp, step, x2.device, cfg.split, cfg.waves)
    partial = split > 1
    dst = torch.empty(split, m, n, dtype=torch.float32, device=x2.device) if partial else out
    even = k == kp and per % step == 0 and kp % step == 0
    fixup = partial and cfg.fixup
    cnt = C.counters(x2.device, triton.cdiv(n, cfg.bn) * m) if fixup else out
    grid = (m, triton.cdiv(n, cfg.bn), split)
    _gemv_bytes_kernel[grid](
        x2, a["code"], a["lo"], a["base"], prep.rowptr, a["exc_idx"], a["exc_hi"],
        bias if bias is not None else out, dst, out, cnt,
        m, n, k, kp, x2.stride(0), per, kp // 2, kp,
        BN=cfg.bn, G=cfg.g, EVEN=even, HAS_BIAS=bias is not None, HAS_EXC=prep.nexc > 0, PARTIAL=partial,
        STAGES=cfg.stages, FIXUP=fixup, num_warps=cfg.warps, num_stages=cfg.stages,
    )
    if partial and not fixup:
        C.finalize(dst, bias, out)
    return out


# x: bf16 [M, K]; packed: fixed12 [N, K]; out: bf16 [M, N] (written) -> out
def _launch_mma(x2: torch.Tensor, p: Packed, bias, cfg: C.Config, prep: Prepared, out: torch.Tensor):
    m, k = x2.shape
    n = p.shape[0]
    a = p.arrays
    kp = a["lo"].shape[1]
    g = cfg.g
    while (kp // 64) % g:  # whole steps only: a split never reads past the row's padding
        g //= 2
    step = 64 * g
    tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, cfg.bm)
    split, per = C.choose_split(tiles, kp, step, x2.device, cfg.split, cfg.waves)
    partial = split > 1
    dst = torch.empty(split, m, n, dtype=torch.float32, device=x2.device) if partial else out
    even = k == kp
    fixup = partial and cfg.fixup
    cnt = C.counters(x2.device, tiles) if fixup else out
    grid = (triton.cdiv(n, cfg.bn), split, triton.cdiv(m, cfg.bm))
    _mma_kernel[grid](
        x2, a["code"], a["lo"], prep.rowptr, a["exc_idx"], a["exc_hi"], bias if bias is not None else out, dst,
        out, cnt,
        m, n, k, kp, x2.stride(0), per, kp // 2, kp,
        BASE=prep.base, BM=cfg.bm, BN=cfg.bn, G=g, EVEN=even, HAS_BIAS=bias is not None,
        HAS_EXC=prep.nexc > 0, PARTIAL=partial, F32DOT=C.interpreting(), FIXUP=fixup, num_warps=cfg.warps,
        num_stages=cfg.stages,
    )
    if partial and not fixup:
        C.finalize(dst, bias, out)
    return out
