"""dense11 format version 2's ``code`` and ``sm`` arrays in a coalesced order, and a copy of its fused
GEMV that reads them (issue 35; the probe is ``probe_dense11_coalesce.py``). Research: not in ``src/``.

Why: the 2026-12-05 Nsight Compute profile (``benchmarks/history/2026-12-05-h200-7.md``, calls 4 and
6) had 54% of the M = 1 GEMV's global sectors excessive. A thread holds one run of 32 weights and the
GEMV's [BN, W] tiles have their lanes along W (runs of one row): in version 2's order a run's three
code words sit at +0/+4/+8 of 12 bytes (adjacent lanes 12 bytes apart: each LDG.32 of a warp touches
~3x the sectors it uses) and its 32 ``sm`` bytes are read as two 16-byte halves 32 bytes apart (LDG.128,
half of each sector pair unused).

The coalesced order (``relayout``) moves values only inside each row's 1024-column block (the escape
block: its first rank comes from the offsets, so nothing else changes): for a block of ``RB`` runs
(32, or fewer in a row's last, partial block)

- ``code``: the block's ``c0`` words of runs 0 .. RB-1, then its ``c1`` words, then its ``c2`` words;
- ``sm``: the first 16-byte halves (columns 0-15) of runs 0 .. RB-1, then the second halves.

A step's W consecutive runs (any BK dividing 1024: a step never crosses a block) then read W
consecutive words of each plane and W consecutive 16-byte halves: 8 lanes of a row take 32 (code) and
128 (sm) contiguous bytes, one and four whole sectors. Why block-wise and not step-wise: it holds for
every BK and BN (a file format cannot know the kernel's tile), and the size is unchanged.
``restore`` is its inverse. ``gemv`` is ``glyd.kernels.dense11.gemv_v2``'s GEMV with its loads
(``load_step_c``) and its exceptions' ``sm`` address changed: the same decode (``decode_words``),
the same products, so the same bits.

>>> import torch, glyd
>>> p = glyd.codec.dense11.pack_v2(torch.randn(3, 2100).to(torch.bfloat16))
>>> r = relayout(p.arrays["code"], p.arrays["sm"])
>>> all(torch.equal(a, b) for a, b in zip(restore(*r), (p.arrays["code"], p.arrays["sm"])))
True
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from glyd.codec import dense11 as _codec
from glyd.kernels import _common as C
from glyd.kernels._interp import isolated
from glyd.kernels.dense11.decode_v2 import (_clamp8, _funnel, _half, _nib_esc, _prmt, _u, block_start, decode_words,
                                            hw, prepare)
from glyd.kernels.dense11.unpack import _popc
from glyd.kernels.dense11.gemv_v2 import (Dense11V2GemvConfig, _dot_half, _dot_tile, _fma_half, _pairs, row_sum,
                                          x_rows)

BLOCK = _codec.BLOCK
BLOCK_C = tl.constexpr(BLOCK)
RUNS = BLOCK // 32  # runs of a whole block


# ---------------------------------------------------------------------------------------------------------------
# the relayout (torch, any device)


@functools.lru_cache(maxsize=64)
def _orders(runs: int) -> tuple[torch.Tensor, torch.Tensor]:
    # (code, sm) permutations of one row: new position p holds old position order[p]
    code = torch.arange(3 * runs).view(runs, 3)
    sm = torch.arange(32 * runs).view(runs, 2, 16)
    co, so = [], []
    for r0 in range(0, runs, RUNS):
        r1 = min(r0 + RUNS, runs)
        co.append(code[r0:r1].t().reshape(-1))  # [3, RB]: plane-major
        so.append(sm[r0:r1].permute(1, 0, 2).reshape(-1))  # [2, RB, 16]: half-major
    return torch.cat(co), torch.cat(so)


def _check(code: torch.Tensor, sm: torch.Tensor) -> int:
    if code.dtype != torch.int32 or sm.dtype != torch.uint8 or code.dim() != 2 or sm.dim() != 2:
        raise ValueError(f"code must be int32 [N, 3R] and sm uint8 [N, 32R], got code {code.dtype} "
                         f"{tuple(code.shape)}, sm {sm.dtype} {tuple(sm.shape)}")
    runs = sm.shape[1] // 32
    if sm.shape[1] != 32 * runs or tuple(code.shape) != (sm.shape[0], 3 * runs):
        raise ValueError(f"code {tuple(code.shape)} and sm {tuple(sm.shape)} are not one matrix's runs")
    return runs


def relayout(code: torch.Tensor, sm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Version 2's ``code`` [N, 3R] and ``sm`` [N, 32R] in the coalesced order (module docstring)."""
    co, so = _orders(_check(code, sm))
    return code[:, co.to(code.device)].contiguous(), sm[:, so.to(sm.device)].contiguous()


def restore(code: torch.Tensor, sm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of ``relayout``: version 2's own order."""
    co, so = _orders(_check(code, sm))
    out_c, out_s = torch.empty_like(code), torch.empty_like(sm)
    out_c[:, co.to(code.device)] = code
    out_s[:, so.to(sm.device)] = sm
    return out_c, out_s


def sm_index(r: int, c: int, kp: int) -> int:
    """Where weight (r, c)'s ``sm`` byte sits in the relaid ``sm`` (flat), as the kernel computes it."""
    b, cc = divmod(c, BLOCK)
    j, t = divmod(cc, 32)
    rb = min(kp // 32 - RUNS * b, RUNS)
    return r * kp + BLOCK * b + (t // 16) * 16 * rb + 16 * j + t % 16


def weights(n: int, k: int, seed: int, kind: str = "normal") -> torch.Tensor:
    """bf16 test weights, as ``tests/kernels/test_dense11_v2_kernels.py``'s ``_weights``: ``normal``
    (std 0.02, 20 far exponents: exceptions), ``wide`` (exponents over ~20 values: crowded runs,
    table digits, exceptions), ``crowded`` (rows with runs of 8, 9, 12, 20, 32 escapes)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    if kind == "wide":
        w = w * torch.exp2(torch.randn(n, k, generator=g) * 3)
    if n * k:
        pick = torch.randint(0, n * k, (20,), generator=g)
        w.view(-1)[pick] = torch.exp2(-torch.arange(60, 80, dtype=torch.float32))
    if kind == "crowded":
        for r, c in zip(range(n), (8, 9, 12, 20, 32)):
            w[r, :c] = 3.0 + torch.rand(c, generator=g)
    return w.to(torch.bfloat16)


# ---------------------------------------------------------------------------------------------------------------
# the GEMV on the relaid arrays


@triton.jit
def load_step_c(code_ptr, sm32_ptr, rn, nmask, kb, KP, BN: tl.constexpr, W: tl.constexpr, FULL: tl.constexpr):
    # decode_v2.load_step on the relaid arrays: c0, c1, c2 [BN, W] and s4a, s4b [BN, W, 4] of columns
    # kb .. kb + 32 W (inside block b: W consecutive words of each plane, W consecutive 16-byte halves).
    # The halves load as [BN, 4 W] words (contiguous along the row: the compiler's coalescing then puts
    # the lanes along W) and are reshaped in place
    wi = tl.arange(0, W)
    vi = tl.arange(0, 4 * W)
    runs = KP // 32
    b = kb // BLOCK_C
    rb = tl.minimum(runs - 32 * b, 32)  # runs of block b (the row's last block may hold fewer)
    j0 = (kb - b * BLOCK_C) // 32  # the step's first run in the block
    cw = (rn * (3 * runs))[:, None] + (96 * b + j0 + wi)[None, :]
    so = (rn * (KP // 4))[:, None] + (256 * b + 4 * j0 + vi)[None, :]
    if FULL:
        c0 = tl.load(code_ptr + cw).to(tl.uint32, bitcast=True)
        c1 = tl.load(code_ptr + cw + rb).to(tl.uint32, bitcast=True)
        c2 = tl.load(code_ptr + cw + 2 * rb).to(tl.uint32, bitcast=True)
        s4a = tl.load(sm32_ptr + so).to(tl.uint32, bitcast=True)
        s4b = tl.load(sm32_ptr + so + 4 * rb).to(tl.uint32, bitcast=True)
    else:
        wmask = nmask[:, None] & ((kb // 32 + wi) < runs)[None, :]
        vmask = nmask[:, None] & ((kb // 32 + vi // 4) < runs)[None, :]
        c0 = tl.load(code_ptr + cw, mask=wmask, other=0).to(tl.uint32, bitcast=True)
        c1 = tl.load(code_ptr + cw + rb, mask=wmask, other=0).to(tl.uint32, bitcast=True)
        c2 = tl.load(code_ptr + cw + 2 * rb, mask=wmask, other=0).to(tl.uint32, bitcast=True)
        s4a = tl.load(sm32_ptr + so, mask=vmask, other=0).to(tl.uint32, bitcast=True)
        s4b = tl.load(sm32_ptr + so + 4 * rb, mask=vmask, other=0).to(tl.uint32, bitcast=True)
    return c0, c1, c2, tl.reshape(s4a, [BN, W, 4]), tl.reshape(s4b, [BN, W, 4])


@triton.jit
def _window_1d(rank, tot, esc_ptr, NESCW, TAB, HW: tl.constexpr, BN: tl.constexpr, W: tl.constexpr):
    # decode_v2._window with its two digit-word gathers made 1-D ([BN W], reshaped back): a gather of [BN, W]
    # addresses gets lanes along BN from the compiler (16 rows x 2 runs a warp), which then costs the decode a
    # layout conversion (shared memory, barriers) a value each way; 1-D, it keeps the loads' lanes along W
    HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1 = TAB
    wi = rank >> 3
    sh = (4 * (rank & 7)).to(tl.uint32)
    p0 = tl.reshape(esc_ptr + wi, [BN * W])
    m0 = tl.reshape((tot > 0) & (wi < NESCW), [BN * W])
    m1 = tl.reshape((tot + (rank & 7) > 8) & (wi + 1 < NESCW), [BN * W])
    w0 = _u(tl.reshape(tl.load(p0, mask=m0, other=0), [BN, W]))
    w1 = _u(tl.reshape(tl.load(p0 + 1, mask=m1, other=0), [BN, W]))
    win = _funnel(w0, w1, sh, HW)
    d0 = win & 0xFFFF
    d1 = win >> 16
    eh0 = _prmt(HA0, HA1, d0, HW) | _prmt(HB0, HB1, d0 ^ 0x8888, HW)
    eh1 = _prmt(HA0, HA1, d1, HW) | _prmt(HB0, HB1, d1 ^ 0x8888, HW)
    el0 = _prmt(LA0, LA1, d0, HW) | _prmt(LB0, LB1, d0 ^ 0x8888, HW)
    el1 = _prmt(LA0, LA1, d1, HW) | _prmt(LB0, LB1, d1 ^ 0x8888, HW)
    return eh0, eh1, el0, el1


@triton.jit
def decode_words_1d(c0, c1, c2, s4a, s4b, esc_ptr, NESCW, run, TAB, LUT, HW: tl.constexpr, BN: tl.constexpr,
                    W: tl.constexpr):
    # decode_v2.decode_words, line for line, with _window_1d
    TH0, TH1, TL0, TL1 = LUT
    d = ((c0 >> 3) & 0x11111111) | ((c1 >> 2) & 0x22222222) | ((c2 >> 1) & 0x44444444)
    f0 = _nib_esc(c0)
    f1 = _nib_esc(c1)
    f2 = _nib_esc(c2)
    f3 = _nib_esc(d)
    n0 = _popc(f0, HW)
    n1 = _popc(f1, HW)
    n2 = _popc(f2, HW)
    n3 = _popc(f3, HW)
    b2 = n0 + n1
    b3 = b2 + n2
    tot = b3 + n3
    rk = run + tl.cumsum(tot, axis=1) - tot
    eh0, eh1, el0, el1 = _window_1d(rk, tot, esc_ptr, NESCW, TAB, HW, BN, W)
    z = c0 * 0
    hia, loa = _half(c0, c1, s4a, f0 << 2, f1 << 2, f0 * 0x11111110, f1 * 0x11111110, z, _clamp8(n0),
                     eh0, eh1, el0, el1, TH0, TH1, TL0, TL1, HW)
    hib, lob = _half(c2, d, s4b, f2 << 2, f3 << 2, f2 * 0x11111110, f3 * 0x11111110, _clamp8(b2), _clamp8(b3),
                     eh0, eh1, el0, el1, TH0, TH1, TL0, TL1, HW)
    return hia, loa, hib, lob, run + tl.sum(tot, axis=1, keep_dims=True)


@triton.jit
def _decode(c0, c1, c2, s4a, s4b, esc_ptr, NESCW, run, TAB, LUT, HW: tl.constexpr, BN: tl.constexpr, W: tl.constexpr,
            WIN1D: tl.constexpr):
    if WIN1D:
        r = decode_words_1d(c0, c1, c2, s4a, s4b, esc_ptr, NESCW, run, TAB, LUT, HW, BN, W)
    else:
        r = decode_words(c0, c1, c2, s4a, s4b, esc_ptr, NESCW, run, TAB, LUT, HW)
    return r


@triton.jit
def _exceptions_c(acc, rn, rm, mmask, pid_n, N, K, KP, x_ptr, stride_xm, sm_ptr, rowptr_ptr, eidx_ptr, eexp_ptr,
                  BN: tl.constexpr):
    # exceptions_v2.exceptions with the sm byte of (r, c) read from its relaid place (sm_index)
    e0 = tl.load(rowptr_ptr + pid_n * BN)
    e1 = tl.load(rowptr_ptr + tl.minimum(pid_n * BN + BN, N))
    for e in range(e0, e1):
        idx = tl.load(eidx_ptr + e).to(tl.int64)
        r = idx // K
        c = idx - r * K
        b = c // BLOCK_C
        cc = c - b * BLOCK_C
        j = cc // 32
        t = cc - 32 * j
        rb = tl.minimum(KP // 32 - 32 * b, 32)
        sm = tl.load(sm_ptr + r * KP + b * BLOCK_C + (t // 16) * 16 * rb + 16 * j + (t % 16)).to(tl.int32)
        pv = (((sm & 0x80) << 24) | ((sm & 0x7F) << 16)).to(tl.float32, bitcast=True)
        tv = (((sm & 0x80) << 24) | (tl.load(eexp_ptr + e).to(tl.int32) << 23)
              | ((sm & 0x7F) << 16)).to(tl.float32, bitcast=True)
        xv = tl.load(x_ptr + rm * stride_xm + c, mask=mmask, other=0.0).to(tl.float32)
        acc += tl.where((rn.to(tl.int64) == r)[None, :], (xv * tv - xv * pv)[:, None], 0.0)
    return acc


@isolated
@triton.jit(do_not_specialize=["NESCW", "TH0", "TH1", "TL0", "TL1", "HA0", "HA1", "HB0", "HB1", "LA0", "LA1", "LB0",
                               "LB1"])
def _gemv_c_kernel(x_ptr, x32_ptr, sm_ptr, sm8_ptr, code_ptr, esc_ptr, ebase_ptr, eoff_ptr, rowptr_ptr, eidx_ptr,
                   eexp_ptr, bias_ptr, out_ptr, M, N, K, KP, NBR, NESCW, BLOCKS_SPLIT, stride_xm, TH0, TH1, TL0, TL1,
                   HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1, BN: tl.constexpr, BK: tl.constexpr, MB: tl.constexpr,
                   HW: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr,
                   X32: tl.constexpr = False, FULL: tl.constexpr = False, TILE_DOT: tl.constexpr = True,
                   W_FIRST: tl.constexpr = False, PREFETCH: tl.constexpr = False, WIN1D: tl.constexpr = False):
    # gemv_v2._gemv_v2_kernel, line for line, but for load_step_c and _exceptions_c (the relaid arrays) and
    # WIN1D: decode_words_1d in place of decode_words (the same values)
    W: tl.constexpr = BK // 32
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    rm = pid_m * MB + tl.arange(0, MB)
    mmask = rm < M
    tab = (HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1)
    lut = (TH0, TH1, TL0, TL1)
    if MB == 1:
        acc1 = tl.zeros([BN, W, 4], dtype=tl.float32)
    elif W_FIRST and TILE_DOT:
        acc = tl.zeros([BN, MB], dtype=tl.float32)
    else:
        acc = tl.zeros([MB, BN], dtype=tl.float32)
    xrow = x_ptr + pid_m * stride_xm
    x32row = x32_ptr + pid_m * (stride_xm // 2)
    k0 = pid_k * BLOCKS_SPLIT * BLOCK_C
    k1 = tl.minimum(k0 + BLOCKS_SPLIT * BLOCK_C, KP)
    last = k0 + ((k1 - k0 - 1) // BK) * BK
    run = block_start(ebase_ptr, eoff_ptr, rn * NBR + pid_k * BLOCKS_SPLIT, nmask)
    if PREFETCH:
        c0, c1, c2, s4a, s4b = load_step_c(code_ptr, sm_ptr, rn, nmask, k0, KP, BN, W, FULL)
    for kb in range(k0, k1, BK):
        if kb == (kb // BLOCK_C) * BLOCK_C:
            run = block_start(ebase_ptr, eoff_ptr, rn * NBR + kb // BLOCK_C, nmask)
        if PREFETCH:
            n0, n1, n2, n4a, n4b = load_step_c(code_ptr, sm_ptr, rn, nmask, tl.minimum(kb + BK, last), KP, BN, W,
                                                     FULL)
            hia, loa, hib, lob, run = _decode(c0, c1, c2, s4a, s4b, esc_ptr, NESCW, run, tab, lut, HW, BN, W, WIN1D)
            c0, c1, c2, s4a, s4b = n0, n1, n2, n4a, n4b
        else:
            w0, w1, w2, w4a, w4b = load_step_c(code_ptr, sm_ptr, rn, nmask, kb, KP, BN, W, FULL)
            hia, loa, hib, lob, run = _decode(w0, w1, w2, w4a, w4b, esc_ptr, NESCW, run, tab, lut, HW, BN, W, WIN1D)
        if MB == 1:
            acc1 = _fma_half(acc1, hia, loa, xrow, x32row, kb, K, 0, W, HW, X32, FULL)
            acc1 = _fma_half(acc1, hib, lob, xrow, x32row, kb, K, 1, W, HW, X32, FULL)
        else:
            if TILE_DOT:
                acc = _dot_tile(acc, hia, loa, hib, lob, x_ptr, rm, mmask, stride_xm, kb, K, BN, W, HW, W_FIRST)
            else:
                acc = _dot_half(acc, hia, loa, x_ptr, rm, mmask, stride_xm, kb, K, 0, BN, W, HW)
                acc = _dot_half(acc, hib, lob, x_ptr, rm, mmask, stride_xm, kb, K, 1, BN, W, HW)
    if MB == 1:
        acc = row_sum(acc1, BN, W)
    elif W_FIRST and TILE_DOT:
        acc = tl.trans(acc)
    if HAS_EXC:
        if pid_k == 0:
            acc = _exceptions_c(acc, rn, rm, mmask, pid_n, N, K, KP, x_ptr, stride_xm, sm8_ptr, rowptr_ptr, eidx_ptr,
                                eexp_ptr, BN)
    optr = rm[:, None] * N + rn[None, :]
    omask = mmask[:, None] & nmask[None, :]
    if PARTIAL:
        tl.store(out_ptr + pid_k * M * N + optr, acc, mask=omask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + optr, acc.to(tl.bfloat16), mask=omask)


class Relaid:
    """A version-2 matrix with its ``code`` and ``sm`` relaid (``relayout``), on the packed's device;
    the other arrays and the checked per-matrix data (``decode_v2.prepare``) are the packed's own."""

    def __init__(self, packed) -> None:
        self.packed = packed
        self.prep = prepare(packed)
        self.code, self.sm = relayout(packed.arrays["code"], packed.arrays["sm"])


# x: bf16 [M, K]; relaid: Relaid of a dense11 v2 [N, K]; bias: [N] or None; out: bf16 [M, N] (written) -> out
def gemv(x2: torch.Tensor, relaid: Relaid, bias: torch.Tensor | None = None,
         config: Dense11V2GemvConfig | None = None, out: torch.Tensor | None = None,
         win1d: bool = False) -> torch.Tensor:
    """``Dense11V2GemvKernel.launch`` on the relaid arrays (the same grid, splits and constexprs);
    ``win1d``: the escape digits gathered 1-D (``decode_words_1d``)."""
    config = config or Dense11V2GemvConfig()
    p, prep = relaid.packed, relaid.prep
    m, k = x2.shape
    n = p.shape[0]
    kp = p.arrays["sm"].shape[1]
    if x2.dtype != torch.bfloat16 or x2.stride(1) != 1 or k != p.shape[1]:
        raise ValueError(f"x must be bf16 [M, {p.shape[1]}] with unit stride along K, got {x2.dtype} "
                         f"{tuple(x2.shape)}, strides {x2.stride()}")
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x2.device) if out is None else out
    if out.shape != (m, n) or out.dtype != torch.bfloat16:
        raise ValueError(f"out must be bf16 [{m}, {n}], got {out.dtype} {tuple(out.shape)}")
    nbr = _codec.blocks_per_row(k)
    mb = x_rows(m, min(config.mb, 32) if config.dot == "lanes" else config.mb)
    tiles = triton.cdiv(n, config.bn) * triton.cdiv(m, mb)
    split = config.split or (nbr if tiles < 2 * C.sm_count(x2.device) else 1)
    per = triton.cdiv(nbr, max(1, min(split, nbr)))
    split = triton.cdiv(nbr, per)
    dst = torch.empty(split, m, n, dtype=torch.float32, device=x2.device) if split > 1 else out
    a = p.arrays
    bk = min(config.bk, triton.next_power_of_2(kp))
    x32 = _pairs(x2)
    _gemv_c_kernel[(triton.cdiv(n, config.bn), split, triton.cdiv(m, mb))](
        x2, x32 if x32 is not None else x2, relaid.sm.view(torch.int32), relaid.sm, relaid.code, a["esc"],
        a["esc_base"], a["esc_off"], prep.rowptr, a["exc_idx"], a["exc_exp"], bias if bias is not None else out, dst,
        m, n, k, kp, nbr, prep.nescw, per, x2.stride(0), *prep.lut, *prep.tab,
        BN=config.bn, BK=bk, MB=mb, HW=hw(), HAS_BIAS=bias is not None, HAS_EXC=prep.nexc > 0, PARTIAL=split > 1,
        X32=x32 is not None, FULL=n % config.bn == 0 and k == kp and kp % bk == 0, TILE_DOT=config.dot != "lanes",
        W_FIRST=config.dot == "tile_wx", PREFETCH=config.prefetch, WIN1D=win1d, num_warps=config.warps,
    )
    if split > 1:
        C.finalize(dst, bias, out)
    return out
