"""The decode of one K step of a ``dense11`` format-version-2 matrix (``glyd.codec.dense11_v2``), shared
by its unpack (``unpack_v2.py``) and its GEMV (``gemv_v2.py``), and the per-matrix data they need.
Format version 3 (``glyd.codec.dense11_v3``: the same words, ``code`` and ``sm`` block-wise) differs
only in where a step's words are loaded from (``load_step_v3``) and gathers its escape digits 1-D
(``V3``/``WIN1D`` constexprs): the same decoded words.

A step holds each run of 32 weights in one thread: [BN, W] runs (W = BK / 32), their code words
c0, c1, c2 and the spare-bit word d (codes of columns 24-31), and their ``sm`` bytes as two
[BN, W, 4] halves of 16-byte vectors. Lane word q of a half holds 4 weights (columns 16 half + 4q
.. + 3 of the run); its exponent bytes come from one ``prmt`` a byte plane: the selector
``(word >> 16h) & 0x7777`` looks the 4 codes up in the 8-entry table of ``base + code``.

Escapes (code 7) are patched inside the lane words, with no loop and no per-weight load: a run
reads one 64-bit window of the digit stream at its first escape's rank (the row's rank at the
step, carried step to step inside a 1024-column block, plus a cumsum over the step's runs),
looks its first 8 digits up in the escape table (``prmt``), and each lane word takes its escapes'
bytes with selectors built from its flags' prefix counts. Ranks 8 and up select a sign-replicated
0 (every table byte is below 0x80): exponent 0, the placeholder the exception pass (GEMV) or patch
(unpack) replaces, as for digit 15. Research and SASS counts: ``benchmarks/probes/dense_escape_kernels.py``
(``niblut+wincx``) and ``benchmarks/history/2026-12-04-dense-escapes-cpu.md``.

Under ``TRITON_INTERPRET=1`` (``HW=False``) ``prmt``, ``popc`` and the funnel shift run as integer twins.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glyd.codec import dense11 as _codec
from glyd.codec.packed import Packed
from glyd.errors import FormatError
from glyd.kernels import _common as C
from glyd.kernels.dense11.unpack import Prepared, _popc

BLOCK_C = tl.constexpr(_codec.BLOCK)  # what a jit function may read of a global


@triton.jit
def _prmt(a, b, sel, HW: tl.constexpr):
    # prmt.b32 with a register selector: byte t = byte (nibble t & 7) of (b:a), or that byte's top bit
    # spread over the byte where nibble t has bit 3 set
    if HW:
        return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, sel], dtype=tl.uint32,
                                         is_pure=True, pack=1)
    r = sel * 0
    for t in tl.static_range(4):
        s = (sel >> (4 * t)) & 15
        v = (tl.where((s & 7) < 4, a, b) >> (8 * (s & 3))) & 0xFF
        v = tl.where(s >= 8, tl.where(v >= 0x80, 0xFF, 0), v)
        r |= v << (8 * t)
    return r


@triton.jit
def _funnel(lo, hi, s, HW: tl.constexpr):
    # (hi:lo) >> s for s in 0 .. 31 (shf.r.clamp.b32)
    if HW:
        return tl.inline_asm_elementwise("shf.r.clamp.b32 $0, $1, $2, $3;", "=r,r,r,r", [lo, hi, s], dtype=tl.uint32,
                                         is_pure=True, pack=1)
    return tl.where(s == 0, lo, (lo >> s) | ((hi << 1) << (31 - s)))


@triton.jit
def _u(v):
    return v.to(tl.uint32, bitcast=True)


@triton.jit
def _nib_esc(x):
    # bit 4i set where nibble i's low 3 bits are all ones (code 7)
    return x & (x >> 1) & (x >> 2) & 0x11111111


@triton.jit
def _clamp8(v):
    # a rank clamped at 8, in each of 4 nibbles
    return tl.minimum(v, 8).to(tl.uint32) * 0x1111


@triton.jit
def _window(rank, tot, esc_ptr, NESCW, TAB, HW: tl.constexpr, BN: tl.constexpr = 1, W: tl.constexpr = 1,
            WIN1D: tl.constexpr = False):
    # exponent hi bytes and low bits (as 0x01) of a run's first 8 escapes, 4 a word: (eh0, eh1, el0, el1) [BN, W].
    # WIN1D: the two digit-word gathers as 1-D [BN W] loads reshaped back (the same values). A gather of [BN, W]
    # addresses gets lanes along BN from the compiler; version 3's loads have theirs along W, and a 2-D
    # gather there costs the decode a layout conversion through shared memory each way (probe: relaid1d)
    HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1 = TAB
    wi = rank >> 3
    sh = (4 * (rank & 7)).to(tl.uint32)
    m0 = (tot > 0) & (wi < NESCW)
    m1 = (tot + (rank & 7) > 8) & (wi + 1 < NESCW)
    if WIN1D:
        p0 = tl.reshape(esc_ptr + wi, [BN * W])
        w0 = _u(tl.reshape(tl.load(p0, mask=tl.reshape(m0, [BN * W]), other=0), [BN, W]))
        w1 = _u(tl.reshape(tl.load(p0 + 1, mask=tl.reshape(m1, [BN * W]), other=0), [BN, W]))
    else:
        w0 = _u(tl.load(esc_ptr + wi, mask=m0, other=0))
        w1 = _u(tl.load(esc_ptr + wi + 1, mask=m1, other=0))
    win = _funnel(w0, w1, sh, HW)  # digit i (i < 8) in nibble i
    d0 = win & 0xFFFF
    d1 = win >> 16
    # digits 0-7 from the A tables, 8-15 from the B ones: the other table's lookup has bit 3 set, reads 0
    eh0 = _prmt(HA0, HA1, d0, HW) | _prmt(HB0, HB1, d0 ^ 0x8888, HW)
    eh1 = _prmt(HA0, HA1, d1, HW) | _prmt(HB0, HB1, d1 ^ 0x8888, HW)
    el0 = _prmt(LA0, LA1, d0, HW) | _prmt(LB0, LB1, d0 ^ 0x8888, HW)
    el1 = _prmt(LA0, LA1, d1, HW) | _prmt(LB0, LB1, d1 ^ 0x8888, HW)
    return eh0, eh1, el0, el1


@triton.jit
def _half(Xa, Xb, s4, Fa, Fb, Pa, Pb, Pc, Pd, eh0, eh1, el0, el1, TH0, TH1, TL0, TL1, HW: tl.constexpr):
    # (hi, lo) byte lanes [BN, W, 4] of one half of each run: lanes q = 0..3 are (Xa, h 0), (Xa, 1), (Xb, 0),
    # (Xb, 1). Fa, Fb: the words' escape flags times 4; Pa, Pb: their exclusive nibble prefix counts;
    # Pc, Pd: their first ranks in the run clamped at 8, times 0x1111
    qq = tl.arange(0, 4)[None, None, :]
    h = (qq & 1).to(tl.uint32)
    lo2 = qq < 2
    X = tl.where(lo2, Xa[:, :, None], Xb[:, :, None])
    sel = (X >> (16 * h)) & 0x7777
    hot_hi = _prmt(TH0, TH1, sel, HW)
    hot_lo = _prmt(TL0, TL1, sel, HW)
    g4 = tl.where(lo2, Fa[:, :, None], Fb[:, :, None]) >> (16 * h)  # bit 2 of an escape's nibble
    k = (tl.where(lo2, Pa[:, :, None], Pb[:, :, None]) >> (16 * h)) + tl.where(lo2, Pc[:, :, None], Pd[:, :, None])
    sel2 = g4 | 0x3210  # an escape's byte from the escapes' word (byte 4 + t)
    esc_lo = _prmt(el0[:, :, None], el1[:, :, None], k, HW) << 7
    hot_hi = _prmt(hot_hi, _prmt(eh0[:, :, None], eh1[:, :, None], k, HW), sel2, HW)
    hot_lo = _prmt(hot_lo, esc_lo, sel2, HW)
    return hot_hi | (s4 & 0x80808080), hot_lo | (s4 & 0x7F7F7F7F)


@triton.jit
def load_step(code_ptr, sm32_ptr, rn, nmask, kb, KP, W: tl.constexpr, FULL: tl.constexpr):
    # the raw words of columns kb .. kb + 32 W of rows rn: code words c0, c1, c2 [BN, W] and the sm bytes
    # as two halves s4a, s4b [BN, W, 4] (16-byte vectors). FULL: every row and column exists (no masks)
    wi = tl.arange(0, W)
    qq = tl.arange(0, 4)
    cw = (rn * (3 * (KP // 32)))[:, None] + 3 * (kb // 32 + wi)[None, :]
    so = (rn * (KP // 4))[:, None, None] + ((kb // 4) + 8 * wi)[None, :, None] + qq[None, None, :]
    if FULL:
        c0 = _u(tl.load(code_ptr + cw))
        c1 = _u(tl.load(code_ptr + cw + 1))
        c2 = _u(tl.load(code_ptr + cw + 2))
        s4a = _u(tl.load(sm32_ptr + so))
        s4b = _u(tl.load(sm32_ptr + so + 4))
    else:
        wmask = nmask[:, None] & ((kb // 32 + wi) < KP // 32)[None, :]
        c0 = _u(tl.load(code_ptr + cw, mask=wmask, other=0))
        c1 = _u(tl.load(code_ptr + cw + 1, mask=wmask, other=0))
        c2 = _u(tl.load(code_ptr + cw + 2, mask=wmask, other=0))
        s4a = _u(tl.load(sm32_ptr + so, mask=wmask[:, :, None], other=0))
        s4b = _u(tl.load(sm32_ptr + so + 4, mask=wmask[:, :, None], other=0))
    return c0, c1, c2, s4a, s4b


@triton.jit
def decode_words(c0, c1, c2, s4a, s4b, esc_ptr, NESCW, run, TAB, LUT, HW: tl.constexpr, BN: tl.constexpr = 1,
                 W: tl.constexpr = 1, WIN1D: tl.constexpr = False):
    # a step's words (load_step) as lane words (hia, loa, hib, lob) [BN, W, 4] (hi and lo bytes of 4
    # weights each: half a = columns 0-15 of each run, half b = 16-31), and run [BN, 1] moved past the
    # step's escapes. run: the stream index of each row's first escape at or after the step's first column.
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
    eh0, eh1, el0, el1 = _window(rk, tot, esc_ptr, NESCW, TAB, HW, BN, W, WIN1D)
    z = c0 * 0
    hia, loa = _half(c0, c1, s4a, f0 << 2, f1 << 2, f0 * 0x11111110, f1 * 0x11111110, z, _clamp8(n0),
                     eh0, eh1, el0, el1, TH0, TH1, TL0, TL1, HW)
    hib, lob = _half(c2, d, s4b, f2 << 2, f3 << 2, f2 * 0x11111110, f3 * 0x11111110, _clamp8(b2), _clamp8(b3),
                     eh0, eh1, el0, el1, TH0, TH1, TL0, TL1, HW)
    return hia, loa, hib, lob, run + tl.sum(tot, axis=1, keep_dims=True)


@triton.jit
def load_step_v3(code_ptr, sm32_ptr, rn, nmask, kb, KP, BN: tl.constexpr, W: tl.constexpr, FULL: tl.constexpr):
    # load_step on format version 3's arrays (glyd.codec.dense11_v3): inside block b (rb runs), the step's W
    # runs from run j0 on read W consecutive words of each plane (c_x at 96 b + x rb + j0) and W consecutive
    # 16-byte halves (half h at 1024 b + 16 h rb + 16 j0). The halves load as [BN, 4 W] words, contiguous
    # along the row (the compiler then puts the lanes along it: whole sectors), and are reshaped in place
    wi = tl.arange(0, W)
    vi = tl.arange(0, 4 * W)
    runs = KP // 32
    b = kb // BLOCK_C
    rb = tl.minimum(runs - 32 * b, 32)
    j0 = (kb - b * BLOCK_C) // 32
    cw = (rn * (3 * runs))[:, None] + (96 * b + j0 + wi)[None, :]
    so = (rn * (KP // 4))[:, None] + (256 * b + 4 * j0 + vi)[None, :]
    if FULL:
        c0 = _u(tl.load(code_ptr + cw))
        c1 = _u(tl.load(code_ptr + cw + rb))
        c2 = _u(tl.load(code_ptr + cw + 2 * rb))
        s4a = _u(tl.load(sm32_ptr + so))
        s4b = _u(tl.load(sm32_ptr + so + 4 * rb))
    else:
        wmask = nmask[:, None] & ((kb // 32 + wi) < runs)[None, :]
        vmask = nmask[:, None] & ((kb // 32 + vi // 4) < runs)[None, :]
        c0 = _u(tl.load(code_ptr + cw, mask=wmask, other=0))
        c1 = _u(tl.load(code_ptr + cw + rb, mask=wmask, other=0))
        c2 = _u(tl.load(code_ptr + cw + 2 * rb, mask=wmask, other=0))
        s4a = _u(tl.load(sm32_ptr + so, mask=vmask, other=0))
        s4b = _u(tl.load(sm32_ptr + so + 4 * rb, mask=vmask, other=0))
    return c0, c1, c2, tl.reshape(s4a, [BN, W, 4]), tl.reshape(s4b, [BN, W, 4])


@triton.jit
def load_words(code_ptr, sm32_ptr, rn, nmask, kb, KP, BN: tl.constexpr, W: tl.constexpr, FULL: tl.constexpr,
               V3: tl.constexpr):
    # a step's raw words in format version 2's order (load_step) or version 3's (load_step_v3)
    if V3:
        r = load_step_v3(code_ptr, sm32_ptr, rn, nmask, kb, KP, BN, W, FULL)
    else:
        r = load_step(code_ptr, sm32_ptr, rn, nmask, kb, KP, W, FULL)
    return r


@triton.jit
def decode_step(code_ptr, sm32_ptr, esc_ptr, rn, nmask, kb, KP, NESCW, run, TAB, LUT, BN: tl.constexpr,
                W: tl.constexpr, HW: tl.constexpr, FULL: tl.constexpr, V3: tl.constexpr = False):
    # Columns kb .. kb + 32 W of rows rn as lane words (hia, loa, hib, lob) [BN, W, 4] and run [BN, 1]
    # moved past the step's escapes: load_words then decode_words (version 3: its digits gathered 1-D)
    c0, c1, c2, s4a, s4b = load_words(code_ptr, sm32_ptr, rn, nmask, kb, KP, BN, W, FULL, V3)
    return decode_words(c0, c1, c2, s4a, s4b, esc_ptr, NESCW, run, TAB, LUT, HW, BN, W, V3)


@triton.jit
def block_start(ebase_ptr, eoff_ptr, b, mask):
    # [BN, 1]: index in the digit stream of block b's first escape
    r = tl.load(ebase_ptr + b // 16, mask=mask, other=0) + tl.load(eoff_ptr + b, mask=mask, other=0).to(tl.int32)
    return r[:, None]


def _i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - 2**32 if v >= 2**31 else v


def _word(v: list[int]) -> int:
    return _i32(sum(b << (8 * i) for i, b in enumerate(v)))


class PreparedV2(Prepared):
    """``dense11.unpack.Prepared`` (offsets, stream length, exception list and version 2's rank rule
    checked against the codes, the exceptions' row pointers and true words), for version 2: also
    the kernels' tables as ints: ``lut`` (hi bytes, low bits of ``base + code``, codes 0-7) and
    ``tab`` (hi bytes, low bits of the escape table's digits 0-15, digit 15 exponent 0). Host syncs
    here, once a matrix."""

    def __init__(self, p: Packed) -> None:
        sm = p.arrays["sm"]
        # the launchers view sm as int32 words, which torch allows at a storage offset divisible by 4 only (a
        # memory-mapped CPU file may start anywhere: the interpreter reads it; a CUDA storage starts aligned)
        if sm.storage_offset() % 4:
            raise FormatError(f"dense11 array 'sm' must start at a 4-byte aligned place of its storage (versions 2 "
                              f"and 3's kernels read it as 32-bit words), got storage offset {sm.storage_offset()}")
        super().__init__(p)
        a = p.arrays
        base = int(a["base"][0])  # in range: checked by Prepared
        self.nescw = int(a["esc"].numel())
        et = [int(v) for v in a["etab"].tolist()] + [0]
        hi, lo = [e >> 1 for e in et], [e & 1 for e in et]
        self.tab = tuple(_word(v[i:i + 4]) for v in (hi, lo) for i in (0, 4, 8, 12))
        ex = [(base + c) & 0xFF for c in range(8)]
        self.lut = (_word([e >> 1 for e in ex[:4]]), _word([e >> 1 for e in ex[4:]]),
                    _word([(e & 1) << 7 for e in ex[:4]]), _word([(e & 1) << 7 for e in ex[4:]]))


def prepare(p: Packed) -> PreparedV2:
    """The checked per-matrix data of the version-2 or version-3 matrix ``p`` (once a matrix; again after an
    in-place change)."""
    if not isinstance(p, Packed) or p.layout != _codec.NAME or p.version not in (2, 3):
        raise TypeError("packed must be a dense11 glyd.Packed of format version 2 or 3")
    return C.cached(p.arrays["code"], lambda: PreparedV2(p), p.arrays.values(), C.packed_tag(p))


def hw() -> bool:
    """Inline PTX (``prmt``, ``popc``, ``shf``) where the kernels compile for a GPU."""
    return not C.interpreting()


__all__ = ["decode_step", "load_step", "load_step_v3", "load_words", "decode_words", "block_start",
           "PreparedV2", "prepare", "hw", "torch"]
