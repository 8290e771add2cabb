"""``dense11``: about 11.1-11.2 bits a weight, fixed rate on the hot path, escapes ranked by popcount.

Sign and mantissa are kept raw in one byte a weight (``sm = sign<<7 | mantissa``, as in
``tiered``). The exponent becomes a 3-bit code held as three bit planes (32 weights a 32-bit word
a plane): codes 0-6 are the exponents ``base .. base+6``, the 7-exponent window that covers the
most weights of the matrix; code 7 is an escape (3-4.4% of real weights). A 32-weight run's
escapes are the AND of its three plane words, so an escape finds its rank with a popcount; no other
weight does any rank work.

Each escape has a 4-bit digit in one stream (``esc``, 8 a 32-bit word) in row-major order: 0-14
pick the exponent from a 15-entry table (the next most frequent exponents), 15 says the exponent
is in a sorted exception list (``exc_idx``, ``exc_exp``: about 0.0005% of real weights). Where a
block's digits start (a block = 1024 columns of one row) is in an offset table: a 32-bit base a
16 blocks, a 16-bit offset a block. Byte-level layout and the measurements behind these choices:
``docs/format.md`` and ``benchmarks/history/2026-12-02-dense-layout-cpu.md``.

That is format version 1 (bit planes), which this module still reads, as version 2
(``glyd.codec.dense11_v2``: the same arrays, code words as nibbles for a byte permute, at most 8
table digits a run). ``pack`` writes version 3 (``glyd.codec.dense11_v3``: version 2's arrays with
``code`` and ``sm`` in a block-wise order a GPU warp reads in whole sectors). Each version has its
own GPU kernels; a loaded matrix keeps its version (no conversion at load: every old file loads as
it is, and ``as_v2`` gives the CPU decoders version 2's order of a version-3 matrix).

>>> import torch, glyd
>>> w = torch.randn(4, 100).to(torch.bfloat16)
>>> p = glyd.pack(w, "dense11")
>>> p.version, torch.equal(glyd.unpack(p).view(torch.int16), w.view(torch.int16))
(3, True)
"""

from __future__ import annotations

import numpy as np
import torch

from glyd.codec import dense11_v2 as _v2
from glyd.codec import dense11_v3 as _v3
from glyd.codec.layout import Layout, register
from glyd.codec.packed import Packed, as_bf16_matrix, check_no_extra, expect_array, round_up
from glyd.errors import CorruptError, FormatError

NAME = "dense11"
#: K is padded to a multiple of GROUP (two 32-weight plane words a plane).
GROUP = 64
#: Weights of one plane word.
WORD = 32
#: Exponents of the window (codes 0..6); code 7 escapes.
WINDOW = 7
ESCAPE = 7
MAX_BASE = 255 - (WINDOW - 1)
#: Entries of the escape table (digits 0..14); digit 15 sends the weight to the exception list.
ETAB = 15
RAW = 15
#: Columns of one row that an escape block covers, and blocks a superblock (one 32-bit base).
#: A superblock holds at most 16 * 1024 escapes: its 16-bit offsets never overflow.
BLOCK = 1024
SUPER = 16
ARRAYS = ("sm", "code", "base", "etab", "esc", "esc_base", "esc_off", "exc_idx", "exc_exp")


def padded_cols(k: int) -> int:
    return round_up(k, GROUP)


def blocks_per_row(k: int) -> int:
    return (padded_cols(k) + BLOCK - 1) // BLOCK


def num_blocks(n: int, k: int) -> int:
    return n * blocks_per_row(k)


def histogram(exp: np.ndarray) -> np.ndarray:
    """int64[256]: how many weights have each exponent."""
    return torch.bincount(torch.from_numpy(exp.reshape(-1)), minlength=256).numpy()


def choose_base(hist: np.ndarray) -> int:
    """The window start ``b`` that maximises the weights with ``b <= exponent < b+7`` (lowest on ties)."""
    return int(np.argmax(np.convolve(hist, np.ones(WINDOW, dtype=np.int64), "valid")))  # first maximum


def escape_table(hist: np.ndarray, base: int) -> np.ndarray:
    """The 15 most frequent exponents outside the window (ties: lower exponent first), uint8[15]."""
    hist = hist.astype(np.int64)  # a copy
    hist[base : base + WINDOW] = -1  # never in the table
    return np.argsort(-hist, kind="stable")[:ETAB].astype(np.uint8)


def planes_of(codes: np.ndarray) -> np.ndarray:
    """int32 [N, 3 * Kp/32] plane words of uint8 codes [N, Kp] (word 3w + p: bit p of weights 32w..32w+31)."""
    n, kp = codes.shape
    c = codes.reshape(n, kp // WORD, WORD)
    words = np.empty((n, kp // WORD, 3, 4), dtype=np.uint8)  # 4 bytes = one little-endian word
    for p in range(3):
        words[:, :, p] = np.packbits((c & np.uint8(1 << p)) != 0, axis=-1, bitorder="little")
    return words.view(np.int32).reshape(n, 3 * (kp // WORD))


def codes_of(planes: np.ndarray, n: int, kp: int) -> np.ndarray:
    """uint8 codes [N, Kp] of plane words (the inverse of ``planes_of``)."""
    b = np.ascontiguousarray(planes).view(np.uint8).reshape(n, kp // WORD, 3, 4)
    bits = np.unpackbits(b, axis=-1, bitorder="little")  # [N, W, 3, 32]
    return (bits[:, :, 0] | (bits[:, :, 1] << 1) | (bits[:, :, 2] << 2)).reshape(n, kp)


def _offsets(esc_mask: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(esc_base int64, esc_off int64, total) of the escapes of each block (row-major block order)."""
    kp = esc_mask.shape[1]
    nbr = blocks_per_row(k)
    padded = np.zeros((n, nbr * BLOCK), dtype=bool)
    padded[:, :kp] = esc_mask
    counts = padded.reshape(n * nbr, BLOCK).sum(axis=1, dtype=np.int64)
    off = np.zeros(n * nbr + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    base = np.concatenate([off[:-1][::SUPER], off[-1:]])
    rel = off[:-1] - base[np.arange(n * nbr) // SUPER]
    return base, rel, int(off[-1])


def pack(w: torch.Tensor) -> Packed:
    """Format version 3 of ``w`` (what ``glyd.pack(w, "dense11")`` writes)."""
    return pack_v3(w)


def pack_v2(w: torch.Tensor) -> Packed:
    """Format version 2 of ``w`` (``glyd.codec.dense11_v2``: code words as nibbles, ranks capped)."""
    p = pack_v1(w)
    return Packed(NAME, p.shape, _v2.from_v1(dict(p.arrays), p.shape), 2)


def pack_v3(w: torch.Tensor) -> Packed:
    """Format version 3 of ``w`` (``glyd.codec.dense11_v3``: version 2 with ``code`` and ``sm`` block-wise)."""
    p = pack_v2(w)
    return Packed(NAME, p.shape, _v3.from_v2(dict(p.arrays)), 3)


def as_v2(p: Packed) -> Packed:
    """``p`` itself, or for a version-3 matrix the same matrix in version 2's order (a permuted copy of
    ``code`` and ``sm``, on their device): what the CPU decoders and checks read."""
    if p.version != 3:
        return p
    return Packed.trusted(NAME, p.shape, _v3.to_v2(dict(p.arrays)), 2)


def pack_v1(w: torch.Tensor) -> Packed:
    """Format version 1 of ``w`` (bit planes): still read everywhere, no longer written by ``pack``."""
    w = as_bf16_matrix(w)
    n, k = w.shape
    kp = padded_cols(k)
    u = w.view(torch.int16).numpy().view(np.uint16)
    exp = (u >> 7).astype(np.uint8)  # the cast drops the sign bit
    hist = histogram(exp)
    base = choose_base(hist)
    etab = escape_table(hist, base)
    off = exp - np.uint8(base)  # wraps below base: one unsigned compare tests the window
    inside = off < WINDOW
    codes = np.zeros((n, kp), dtype=np.uint8)  # padding: code 0, sm 0, never escapes
    codes[:, :k] = np.where(inside, off, np.uint8(ESCAPE))
    sm = np.zeros((n, kp), dtype=np.uint8)
    sm[:, :k] = (((u >> 8) & 0x80) | (u & 0x7F)).astype(np.uint8)

    flat = np.flatnonzero(~inside)  # row-major: the stream order (blocks are row-major too)
    e = exp.reshape(-1)[flat]
    slot = np.full(256, RAW, dtype=np.uint8)
    slot[etab[::-1]] = np.arange(ETAB - 1, -1, -1, dtype=np.uint8)  # first entry wins on repeats
    digit = slot[e]
    total = flat.size
    i = np.arange(total)
    # digits of one word come from distinct escapes, so summing their disjoint nibbles ORs them
    # (bincount's float64 sums of values < 2**32 are exact, and far faster than np.add.at)
    nib = digit.astype(np.float64) * np.exp2(4 * (i % 8))
    words = np.bincount(i // 8, weights=nib, minlength=(total + 7) // 8).astype(np.uint32)
    ebase, rel, _ = _offsets(codes == ESCAPE, n, k)
    raw = digit == RAW
    idx_dtype = np.int32 if n * k < 2**31 else np.int64
    arrays = {
        "sm": torch.from_numpy(sm),
        "code": torch.from_numpy(planes_of(codes)),
        "base": torch.tensor([base], dtype=torch.uint8),
        "etab": torch.from_numpy(etab),
        "esc": torch.from_numpy(words.view(np.int32)),
        "esc_base": torch.from_numpy(ebase.astype(np.int32 if total < 2**31 else np.int64)),
        "esc_off": torch.from_numpy(rel.astype(np.int64)).to(torch.int32).to(torch.int16).view(torch.uint16),
        "exc_idx": torch.from_numpy(flat[raw].astype(idx_dtype)),
        "exc_exp": torch.from_numpy(e[raw].astype(np.uint8)),
    }
    return Packed(NAME, (n, k), arrays, 1)


def check_arrays(shape: tuple[int, int], arrays: dict[str, torch.Tensor]) -> None:
    n, k = shape
    kp = padded_cols(k)
    nblk = num_blocks(n, k)
    check_no_extra(arrays, ARRAYS, NAME)
    expect_array(arrays, "sm", torch.uint8, (n, kp))
    expect_array(arrays, "code", torch.int32, (n, 3 * (kp // WORD)))
    expect_array(arrays, "base", torch.uint8, (1,))
    expect_array(arrays, "etab", torch.uint8, (ETAB,))
    esc = expect_array(arrays, "esc", torch.int32, None)
    if esc.dim() != 1 or esc.numel() > (n * kp + 7) // 8:
        raise FormatError(f"packed array 'esc' must be 1-D of at most {(n * kp + 7) // 8} words, got {tuple(esc.shape)}")
    expect_array(arrays, "esc_base", (torch.int32, torch.int64), ((nblk + SUPER - 1) // SUPER + 1,))
    expect_array(arrays, "esc_off", torch.uint16, (nblk,))
    idx = expect_array(arrays, "exc_idx", (torch.int32, torch.int64), None)
    ee = expect_array(arrays, "exc_exp", torch.uint8, None)
    if idx.dim() != 1 or ee.dim() != 1 or idx.numel() != ee.numel():
        raise FormatError(f"exc_idx {tuple(idx.shape)} and exc_exp {tuple(ee.shape)} must be 1-D of one length")
    if idx.numel() > n * k:
        raise FormatError(f"{idx.numel()} exceptions for a {n}x{k} matrix")


def block_offsets(p: Packed) -> np.ndarray:
    """int64 [B + 1]: index in ``esc`` of each block's first digit, then the total (checked)."""
    n, k = p.shape
    a = p.arrays
    nblk = num_blocks(n, k)
    base = a["esc_base"].numpy().astype(np.int64)
    rel = a["esc_off"].to(torch.int32).numpy().astype(np.int64)
    off = np.concatenate([base[np.arange(nblk) // SUPER] + rel, base[-1:]])
    if int(base[0]) != 0 or bool((off[1:] < off[:-1]).any()) or bool((base[1:] < base[:-1]).any()):
        raise CorruptError("dense11 'esc_base'/'esc_off' are not an increasing table of escape offsets")
    return off


def _check_values(p: Packed, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # Value checks need the data, so they run on unpack (as for the other layouts); returns the
    # escapes' flat positions (in the padded matrix) and their digits.
    n, k = p.shape
    a = p.arrays
    kp = codes.shape[1]
    if int(a["base"][0]) > MAX_BASE:
        raise CorruptError(f"dense11 base {int(a['base'][0])} is out of range 0..{MAX_BASE}")
    esc_mask = codes == ESCAPE
    check_padding(p)
    off = block_offsets(p)
    ebase, rel, total = _offsets(esc_mask, n, k)
    want = np.concatenate([ebase[np.arange(num_blocks(n, k)) // SUPER] + rel, [total]])
    if not np.array_equal(off, want):
        raise CorruptError("dense11 escape offsets do not match the escape codes of their blocks (corrupt 'esc_off')")
    esc = a["esc"].numpy().view(np.uint32)
    if esc.size != (total + 7) // 8:
        raise CorruptError(f"dense11 'esc' has {esc.size} words for {total} escapes (needs {(total + 7) // 8})")
    check_stream_tail(a["esc"], total)
    i = np.arange(total)
    digit = ((esc[i // 8] >> (4 * (i % 8)).astype(np.uint32)) & np.uint32(15)).astype(np.uint8)
    pos = np.flatnonzero(esc_mask)  # row-major in the padded matrix
    idx = a["exc_idx"].to(torch.int64).numpy()
    raw_pos = pos[digit == RAW]
    if idx.size != raw_pos.size or not np.array_equal(idx, (raw_pos // kp) * k + raw_pos % kp):
        raise CorruptError("dense11 'exc_idx' does not list exactly the escapes whose digit is 15")
    return pos, digit


def check_stream_tail(esc: torch.Tensor, total: int) -> None:
    """CorruptError unless the last word of the escape stream ``esc`` (int32 words of ``(total + 7) // 8``
    digits, checked before) is 0 past its ``total % 8`` digits, as every writer leaves it (any version).
    No decoder reads those bits; the format says they are 0, so a file that sets them is damaged or
    crafted. One word read to the host: the load-time checks' (CPU unpack, row lookup, kernel preparation).

    >>> check_stream_tail(torch.tensor([0x21], dtype=torch.int32), 2)
    >>> check_stream_tail(torch.tensor([0x321], dtype=torch.int32), 2)
    Traceback (most recent call last):
    glyd.errors.CorruptError: dense11 'esc' word 0 (the stream's last) has unused bits 8..31 set after the 2 ...
    """
    used = total % 8
    if not used or not esc.numel():
        return
    word = int(esc[-1]) & 0xFFFFFFFF
    if word >> (4 * used):
        raise CorruptError(f"dense11 'esc' word {esc.numel() - 1} (the stream's last) has unused bits {4 * used}..31 "
                           f"set after the {used} digits of its {total} escapes ({word:#010x}; the format says 0: a "
                           f"damaged or crafted file)")


def _popcount(x: torch.Tensor) -> torch.Tensor:
    """Set bits of each 32-bit word of ``x`` (int64 values 0..2**32-1)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) & 0xFFFFFFFF) >> 24


def check_padding(p: Packed) -> None:
    """CorruptError unless the padding columns ``K .. Kp - 1`` hold code 0 and ``sm`` 0 (any version;
    torch on the arrays' device). The codec drops them, but a fused kernel multiplies them by x's
    zeros: code 6 at base 249 is exponent 255, and 0 * inf is NaN."""
    n, k = p.shape
    sm, code = p.arrays["sm"], p.arrays["code"]
    kp = sm.shape[1]
    if n == 0 or k == kp:
        return
    sm_tail = sm[:, k:]
    if p.version == 3:  # version 2's order: the last 2 runs' words, the padding columns' sm bytes
        code = _v3.restore_code(code)
        sm_tail = sm[:, _v3.sm_columns(kp, sm.device)[k:]]
    w = code.reshape(n, kp // WORD, 3)[:, -2:]  # the last 64 columns (Kp - K < 64)
    if p.version == 1:
        bit = torch.arange(WORD, device=w.device)
        w = w.to(torch.int64) & 0xFFFFFFFF
        tail = sum(((w[..., q, None] >> bit) & 1) << q for q in range(3))
    else:
        tail = _v2.codes_of(w)
    if bool(tail.reshape(n, 2 * WORD)[:, k - kp + 2 * WORD :].any()) or bool(sm_tail.any()):
        raise CorruptError(f"dense11 padding columns {k}..{kp - 1} must hold code 0 and sm 0 (a damaged or crafted "
                           f"'code' or 'sm')")


def device_escapes(p: Packed, chunk: int = 1 << 22) -> tuple[torch.Tensor, torch.Tensor]:
    """(int64 [blocks]: escape codes of each 1024-column block of each row, padding included; int64:
    flat indices ``r * k + c`` of the escapes whose digit is 15, the exception list's due) of either
    version, checked: padding (``check_padding``), version 2's (and 3's) rank rule. Torch ops on the arrays'
    device, ``chunk`` bytes of a plane at once: the row lookup's and the kernels' checks."""
    n, k = p.shape
    check_padding(p)
    code, stream = p.arrays["code"], p.arrays["esc"].to(torch.int64) & 0xFFFFFFFF
    words, nbr = code.shape[1] // 3, blocks_per_row(k)
    per, kp = BLOCK // WORD, words * WORD  # plane words a block; padded columns
    counts = [torch.zeros(n * nbr if not words else 0, dtype=torch.int64, device=code.device)]
    raw = [torch.zeros(0, dtype=torch.int64, device=code.device)]
    bit = torch.arange(WORD, device=code.device)
    step, first = max(1, chunk // max(1, 8 * kp)), 0  # rows at once; digits of the rows before
    for r in range(0, n if words else 0, step):
        w = code[r : r + step]
        w = (_v3.restore_code(w) if p.version == 3 else w).reshape(-1, words, 3)
        if p.version == 1:
            w = w.to(torch.int64) & 0xFFFFFFFF
            esc = w[..., 0] & w[..., 1] & w[..., 2]  # [rows, Kp/32]: a bit an escape
        else:
            esc = _v2.escape_masks(w)
        pad = esc.new_zeros(esc.shape[0], nbr * per)
        pad[:, :words] = _popcount(esc)
        counts.append(pad.view(-1, per).sum(1))
        pos = torch.nonzero(((esc[..., None] >> bit) & 1).reshape(-1)).reshape(-1)  # row-major, padded
        i = first + torch.arange(pos.numel(), device=pos.device)
        # (a stream too short for the codes is refused by the caller: the clamp only keeps this in bounds)
        word = stream[(i // 8).clamp(max=stream.numel() - 1)] if stream.numel() else torch.zeros_like(i)
        digit = (word >> (4 * (i % 8))) & 15
        if p.version != 1:  # a run's escapes of rank 8 and up must be exceptions (the kernels' premise)
            _v2.check_ranks(((esc[..., None] >> bit) & 1).bool(), digit)
        pos = pos[digit == RAW]
        raw.append((pos // kp + r) * k + pos % kp)
        first += i.numel()
    return torch.cat(counts), torch.cat(raw)


def codes_of_packed(p: Packed) -> np.ndarray:
    """uint8 codes [N, Kp] of ``p``'s code words, either version."""
    n = p.shape[0]
    kp = p.arrays["sm"].shape[1]
    if p.version == 1:
        return codes_of(p.arrays["code"].numpy(), n, kp)
    code = _v3.restore_code(p.arrays["code"]) if p.version == 3 else p.arrays["code"]
    return _v2.codes_of(code.view(n, kp // WORD, 3)).to(torch.uint8).numpy().reshape(n, kp)


def unpack(p: Packed) -> torch.Tensor:
    p = as_v2(p)  # version 3: version 2's arrays permuted
    n, k = p.shape
    a = p.arrays
    kp = a["sm"].shape[1]
    codes = codes_of_packed(p)
    pos, digit = _check_values(p, codes)
    if p.version == 2:
        _v2.check_ranks(torch.from_numpy(codes == ESCAPE).view(n, kp // WORD, WORD), torch.from_numpy(digit))
    base = int(a["base"][0])
    lut = ((np.arange(8) + base) & 0xFF).astype(np.uint8)  # code 7's entry is replaced below
    exp = lut[codes].reshape(-1)
    etab = np.concatenate([a["etab"].numpy(), np.zeros(1, dtype=np.uint8)])
    exp[pos] = etab[digit]
    if a["exc_idx"].numel():
        raw_pos = pos[digit == RAW]
        exp[raw_pos] = a["exc_exp"].numpy()
    sm = a["sm"].numpy().reshape(-1)
    out = np.empty((n * kp, 2), dtype=np.uint8)
    out[:, 0] = ((exp & np.uint8(1)) << 7) | (sm & np.uint8(0x7F))
    out[:, 1] = (sm & np.uint8(0x80)) | (exp >> 1)
    bits = torch.from_numpy(out.reshape(n, kp, 2)[:, :k].copy() if kp != k else out.reshape(n, kp, 2))
    return bits.view(torch.bfloat16).reshape(n, k)


LAYOUT = register(Layout(
    name=NAME, arrays=ARRAYS, pack=pack, unpack=unpack, check_arrays=check_arrays, padded_cols=padded_cols,
    padded_array="sm", about="fixed rate with popcount-ranked escapes, between the two in size",
    reads=(1, 2, 3), writes=3,
    # measured 11.165-11.220 bits a weight on MiniLM, wordllama and Whisper tiny.en
    # (benchmarks/history/2026-12-02-dense-layout-cpu.md), rounded up
    bits=11.25,
    row_bytes=lambda k: blocks_per_row(k) * (2 + 4 / SUPER),  # esc_off, esc_base: 0.25 bits a weight at K = 64
    rows="glyd.ops.rows:rows_dense11",
    device_pack="glyd.kernels.gpu_pack:pack_dense11",
    unpack_kernel="glyd.kernels.dense11.versions:unpack",
    prepare_kernel="glyd.kernels.dense11.versions:prepare",
    kernels={
        "dense11_wgmma": "glyd.kernels.dense11.wgmma:Dense11WgKernel",
        "dense11_v3_gemv": "glyd.kernels.dense11.gemv_v2:Dense11V3GemvKernel",
        "dense11_v2_gemv": "glyd.kernels.dense11.gemv_v2:Dense11V2GemvKernel",
        "dense11_gemv": "glyd.kernels.dense11.gemv:Dense11GemvKernel",
        "dense11_unpack_cublas": "glyd.kernels.dense11.unpack_cublas:Dense11LongKernel",
    },
))
