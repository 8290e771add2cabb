"""Triton kernels for the ``tiered`` layout: GPU unpack and the fused linear.

A step decodes whole escape-area blocks (1024 consecutive weights of the padded matrix) as a
[blocks, 64, 16] tile: 64 units of 16 consecutive weights a block, one unit a thread (two with one
warp), so that every rank is cheap:

- a weight's tier-1 digit is plane ``(unit & 3)`` of its group's 16 ``d1`` bytes;
- escapes of each tier are ranked inside their unit by an in-thread scan (16 adds), and units by
  one warp scan of their counts (64 values a block) instead of a 1024-wide ``tl.cumsum``;
- a unit's digits of the next tier are contiguous in the block's area: one window (a few bytes)
  a unit, then a shift and a mask a weight. The area's first 64 words are loaded with the sm/d1
  bytes and windows come from them through warp shuffles (``tl.gather``); blocks whose area is
  longer read windows from memory (the same code, ``REG=False``).
- tiers 5 and raw (about 2% of normal weights) run only when the tile holds such an escape.

Exponents come from the table packed four a word (a select and a shift, no memory access).
Measured on the H200 (benchmarks/notes-kernels.md, "tiered"): a 7B step at M = 1 takes ~8.5x
bf16's time; the tiers, not the bytes, set the speed (d1 alone: 1.9x).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glyd.codec import tiered as _codec
from glyd.codec.packed import Packed
from glyd.errors import CorruptError
from glyd.kernels import _common as C
from glyd.kernels._interp import isolated

BLOCK = _codec.BLOCK
SUPER = _codec.SUPER


@triton.jit
def _window(area_ptr, a, need, A, NBYTES: tl.constexpr):
    # Little-endian window of NBYTES area bytes from byte a ([BB, 64] units), 0 past the area's end.
    w = tl.load(area_ptr + a, mask=need & (a < A), other=0).to(tl.int64 if NBYTES > 4 else tl.int32)
    for i in tl.static_range(1, NBYTES):
        w |= tl.load(area_ptr + a + i, mask=need & (a + i < A), other=0).to(w.dtype) << (8 * i)
    return w


@triton.jit
def _ranks(e):
    # e: [BB, 64, 16] int32 0/1 flags. Inclusive rank inside the unit (in-thread scan), unit
    # counts, exclusive unit prefix inside the block (one warp scan), block totals.
    inc = tl.cumsum(e, axis=2)
    c = tl.sum(e, axis=2)
    p = tl.cumsum(c, axis=1) - c
    return inc, c, p, tl.sum(c, axis=1)


@triton.jit
def _win(area_ptr, aw, ar, off, rel, need, A, REG: tl.constexpr):
    # 8 area bytes (int64, little-endian; at least the first 5 valid) from byte rel ([BB, 64]) of
    # each block's area. REG: from the block's area words preloaded in registers (aw [BB, 64] int32
    # from the word holding the area's first byte, ar = its byte offset in that word), through warp
    # shuffles; else from memory (one dependent global load per byte).
    if REG:
        r = ar[:, None] + rel
        i = tl.minimum(r >> 2, 62)
        lo = tl.gather(aw, i, axis=1).to(tl.uint32, bitcast=True).to(tl.int64)
        hi = tl.gather(aw, i + 1, axis=1).to(tl.uint32, bitcast=True).to(tl.int64)
        return ((hi << 32) | lo) >> ((r & 3) * 8)
    else:
        return _window(area_ptr, off[:, None] + rel, need, A, 5)


@triton.jit
def _deep_exp(q, T8, T12, T16, T20):
    # exponent of rank 8 + q (q = 0..14) from the table words; q = 15 (raw) gives garbage
    t = tl.where(q < 8, tl.where(q < 4, T8, T12), tl.where(q < 12, T16, T20))
    return (t >> ((q & 3) * 8)) & 0xFF


@triton.jit
def _decode(sm, db, aw, ar, area_ptr, off, A, TL, TH, T8, T12, T16, T20, DEPTH: tl.constexpr, REG: tl.constexpr,
            FAST5: tl.constexpr):
    # fp32 bits ([BB, 64, 16] int32) of the weights of 16-weight units (a block's 64 units are one
    # row of the tile). sm: their sign-mantissa bytes; db: their d1 bytes shifted so the unit's
    # digit is in bits 0-1; off: [BB] byte start of each block's area. DEPTH < 2 skips tiers 5 and
    # raw, DEPTH < 1 every escape: wrong results, for timing the stages.
    d = db & 3
    if DEPTH > 0:
        # tier 2: one bit a tier-1 escape, stream at the area's start. Flags are 0/1 integers.
        e1 = (db >> 1) & d & 1
        i1, c1, p1, n1 = _ranks(e1)
        # inclusive ranks: the window is shifted left once so that rank r reads bit r - 1
        w = ((_win(area_ptr, aw, ar, off, p1 >> 3, c1 > 0, A, REG) << 1) >> (p1 & 7)).to(tl.int32)
        e2 = e1 & (w[:, :, None] >> i1)
        # tier 3: one bit a tier-2 escape
        s = (n1 + 7) >> 3
        i2, c2, p2, n2 = _ranks(e2)
        w = ((_win(area_ptr, aw, ar, off, s[:, None] + (p2 >> 3), c2 > 0, A, REG) << 1) >> (p2 & 7)).to(tl.int32)
        e3 = e2 & (w[:, :, None] >> i2)
        # tier 4: 2 bits a tier-3 escape (0-2: ranks 5-7, 3: deeper); up to 16 digits + 6 bits of offset
        s += (n2 + 7) >> 3
        i3, c3, p3, n3 = _ranks(e3)
        w = (_win(area_ptr, aw, ar, off, s[:, None] + (p3 >> 2), c3 > 0, A, REG) >> (2 * (p3 & 3))).to(tl.int32)
        d4 = (w[:, :, None] >> (2 * (i3 - e3))) & (e3 * 3)
        rank = d + e2 + e3 + d4  # ranks 0-7; 8 where a tier-5 digit follows
        e4 = (d4 >> 1) & d4 & 1
    else:
        rank = d
    sel = tl.where(rank < 4, TL, TH)
    exp = (sel >> ((rank & 3) * 8)) & 0xFF
    if DEPTH > 1:
        if tl.max(tl.max(tl.max(e4, axis=2), axis=1), axis=0) > 0:  # tier 5: ~2% of normal weights
            s += (n3 + 3) >> 2
            i4, c4, p4, n4 = _ranks(e4)
            # 4-bit digits: two 32-bit windows a unit (its digits 0-7 and 8-15)
            a = s[:, None] + (p4 >> 1)
            o = (p4 & 1) * 4
            lo = (_win(area_ptr, aw, ar, off, a, c4 > 0, A, REG) >> o).to(tl.int32)
            q0 = lo & 15
            q1 = (lo >> 4) & 15
            big = (c4 > 2) | ((c4 > 0) & (q0 == 15)) | ((c4 > 1) & (q1 == 15))
            if FAST5 and tl.max(tl.max(big.to(tl.int32), axis=1), axis=0) == 0:
                # at most two tier-5 escapes a unit (a Binomial(16, ~2%) count: almost always) and
                # no raw exponent: their exponents are looked up once a unit, then placed with two
                # selects a weight instead of a digit extraction and a table lookup each
                k = i4 * e4  # 1, 2 on the unit's first and second tier-5 escape
                exp = tl.where(k == 1, _deep_exp(q0, T8, T12, T16, T20)[:, :, None],
                               tl.where(k == 2, _deep_exp(q1, T8, T12, T16, T20)[:, :, None], exp))
            else:
                hi = (_win(area_ptr, aw, ar, off, a + 4, c4 > 8, A, REG) >> o).to(tl.int32)
                i4 -= e4
                d5 = (tl.where(i4 < 8, lo[:, :, None], hi[:, :, None]) >> ((i4 & 7) * 4)) & (e4 * 15)
                exp = tl.where(e4 == 1, _deep_exp(d5, T8, T12, T16, T20), exp)
                e5 = (d5 == 15).to(tl.int32)
                if tl.max(tl.max(tl.max(e5, axis=2), axis=1), axis=0) > 0:  # raw exponents: rare
                    s += (n4 + 1) >> 1
                    i5, c5, p5, n5 = _ranks(e5)
                    ra = (off + s)[:, None, None] + p5[:, :, None] + i5 - 1
                    raw = tl.load(area_ptr + ra, mask=(e5 == 1) & (ra < A), other=0).to(tl.int32)
                    exp = tl.where(e5 == 1, raw, exp)
    return (sm + (sm & 0x80) * 255 + (exp << 7)) << 16  # bf16 (sign << 15 | exp << 7 | mantissa) << 16


@triton.jit
def _load_blocks(sm_ptr, d1_ptr, ebase_ptr, eoff_ptr, area_ptr, b, bmask, fu, umask, A, NBLK, FIT):
    # Everything a step decodes, loaded at once (no load waits on another): sm and d1 bytes of the
    # units, each block's area start and its first 64 area words; fits: every block's area lies in
    # those words (else the step reads windows from memory).
    j = tl.arange(0, 16)
    m3 = umask[:, :, None]
    sm = tl.load(sm_ptr + fu[:, :, None] + j[None, None, :], mask=m3, other=0).to(tl.int32)
    # d1: group fu >> 6, byte j of its 16; unit (fu >> 4) & 3 is the digit pair at bits 2 * that.
    db = tl.load(d1_ptr + ((fu >> 6) * 16)[:, :, None] + j[None, None, :], mask=m3, other=0).to(tl.int32)
    db = db >> ((fu >> 3) & 6)[:, :, None]
    off = _area_start(ebase_ptr, eoff_ptr, b, bmask)
    nb = b + 1
    nxt = tl.where(nb < NBLK, _area_start(ebase_ptr, eoff_ptr, nb, bmask & (nb < NBLK)), A)
    ar = off & 3
    wi = (off >> 2)[:, None] + tl.arange(0, 64)[None, :]
    aw = tl.load(area_ptr.to(tl.pointer_type(tl.int32)) + wi, mask=bmask[:, None] & (wi < ((A + 3) >> 2)), other=0)
    # a window reads words r >> 2 and r >> 2 + 1 for r < ar + length: all preloaded when <= 252 (FIT)
    fits = tl.max(tl.where(bmask, ar + nxt - off, 0), axis=0) <= FIT
    return sm, db, off, ar, aw, fits


@triton.jit
def _word(table_ptr, r: tl.constexpr):
    # table[r .. r + 3] as one little-endian word (past rank 22: 0)
    w = tl.load(table_ptr + r).to(tl.int32)
    for i in tl.static_range(1, 4):
        if r + i < 23:
            w |= tl.load(table_ptr + r + i).to(tl.int32) << (8 * i)
    return w


@triton.jit
def _tables(table_ptr):
    # Exponents of ranks 0-22, four a word: looked up with a select and a shift, no memory access.
    return (_word(table_ptr, 0), _word(table_ptr, 4), _word(table_ptr, 8), _word(table_ptr, 12),
            _word(table_ptr, 16), _word(table_ptr, 20))


@triton.jit
def _area_start(ebase_ptr, eoff_ptr, b, bmask):
    return tl.load(ebase_ptr + b // 16, mask=bmask, other=0) + tl.load(eoff_ptr + b, mask=bmask, other=0).to(tl.int32)


@isolated
@triton.jit(do_not_specialize=["A", "FIT"])
def _gemv_kernel(
    x_ptr, sm_ptr, d1_ptr, table_ptr, ebase_ptr, eoff_ptr, area_ptr, bias_ptr, out_ptr,
    M, N, K, KP, TOTAL, NBLK, A, FIT, stride_xm, drp_ptr, dflat_ptr, dval_ptr,
    BN: tl.constexpr, BB: tl.constexpr, MB: tl.constexpr, HAS_BIAS: tl.constexpr, DEPTH: tl.constexpr = 2,
    FAST5: tl.constexpr = False, SPARSE: tl.constexpr = False,
):
    # One program owns rows [r0, r0 + BN) and activation rows [m0, m0 + MB): it walks the escape
    # blocks that cover its rows (Kp >= 1024: a block holds pieces of at most two rows), BB blocks a
    # step, decodes each once and multiplies it with its MB activation rows.
    pid_n = tl.program_id(0)
    m0 = tl.program_id(1) * MB
    r0 = pid_n * BN
    rn = r0 + tl.arange(0, BN)
    nmask = rn < N
    mi = tl.arange(0, MB)
    TL, TH, T8, T12, T16, T20 = _tables(table_ptr)
    f0 = r0 * KP
    f1 = tl.minimum(r0 + BN, N) * KP
    bend = tl.minimum((f1 + 1023) // 1024, NBLK)
    acc = tl.zeros([MB, BN], dtype=tl.float32)
    u = tl.arange(0, 64)
    j = tl.arange(0, 16)
    for blk0 in range(f0 // 1024, bend, BB):
        b = blk0 + tl.arange(0, BB)
        bmask = b < bend
        fu = b[:, None] * 1024 + u[None, :] * 16
        ur = fu // KP  # row of each unit
        col = fu - ur * KP
        # every unit of a block decodes (the ranks count from the block's start); only this
        # program's rows multiply
        inb = bmask[:, None] & (fu < TOTAL)
        ok = inb & (ur >= r0) & (ur < r0 + BN)
        sm, db, off, ar, aw, fits = _load_blocks(sm_ptr, d1_ptr, ebase_ptr, eoff_ptr, area_ptr, b, bmask, fu, inb, A,
                                                 NBLK, FIT)
        if fits:
            bits = _decode(sm, db, aw, ar, area_ptr, off, A, TL, TH, T8, T12, T16, T20, 1 if SPARSE else DEPTH, True,
                           FAST5)
        else:
            bits = _decode(sm, db, aw, ar, area_ptr, off, A, TL, TH, T8, T12, T16, T20, 1 if SPARSE else DEPTH, False,
                           FAST5)
        wv = bits.to(tl.float32, bitcast=True)
        ra = (b * 1024) // KP  # row of each block's first unit
        first = ur == ra[:, None]
        xc = col[:, :, None] + j[None, None, :]
        xm = ok[:, :, None] & (xc < K)
        for mm in tl.static_range(MB):
            xv = tl.load(x_ptr + (m0 + mm) * stride_xm + xc, mask=xm & (m0 + mm < M), other=0.0).to(tl.float32)
            su = tl.sum(wv * xv, axis=2)  # [BB, 64]
            s0 = tl.sum(tl.where(first, su, 0.0), axis=1)
            s1 = tl.sum(su, axis=1) - s0
            row = tl.sum(tl.where(rn[:, None] == ra[None, :], s0[None, :], 0.0), axis=1) + \
                tl.sum(tl.where(rn[:, None] == ra[None, :] + 1, s1[None, :], 0.0), axis=1)
            acc += tl.where(mi[:, None] == mm, row[None, :], 0.0)
        if SPARSE:
            # weights of rank >= 8 decoded with the rank-4 exponent (DEPTH 1); add (true - that) * x
            # from the derived list (flat index, true bf16 bits), 32 entries a step
            e_hi = tl.load(drp_ptr + tl.minimum(blk0 + BB, bend))
            for e0 in range(tl.load(drp_ptr + blk0), e_hi, 32):
                ei = e0 + tl.arange(0, 32)
                em = ei < e_hi
                fl = tl.load(dflat_ptr + ei, mask=em, other=0)
                v = tl.load(dval_ptr + ei, mask=em, other=0).to(tl.int32) & 0xFFFF
                ph = (v & 0x807F) | ((TH & 0xFF) << 7)
                delta = (v << 16).to(tl.float32, bitcast=True) - (ph << 16).to(tl.float32, bitcast=True)
                er = fl // KP
                ok2 = em & (er >= r0) & (er < r0 + BN)
                for mc in tl.static_range(MB):
                    xd = tl.load(x_ptr + (m0 + mc) * stride_xm + fl - er * KP, mask=ok2 & (m0 + mc < M),
                                 other=0.0).to(tl.float32)
                    cor = tl.sum(tl.where(rn[:, None] == er[None, :], (delta * xd)[None, :], 0.0), axis=1)
                    acc += tl.where(mi[:, None] == mc, cor[None, :], 0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    mrow = m0 + mi
    tl.store(out_ptr + mrow[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=(mrow < M)[:, None] & nmask[None, :])


@isolated
@triton.jit(do_not_specialize=["A", "FIT"])
def _unpack_kernel(sm_ptr, d1_ptr, table_ptr, ebase_ptr, eoff_ptr, area_ptr, out_ptr, K, KP, TOTAL, NBLK, A, FIT,
                   BB: tl.constexpr, DEPTH: tl.constexpr = 2, FAST5: tl.constexpr = False):
    b = tl.program_id(0) * BB + tl.arange(0, BB)
    bmask = b < NBLK
    TL, TH, T8, T12, T16, T20 = _tables(table_ptr)
    fu = b[:, None] * 1024 + tl.arange(0, 64)[None, :] * 16
    umask = bmask[:, None] & (fu < TOTAL)
    sm, db, off, ar, aw, fits = _load_blocks(sm_ptr, d1_ptr, ebase_ptr, eoff_ptr, area_ptr, b, bmask, fu, umask, A, NBLK,
                                             FIT)
    if fits:
        bits = _decode(sm, db, aw, ar, area_ptr, off, A, TL, TH, T8, T12, T16, T20, DEPTH, True, FAST5)
    else:
        bits = _decode(sm, db, aw, ar, area_ptr, off, A, TL, TH, T8, T12, T16, T20, DEPTH, False, FAST5)
    ur = fu // KP
    col = (fu - ur * KP)[:, :, None] + tl.arange(0, 16)[None, None, :]
    tl.store(out_ptr + (ur * K)[:, :, None] + col, (bits >> 16).to(tl.int16), mask=umask[:, :, None] & (col < K))


def _check(p: Packed) -> None:
    if not isinstance(p, Packed) or p.layout != _codec.NAME:
        raise TypeError("packed must be a tiered glyd.Packed")
    n = p.shape[0]
    kp = p.arrays["sm"].shape[1]
    C.check_size("tiered 'sm'", n * kp + BLOCK)
    if p.arrays["area"].numel() >= 2**31:
        raise C.FormatError("tiered 'area' is too large for 32-bit offsets")
    C.cached(p.arrays["esc_off"], lambda: _check_offsets(p))


def _check_offsets(p: Packed) -> bool:
    # Every block's area must lie inside 'area' before a kernel reads it: the offsets come from a
    # file (the CPU codec checks them as it decodes; the kernels could read out of bounds). Once a
    # matrix (host sync), again if the arrays change in place.
    a = p.arrays
    nblk = _codec.num_blocks(*p.shape)
    base = a["esc_base"].to(torch.int64)
    blk = torch.arange(nblk, device=base.device)
    start = torch.cat([base[blk // SUPER] + a["esc_off"].to(torch.int64), base[-1:]])
    bad = (base[0] != 0) | (base[-1] != a["area"].numel()) | (start[1:] < start[:-1]).any()
    bad |= (base[1:] < base[:-1]).any()
    if bool(bad):
        raise CorruptError("tiered 'esc_base'/'esc_off' are not an increasing table of offsets into 'area' "
                           "(a damaged or crafted file)")
    return True


def _args(p: Packed):
    a = p.arrays
    return a["sm"], a["d1"], a["table"], a["esc_base"], a["esc_off"], a["area"]


# packed: tiered [N, K] (sm [N, Kp], d1 [N, Kp/4], table [23], esc_base, esc_off, area) -> bf16 [N, K]
def unpack(p: Packed, out: torch.Tensor | None = None, bb: int = 0, warps: int = 4) -> torch.Tensor:
    _check(p)
    n, k = p.shape
    kp = p.arrays["sm"].shape[1]
    nblk = _codec.num_blocks(n, k)
    if out is None:
        out = torch.empty(n, k, dtype=torch.bfloat16, device=p.device)
    elif out.shape != (n, k) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [{n}, {k}] tensor, got {out.dtype} {tuple(out.shape)}")
    if n and k:
        bb, warps = (bb, warps) if bb else (UNPACK_BB, UNPACK_WARPS)
        deep = prepare(p) if SPARSE_DEEP else None
        _unpack_kernel[(triton.cdiv(nblk, bb),)](*_args(p), out.view(torch.int16), k, kp, n * kp, nblk,
                                                  p.arrays["area"].numel(), REG_AREA_BYTES, BB=bb, FAST5=FAST_DEEP,
                                                  DEPTH=1 if deep is not None else 2, num_warps=warps)
        if deep is not None and deep.flat.numel():
            fl = deep.flat.to(torch.int64)
            out.view(torch.int16).view(-1)[fl // kp * k + fl % kp] = deep.vals
    return out


#: Steps whose blocks' areas (plus their offset in the first word) fit in this many bytes read the
#: escape digits from 64 area words loaded once into registers; others from memory. 252 = the
#: largest value the 64 words serve (tests set 0 to exercise the memory path).
REG_AREA_BYTES = 252

#: Tier 5 (ranks 8-22, ~2% of normal weights): when every unit of a step holds at most two such
#: escapes and no raw exponent, look their exponents up once a unit and place them with two selects
#: a weight; else (or when False) the general per-weight path. Off: it needs more registers than
#: one warp a block has (255 and spills) and measured slower (7B step, M = 1: 45.4 against 41.2 ms).
FAST_DEEP = False

#: Fused GEMV shape: rows a program, escape blocks a step (``Config.bm`` overrides), warps; and the
#: unpack kernel's blocks a program and warps (see benchmarks/notes-kernels.md).
#: Opt-in: take tier 5 and raw (ranks >= 8, ~2% of normal weights) off the per-weight path.
#: ``prepare`` lists those weights once a matrix (flat index int32 + true bf16 bits, 6 bytes each:
#: ~1 bit a weight more memory); kernels decode them with the rank-4 exponent and correct: the GEMV
#: adds (true - decoded) * x, unpack scatters the true bits. Measured on the H200
#: (benchmarks/history/2026-11-30-kernels-h200.md, run 14): 7B step at M = 1 25.8 ms against
#: 37.3 (fused), unpack 23.2 against 33.3 ms. It stays off:
#: the extra bit a weight takes tiered (10.7 bits) close to fixed12 (12), which is 6x faster.
SPARSE_DEEP = False


class Deep:
    """Weights of rank >= 8 of one tiered matrix, grouped by escape block (CSR ``rowptr``)."""

    def __init__(self, p: Packed):
        n, k = p.shape
        kp = p.arrays["sm"].shape[1]
        nblk = _codec.num_blocks(n, k)
        dev = p.device
        t8 = p.arrays["table"][:8].to(torch.int32)
        flats, vals = [], []
        old = globals()["SPARSE_DEEP"]
        globals()["SPARSE_DEEP"] = False
        try:
            w = unpack(p).view(torch.int16)
        finally:
            globals()["SPARSE_DEEP"] = old
        step = max(1, (1 << 23) // max(k, 1))  # rows a chunk: bounded temporaries on large matrices
        for r in range(0, n, step):
            bits = w[r:r + step].to(torch.int32) & 0xFFFF
            deep = ~torch.isin((bits >> 7) & 0xFF, t8)
            rows, cols = torch.nonzero(deep, as_tuple=True)
            flats.append(((rows + r) * kp + cols).to(torch.int32))
            vals.append(bits[rows, cols].to(torch.int16))
        self.flat = torch.cat(flats) if flats else torch.zeros(0, dtype=torch.int32, device=dev)
        self.vals = torch.cat(vals) if vals else torch.zeros(0, dtype=torch.int16, device=dev)
        counts = torch.bincount((self.flat // BLOCK).to(torch.int64), minlength=nblk)
        self.rowptr = torch.zeros(nblk + 1, dtype=torch.int32, device=dev)
        self.rowptr[1:] = torch.cumsum(counts, 0).to(torch.int32)


def prepare(p: Packed) -> Deep:
    """The derived list of weights of rank >= 8 (host syncs; cached while the matrix lives)."""
    _check(p)
    return C.cached(p.arrays["area"], lambda: Deep(p))


#: Measured on the H200, 7B step, M = 1 (benchmarks/tiered_step.py, 2026-11-30): 2 rows and one warp
#: a program 37.4 ms; 4 rows 41.2; 2, 4, 8 rows with two warps (cross-warp scans) 45.8-56.8. Unpack:
#: one block and one warp a program 33.3 ms a step; two warps 37.5.
GEMV_BN, GEMV_BB, GEMV_WARPS, GEMV_MB = 2, 1, 1, 16
UNPACK_BB, UNPACK_WARPS = 1, 1

#: Largest M the fused GEMV serves by default (it decodes once for up to GEMV_MB activation rows);
#: larger M unpack to a scratch buffer and call cuBLAS. Measured on the H200 (7B step): fused 37.4 ms
#: at M = 1 against 38.0 for unpack + cuBLAS (and no bf16 scratch of the largest matrix); at M = 2,
#: 4, 8, 16 fused 43.0, 46.2, 54.5, 72.0 ms against 37.9 for unpack + cuBLAS.
FUSED_MAX_M = 1


# x: bf16 [..., K]; packed: tiered [N, K]; bias: [N] or None -> bf16 [..., N]
def linear(x: torch.Tensor, p: Packed, bias: torch.Tensor | None = None, config: C.Config | None = None) -> torch.Tensor:
    _check(p)
    n, k = p.shape
    x2 = C.check_x(x, k)
    C.check_device(p, x2)
    bias = C.check_bias(bias, n, x2.device)
    m = x2.shape[0]
    kp = p.arrays["sm"].shape[1]
    C.check_size("output", m * n)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x2.device)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    fused = kp >= BLOCK and (m <= FUSED_MAX_M if config is None else not config.long)
    if not fused:
        w = unpack(p, C.scratch(x2.device, n * k).view(n, k))
        return torch.nn.functional.linear(x2, w, bias).reshape(*x.shape[:-1], n)
    bn = config.bn if config is not None else GEMV_BN
    mb = min(triton.next_power_of_2(m), config.g if config is not None else GEMV_MB)
    deep = prepare(p) if SPARSE_DEEP else None
    dargs = (deep.rowptr, deep.flat, deep.vals) if deep is not None else (out, out, out)
    _gemv_kernel[(triton.cdiv(n, bn), triton.cdiv(m, mb))](
        x2, *_args(p), bias if bias is not None else out, out,
        m, n, k, kp, n * kp, _codec.num_blocks(n, k), p.arrays["area"].numel(), REG_AREA_BYTES, x2.stride(0), *dargs,
        SPARSE=deep is not None,
        BN=bn, BB=config.bm if config is not None else GEMV_BB, MB=mb, HAS_BIAS=bias is not None, FAST5=FAST_DEEP,
        num_warps=config.warps if config is not None else GEMV_WARPS,
    )
    return out.reshape(*x.shape[:-1], n)
