"""Triton kernels for the ``tiered`` layout: the decode and the GPU unpack (the fused GEMV in ``gemv.py``).

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
On the H200 a 7B step at M = 1 takes ~8.5x bf16's time: the tiers, not the bytes, set the speed
(the d1 plane alone: 1.9x).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from glyd.codec import tiered as _codec
from glyd.codec.packed import Packed
from glyd.errors import CorruptError
from glyd.kernels import _common as C
from glyd.kernels._fields import flags, ints
from glyd.kernels import _plan
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
def _decode(sm, db, aw, ar, area_ptr, off, A, TL, TH, T8, T12, T16, T20, REG: tl.constexpr):
    # fp32 bits ([BB, 64, 16] int32) of the weights of 16-weight units (a block's 64 units are one
    # row of the tile). sm: their sign-mantissa bytes; db: their d1 bytes shifted so the unit's
    # digit is in bits 0-1; off: [BB] byte start of each block's area.
    d = db & 3
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
    sel = tl.where(rank < 4, TL, TH)
    exp = (sel >> ((rank & 3) * 8)) & 0xFF
    if tl.max(tl.max(tl.max(e4, axis=2), axis=1), axis=0) > 0:  # tier 5: ~2% of normal weights
        s += (n3 + 3) >> 2
        i4, c4, p4, n4 = _ranks(e4)
        # 4-bit digits: two 32-bit windows a unit (its digits 0-7 and 8-15)
        a = s[:, None] + (p4 >> 1)
        o = (p4 & 1) * 4
        lo = (_win(area_ptr, aw, ar, off, a, c4 > 0, A, REG) >> o).to(tl.int32)
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
def _unpack_kernel(sm_ptr, d1_ptr, table_ptr, ebase_ptr, eoff_ptr, area_ptr, out_ptr, K, KP, TOTAL, NBLK, A, FIT,
                   BB: tl.constexpr):
    b = tl.program_id(0) * BB + tl.arange(0, BB)
    bmask = b < NBLK
    TL, TH, T8, T12, T16, T20 = _tables(table_ptr)
    fu = b[:, None] * 1024 + tl.arange(0, 64)[None, :] * 16
    umask = bmask[:, None] & (fu < TOTAL)
    sm, db, off, ar, aw, fits = _load_blocks(sm_ptr, d1_ptr, ebase_ptr, eoff_ptr, area_ptr, b, bmask, fu, umask, A, NBLK,
                                             FIT)
    if fits:
        bits = _decode(sm, db, aw, ar, area_ptr, off, A, TL, TH, T8, T12, T16, T20, True)
    else:
        bits = _decode(sm, db, aw, ar, area_ptr, off, A, TL, TH, T8, T12, T16, T20, False)
    ur = fu // KP
    col = (fu - ur * KP)[:, :, None] + tl.arange(0, 16)[None, None, :]
    tl.store(out_ptr + (ur * K)[:, :, None] + col, (bits >> 16).to(tl.int16), mask=umask[:, :, None] & (col < K))


def check(p: Packed) -> None:
    """Raise unless ``p`` is a tiered matrix the kernels can read (offsets checked once a matrix)."""
    if not isinstance(p, Packed) or p.layout != _codec.NAME:
        raise TypeError("packed must be a tiered glyd.Packed")
    n = p.shape[0]
    kp = p.arrays["sm"].shape[1]
    C.check_size("tiered 'sm'", n * kp + BLOCK)
    if p.arrays["area"].numel() >= 2**31:
        raise C.FormatError("tiered 'area' is too large for 32-bit offsets")
    C.cached(p.arrays["esc_off"], lambda: _check_offsets(p), p.arrays.values(), C.packed_tag(p))


def _check_offsets(p: Packed) -> bool:
    # Contiguous arrays (a strided view would be read as other rows' bytes), zero padding. Every
    # block's area must lie inside 'area' before a kernel reads it: the offsets come from a file (the
    # CPU codec checks them as it decodes; the kernels could read out of bounds). Once a matrix (host
    # sync), again if the arrays change in place.
    a = p.arrays
    for name in _codec.ARRAYS:  # the kernels take each array's pointer as one dense array
        if not a[name].is_contiguous():
            raise C.FormatError(f"tiered array '{name}' must be contiguous (the kernels read it as one array), "
                                f"got strides {a[name].stride()}")
    _codec.check_padding(p)  # the fused GEMV multiplies the padding by x's zeros (0 * inf: NaN)
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


#: Steps whose blocks' areas (plus their offset in the first word) fit in this many bytes read the
#: escape digits from 64 area words loaded once into registers; others from memory. 252 = the
#: largest value the 64 words serve (0 takes the memory path always).
AREA_REG_BYTES = 252


@dataclasses.dataclass(frozen=True)
class TieredUnpackConfig:
    """``blocks`` escape blocks (1024 weights) and ``warps`` warps a program (one block and one
    warp measured fastest on the H200: 33.3 us a 7B step's matrix against 37.5 with two warps);
    ``area_reg_bytes``: see ``AREA_REG_BYTES``."""

    blocks: int = 1
    warps: int = 1
    area_reg_bytes: int = AREA_REG_BYTES

    def __post_init__(self) -> None:
        C.pow2(self, "blocks", "warps")
        ints(self, 0, AREA_REG_BYTES, "area_reg_bytes")


# packed: tiered [N, K] -> launch(out, *arrays): out bf16 [N, K] (written, contiguous)
def unpack_launch(p: Packed, config: TieredUnpackConfig | None = None) -> _plan.Launch:
    """The unpack of ``p`` as one ``glyd.kernels._plan.Launch`` (``arrays``: tiered's, in its order)."""
    if config is not None and not isinstance(config, TieredUnpackConfig):
        raise TypeError(f"config must be a TieredUnpackConfig (the tiered unpack's), got {type(config).__name__}")
    cfg = config or TieredUnpackConfig()
    check(p)
    n, k = p.shape
    kp = p.arrays["sm"].shape[1]
    nblk = _codec.num_blocks(n, k)
    out = _plan.Slot(0).view(torch.int16)
    return _plan.Launch(_unpack_kernel, (triton.cdiv(nblk, cfg.blocks),),
                        (*_plan.slots(len(_codec.ARRAYS), 1, fixed=True), out, k, kp, n * kp, nblk,
                         p.arrays["area"].numel(), cfg.area_reg_bytes), dict(BB=cfg.blocks, num_warps=cfg.warps))


# packed: tiered [N, K] (sm [N, Kp], d1 [N, Kp/4], table [23], esc_base, esc_off, area) -> bf16 [N, K]
def unpack(p: Packed, out: torch.Tensor | None = None, config: TieredUnpackConfig | None = None) -> torch.Tensor:
    launch = unpack_launch(p, config)
    n, k = p.shape
    if out is None:
        out = torch.empty(n, k, dtype=torch.bfloat16, device=p.device)
    elif out.shape != (n, k) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [{n}, {k}] tensor, got {out.dtype} {tuple(out.shape)}")
    if n and k:
        launch(out, *(p.arrays[a] for a in _codec.ARRAYS))
    return out
