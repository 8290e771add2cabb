"""The kvf12 page decode on 32-bit words (SWAR), for the pool's attention kernel (``glyd.kv._triton_fixed``,
``AttentionConfig(swar=True)``): Triton helpers only.

The byte-wise decode (``_triton_fixed._decode``) widens every ``lo`` and ``code`` byte to an int32 and
spends about 7.6 integer instructions a value in its loop (sm_90 SASS, 2026-12-04: byte extracts, masks, a
multiply, shifts, the bf16 pair packing). Here one ``code`` word (4 bytes: 4 channels of each half) and one ``lo``
word of each half give four words of two bf16 values each, about 3.4 in the loop
(``benchmarks/probes/pool_sass.py``)::

    high = (c & 8) * 15 + c + base        # c: a value's 4-bit code; the four of a word's bytes at once
    pair = lo | high << 8                 # two values a word: bytes lo, high, lo, high (byte selects)

``P0`` holds channels ``4k`` and ``4k+2`` of a half (bytes 0 and 2 of its words), ``P1`` channels ``4k+1``
and ``4k+3``; the four high bytes come first, from the code word's nibbles, one a byte (no byte carries
into the next: ``base <= 120``); on a GPU each pair is one ``prmt`` (``_pairs``; the interpreter, which cannot run
inline PTX, takes the same bytes by shifts and masks). A tile keeps each word's two values side by side (its
channels in *word order*: position ``n`` holds channel ``perm(n)``, bits 0 and 1 of ``n`` swapped), so the words
feed the dot operands as they are; the query and the output are put in and out of word order by ``word_order``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def perm(n):
    """The channel at position ``n`` of a word-order tile (bits 0 and 1 swapped; ``perm(perm(n)) == n``)."""
    return (n & ~3) | ((n >> 1) & 1) | ((n & 1) << 1)


@triton.jit
def word_order(x, R: tl.constexpr, C: tl.constexpr):
    """``[R, C]`` in channel order -> in word order (column ``n`` holds channel ``perm(n)``)."""
    return tl.reshape(tl.permute(tl.reshape(x, [R, C // 4, 2, 2]), (0, 1, 3, 2)), [R, C])


@triton.jit
def _highs(c4, base4):
    """High bytes of four values (uint32, a value a byte) from their 4-bit codes in the low nibbles of
    ``c4``'s bytes and ``base4`` (the window base in every byte)."""
    return c4 + (c4 & 0x08080808) * 15 + base4


@triton.jit
def word_bases(base_ptr, meta_ptr, blk, D: tl.constexpr):
    """A block's window base in every byte for each word column of the two halves (``[D/8]`` uint32:
    word ``k`` of a half is channels ``4k .. 4k+3``, group ``k // 4``), and its exception range."""
    HW: tl.constexpr = D // 8
    offs = tl.arange(0, HW)
    bp = base_ptr + blk * (D // 16)
    ba = tl.load(bp + offs // 4).to(tl.uint32) * 0x01010101
    bb = tl.load(bp + D // 32 + offs // 4).to(tl.uint32) * 0x01010101
    return ba, bb, tl.load(meta_ptr + blk * 2), tl.load(meta_ptr + blk * 2 + 1)


@triton.jit
def _patch_one(a0, a1, b0, b1, ent, live, t0, TS: tl.constexpr, D: tl.constexpr):
    """One exception entry put into the four word tiles (``[TS, D/8]`` uint32, before ``_halves``) if ``live`` and its
    row is in ``t0 .. t0+TS``: channel ``c`` of a half is the low (``c & 2 == 0``) or high 16 bits of word ``c // 4``
    of tile ``c & 1``; one ``where`` over the one word tile it is in."""
    H: tl.constexpr = D // 2
    idx = ent & 0xFFFF
    r = idx // D - t0
    if live & (r >= 0) & (r < TS):
        rows = tl.arange(0, TS)[:, None]
        cols = tl.arange(0, D // 8)[None, :]
        c = idx % D
        h = c % H
        sh = ((h & 2) * 8).to(tl.uint32)
        word = ((ent >> 16) & 0xFFFF).to(tl.uint32) << sh
        keep = tl.full([], 0xFFFF0000, tl.uint32) >> sh  # the other value's 16 bits
        hit = (rows == r) & (cols == h // 4)
        if c < H:
            if h % 2 == 0:
                a0 = tl.where(hit, (a0 & keep) | word, a0)
            else:
                a1 = tl.where(hit, (a1 & keep) | word, a1)
        else:
            if h % 2 == 0:
                b0 = tl.where(hit, (b0 & keep) | word, b0)
            else:
                b1 = tl.where(hit, (b1 & keep) | word, b1)
    return a0, a1, b0, b1


@triton.jit
def _patch_words(a0, a1, b0, b1, exc_ptr, e0, ne, t0, TS: tl.constexpr, D: tl.constexpr):
    """The block's exceptions in rows ``t0 .. t0+TS`` put into the four word tiles, in the arena's order (only blocks
    that have any run this): two entries a trip, so their loads overlap; past the end the second is not applied (no
    index is free to mark it: on a page of 65,536 values every 16-bit index is a position, 0xFFFF row P-1 channel D-1)"""
    e1 = e0 + ne
    for e in range(e0, e1, 2):
        ent = tl.load(exc_ptr + e)
        live = e + 1 < e1
        nxt = tl.load(exc_ptr + e + 1, mask=live, other=0)
        a0, a1, b0, b1 = _patch_one(a0, a1, b0, b1, ent, True, t0, TS, D)
        a0, a1, b0, b1 = _patch_one(a0, a1, b0, b1, nxt, live, t0, TS, D)
    return a0, a1, b0, b1


#: ``prmt`` selectors of ``_pairs`` (result byte t <- byte nibble t of hi:lo): bytes 0, 2 and bytes 1, 3 of each.
PAIR_EVEN = tl.constexpr(0x6240)
PAIR_ODD = tl.constexpr(0x7351)


@triton.jit
def _pairs(lo, hi, ODD: tl.constexpr, PRMT: tl.constexpr):
    """Two bf16 words a 32-bit word: bytes 0 and 2 (``ODD``: 1 and 3) of ``lo`` and ``hi`` interleaved, low
    byte first (one ``prmt`` on a GPU instead of a shift and two logic operations)."""
    if PRMT:
        sel = lo * 0 + (PAIR_ODD if ODD else PAIR_EVEN)
        return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [lo, hi, sel], dtype=tl.uint32,
                                         is_pure=True, pack=1)
    elif ODD:
        return ((lo >> 8) & 0x00FF00FF) | (hi & 0xFF00FF00)
    else:
        return (lo & 0x00FF00FF) | ((hi << 8) & 0xFF00FF00)


@triton.jit
def _halves(w0, w1, TS: tl.constexpr, H: tl.constexpr):
    """Word tiles ``[TS, H/4]`` -> a half tile ``[TS, H]`` of uint16 words in word order (each word's lanes side
    by side)."""
    lo = tl.join(w0.to(tl.uint16), w1.to(tl.uint16))
    x = tl.join(lo, tl.join((w0 >> 16).to(tl.uint16), (w1 >> 16).to(tl.uint16)))
    return tl.reshape(x, [TS, H])


@triton.jit
def decode_words(lo_ptr, code_ptr, exc_ptr, blk, t0, ba, bb, e0, ne, P: tl.constexpr, TS: tl.constexpr,
                 D: tl.constexpr, PRMT: tl.constexpr = False):
    """Rows ``t0 .. t0+TS`` of one block -> two bf16 half tiles ``[TS, D/2]`` in word order, from the
    ``lo`` and ``code`` planes read as int32 words (``lo_ptr``: ``[NB, P, D/4]``, ``code_ptr``: ``[NB, P, D/8]``);
    ``PRMT``: the byte pairs by ``prmt`` (a GPU), else by shifts and masks (the interpreter: the same bits)."""
    HW: tl.constexpr = D // 8
    rows = (t0 + tl.arange(0, TS))[:, None]
    cols = tl.arange(0, HW)[None, :]
    cw = tl.load(code_ptr + blk * (P * HW) + rows * HW + cols).to(tl.uint32, bitcast=True)
    lop = lo_ptr + blk * (P * 2 * HW) + rows * (2 * HW) + cols
    la = tl.load(lop).to(tl.uint32, bitcast=True)
    lb = tl.load(lop + HW).to(tl.uint32, bitcast=True)
    ha = _highs(cw & 0x0F0F0F0F, ba[None, :])  # half A's codes: the low nibbles
    hb = _highs((cw >> 4) & 0x0F0F0F0F, bb[None, :])  # half B's: the high nibbles
    a0 = _pairs(la, ha, False, PRMT)  # channels 4k, 4k+2: low, high, low, high byte
    a1 = _pairs(la, ha, True, PRMT)  # channels 4k+1, 4k+3
    b0 = _pairs(lb, hb, False, PRMT)
    b1 = _pairs(lb, hb, True, PRMT)
    # the patch on the word tiles (a quarter of a half tile's elements); the joins in both arms of the if, as Triton
    # 3.6 gives the dots kWidth 2 only where no join traces into their operands (4: ~85 register moves a sub-tile)
    if ne > 0:
        a0, a1, b0, b1 = _patch_words(a0, a1, b0, b1, exc_ptr, e0, ne, t0, TS, D)
        ta = _halves(a0, a1, TS, D // 2)
        tb = _halves(b0, b1, TS, D // 2)
    else:
        ta = _halves(a0, a1, TS, D // 2)
        tb = _halves(b0, b1, TS, D // 2)
    return ta.to(tl.bfloat16, bitcast=True), tb.to(tl.bfloat16, bitcast=True)
