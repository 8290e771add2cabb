"""``tiered``: the densest layout that still multiplies on the GPU (about 10.7-10.9 bits a weight).

Sign and mantissa are kept raw in one byte a weight (``sm = sign<<7 | mantissa``). The exponent
is coded by its rank in the matrix's exponent frequency order, in tiers; a digit's all-ones value
escapes to the next tier:

====  =====  ==========================================  ==========================
tier  width  values                                      where
====  =====  ==========================================  ==========================
1     2 bit  0-2: ranks 0-2, 3: escape                   ``d1`` plane, every weight
2     1 bit  0: rank 3, 1: escape                        block area
3     1 bit  0: rank 4, 1: escape                        block area
4     2 bit  0-2: ranks 5-7, 3: escape                   block area
5     4 bit  0-14: ranks 8-22, 15: escape                block area
raw   8 bit  the exponent itself                         block area
====  =====  ==========================================  ==========================

The widths follow measured exponent histograms of real weights (the 3 most common exponents cover
about 70-73%, the next two about 10% and 7%): against a 2/2/4 split they save 0.06-0.1 bits a
weight. Tiers 2 to raw live in a per-block area (a block = 1024 consecutive weights of the padded
matrix in row-major order, so short rows share a block) whose start is in an offset table, so any
block decodes on its own: no sequential bit stream. Byte-level layout: ``docs/format.md``.
"""

from __future__ import annotations

import numpy as np
import torch

from glyd.codec.layout import Layout, register
from glyd.codec.packed import Packed, as_bf16_matrix, check_no_extra, expect_array, round_up
from glyd.errors import CorruptError, FormatError

NAME = "tiered"
#: K is padded to a multiple of GROUP; byte j of a group's 16 ``d1`` bytes holds weights j, j+16, j+32, j+48.
GROUP = 64
SUB = GROUP // 4
#: Weights a block of the escape area covers.
BLOCK = 1024
#: Blocks a superblock groups: one 32-bit base a superblock, then a 16-bit offset a block
#: (16/1024 + 32/16384 = 0.018 bits a weight, against 0.031 for a 32-bit offset a block).
#: A block's area is at most 1024 * (1/8 + 1/8 + 1/4 + 1/2 + 1) = 2048 bytes, a superblock's
#: 32768: the 16-bit offsets never overflow.
SUPER = 16
#: (digit width in bits, ranks the tier covers) for tiers 1 to 4; past the last tier, the raw exponent.
TIERS = ((2, 3), (1, 1), (1, 1), (2, 3), (4, 15))
TABLE = sum(cap for _, cap in TIERS)
ARRAYS = ("sm", "d1", "table", "esc_base", "esc_off", "area")


def padded_cols(k: int) -> int:
    return round_up(k, GROUP)


def num_blocks(n: int, k: int) -> int:
    return (n * padded_cols(k) + BLOCK - 1) // BLOCK


def exponent_order(exp: np.ndarray) -> np.ndarray:
    """Exponent values by descending count (ties: lower value first), as int64[256]."""
    hist = torch.bincount(torch.from_numpy(exp.reshape(-1)), minlength=256).numpy()
    # A stable sort on -count keeps ties in ascending exponent order: deterministic tables.
    return np.argsort(-hist, kind="stable")


def _rank_in_block(block: np.ndarray, nblocks: int) -> np.ndarray:
    """For a sorted 1-D array of block ids, each element's position among its block's elements."""
    if block.size == 0:
        return block
    counts = np.bincount(block, minlength=nblocks)
    starts = np.cumsum(counts) - counts
    return np.arange(block.size, dtype=np.int64) - starts[block]


def _block_ids(flat: np.ndarray) -> np.ndarray:
    return flat // BLOCK


def pack(w: torch.Tensor) -> Packed:
    # numpy on uint8 planes: several times faster than torch's CPU kernels for these byte ops.
    w = as_bf16_matrix(w)
    n, k = w.shape
    kp = padded_cols(k)
    nblocks = num_blocks(n, k)
    b = w.view(torch.uint8).numpy().reshape(n, k, 2)  # little-endian: [..., 0] = lo, [..., 1] = hi
    lo, hi = b[..., 0], b[..., 1]
    exp = ((hi & np.uint8(0x7F)) << 1) | (lo >> 7)
    order = exponent_order(exp)
    rank_of = np.empty(256, dtype=np.uint8)
    rank_of[order] = np.arange(256)

    sm = np.zeros((n, kp), dtype=np.uint8)
    sm[:, :k] = (hi & np.uint8(0x80)) | (lo & np.uint8(0x7F))
    rank = np.zeros((n, kp), dtype=np.uint8)  # padding: rank 0, digit 0, never escapes
    rank[:, :k] = rank_of[exp]
    cap0 = TIERS[0][1]
    q = np.minimum(rank, cap0).reshape(n, kp // GROUP, 4, SUB)
    d1_plane = (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(n, kp // 4)

    # Escapes of each tier in natural (row-major) order, with their block ids.
    flat = np.flatnonzero(rank >= cap0)
    r = rank.reshape(-1)[flat].astype(np.int64)
    blk = _block_ids(flat)
    first = cap0
    streams = []  # tiers 2..4: (block ids, digit values, width)
    for width, cap in TIERS[1:]:
        streams.append((blk, np.minimum(r - first, (1 << width) - 1), width))
        keep = r >= first + cap
        first += cap
        blk, r = blk[keep], r[keep]
    raw_blk, raw_val = blk, order[r]

    sizes = []
    for bl, _, width in streams:
        per_byte = 8 // width
        sizes.append((np.bincount(bl, minlength=nblocks) + per_byte - 1) // per_byte)
    sizes.append(np.bincount(raw_blk, minlength=nblocks))
    off = np.zeros(nblocks + 1, dtype=np.int64)
    np.cumsum(np.sum(sizes, axis=0), out=off[1:])
    total = int(off[-1])
    area = np.zeros(total, dtype=np.uint8)
    start = off[:-1].copy()
    for (bl, digit, width), size in zip(streams, sizes):
        per_byte = 8 // width
        rk = _rank_in_block(bl, nblocks)
        # Digits of one byte come from distinct escapes, so summing their disjoint bit fields ORs them
        # (bincount's float64 sums of values < 256 are exact, and far faster than np.add.at).
        pos = start[bl] + rk // per_byte
        area += np.bincount(pos, weights=digit << (width * (rk % per_byte)), minlength=total).astype(np.uint8)
        start += size
    area[start[raw_blk] + _rank_in_block(raw_blk, nblocks)] = raw_val

    base = np.concatenate([off[:-1][::SUPER], off[-1:]])  # superblock starts, then the total
    rel = off[:-1] - base[np.arange(nblocks) // SUPER]
    arrays = {
        "sm": torch.from_numpy(sm),
        "d1": torch.from_numpy(np.ascontiguousarray(d1_plane)),
        "table": torch.from_numpy(order[:TABLE].astype(np.uint8)),
        "esc_base": torch.from_numpy(base.astype(np.int32 if total < 2**31 else np.int64)),
        "esc_off": torch.from_numpy(rel.astype(np.int64)).to(torch.uint16),
        "area": torch.from_numpy(area),
    }
    return Packed(NAME, (n, k), arrays)


def check_arrays(shape: tuple[int, int], arrays: dict[str, torch.Tensor]) -> None:
    n, k = shape
    kp = padded_cols(k)
    nblocks = num_blocks(n, k)
    check_no_extra(arrays, ARRAYS, NAME)
    expect_array(arrays, "sm", torch.uint8, (n, kp))
    expect_array(arrays, "d1", torch.uint8, (n, kp // 4))
    expect_array(arrays, "table", torch.uint8, (TABLE,))
    expect_array(arrays, "esc_base", (torch.int32, torch.int64), ((nblocks + SUPER - 1) // SUPER + 1,))
    expect_array(arrays, "esc_off", torch.uint16, (nblocks,))
    area = expect_array(arrays, "area", torch.uint8, None)
    if area.dim() != 1:
        raise FormatError(f"packed array 'area' must be 1-D, got shape {tuple(area.shape)}")
    most = sum(BLOCK // (8 // w) for w, _ in TIERS[1:]) + BLOCK
    if area.numel() > nblocks * most:
        raise FormatError(f"packed array 'area' ({area.numel()} bytes) is larger than any {n}x{k} matrix needs")


def check_padding(p: Packed) -> None:
    """CorruptError unless the padding columns ``K .. Kp - 1`` hold digit 0 and ``sm`` 0 (torch on the
    arrays' device). The codec drops them, but the fused GEMV multiplies them by x's zeros: a digit
    whose exponent is 255 (an unused table entry, any rank) decodes to inf, and 0 * inf is NaN."""
    n, k = p.shape
    sm, d1 = p.arrays["sm"], p.arrays["d1"]
    kp = sm.shape[1]
    if n == 0 or k == kp:
        return
    last = d1[:, kp // 4 - SUB :]  # the last group's d1 bytes (Kp - K < 64)
    digits = torch.cat([(last >> (2 * i)) & 3 for i in range(4)], dim=1)  # its 64 digits in column order
    if bool(digits[:, k - kp + GROUP :].any() | sm[:, k:].any()):
        raise CorruptError(f"tiered padding columns {k}..{kp - 1} must hold digit 0 and sm 0 (a damaged or crafted "
                           f"'d1' or 'sm')")


def unpack(p: Packed) -> torch.Tensor:
    check_padding(p)
    n, k = p.shape
    a = p.arrays
    kp = a["sm"].shape[1]
    nblocks = num_blocks(n, k)
    area = a["area"].numpy()
    table = a["table"].numpy()
    base = a["esc_base"].numpy().astype(np.int64)
    off = np.concatenate([base[np.arange(nblocks) // SUPER] + a["esc_off"].to(torch.int64).numpy(), base[-1:]])
    if int(base[0]) != 0 or int(base[-1]) != area.size or bool((off[1:] < off[:-1]).any()):
        raise CorruptError("tiered 'esc_base'/'esc_off' are not an increasing table of offsets into 'area'")
    room = off[1:] - off[:-1]

    q = a["d1"].numpy().reshape(n, kp // GROUP, 1, SUB)
    rank = np.concatenate([q & 3, (q >> 2) & 3, (q >> 4) & 3, q >> 6], axis=2).reshape(-1)
    cap0 = TIERS[0][1]
    esc = np.flatnonzero(rank == cap0)  # flat indices still unresolved
    blk = _block_ids(esc)
    used = np.zeros(nblocks, dtype=np.int64)
    first = cap0
    for width, cap in TIERS[1:]:
        per_byte = 8 // width
        size = (np.bincount(blk, minlength=nblocks) + per_byte - 1) // per_byte
        if bool((used + size > room).any()):
            raise CorruptError("tiered escape area is smaller than its escape digits need (corrupt 'esc_off' or 'area')")
        rk = _rank_in_block(blk, nblocks)
        digit = (area[(off[:-1] + used)[blk] + rk // per_byte] >> (width * (rk % per_byte)).astype(np.uint8)) & np.uint8(
            (1 << width) - 1
        )
        used += size
        rank[esc] = first + digit
        more = digit == (1 << width) - 1
        esc, blk = esc[more], blk[more]
        first += cap
    if not np.array_equal(used + np.bincount(blk, minlength=nblocks), room):
        raise CorruptError("tiered escape area sizes do not match its escape digits (corrupt 'esc_off' or 'area')")
    lut = np.zeros(256, dtype=np.uint8)
    lut[:TABLE] = table
    exp = lut[rank]
    if esc.size:
        exp[esc] = area[(off[:-1] + used)[blk] + _rank_in_block(blk, nblocks)]

    sm = a["sm"].numpy().reshape(-1)
    out = np.empty((n * kp, 2), dtype=np.uint8)
    out[:, 0] = ((exp & np.uint8(1)) << 7) | (sm & np.uint8(0x7F))
    out[:, 1] = (sm & np.uint8(0x80)) | (exp >> 1)
    bits = torch.from_numpy(out.reshape(n, kp, 2)[:, :k].copy() if kp != k else out.reshape(n, kp, 2))
    return bits.view(torch.bfloat16).reshape(n, k)


LAYOUT = register(Layout(
    name=NAME, arrays=ARRAYS, pack=pack, unpack=unpack, check_arrays=check_arrays, padded_cols=padded_cols,
    padded_array="sm", about="the densest layout that multiplies on the GPU (slower kernels)",
    # the codec's measured 10.81 bits a weight on MiniLM + wordllama (benchmarks/RESULTS.md), rounded up
    bits=10.85,
    rows="glyd.ops.rows:rows_tiered",
    device_pack="glyd.kernels.gpu_pack:pack_tiered",
    unpack_kernel="glyd.kernels.tiered.unpack:unpack",
    prepare_kernel="glyd.kernels.tiered.unpack:check",
    kernels={
        "tiered_gemv": "glyd.kernels.tiered.gemv:TieredGemvKernel",
        "tiered_unpack_cublas": "glyd.kernels.tiered.unpack_cublas:TieredLongKernel",
    },
))
