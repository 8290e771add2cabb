"""``tiered``: the densest layout that still multiplies on the GPU (about 10.6-10.9 bits a weight).

Sign and mantissa are kept raw in one byte a weight (``sm = sign<<7 | mantissa``). The exponent
is coded by its rank in the matrix's exponent frequency order, in tiers; a digit's all-ones value
escapes to the next tier:

====  =====  ==========================================  ==========================
tier  width  values                                      where
====  =====  ==========================================  ==========================
1     2 bit  0-2: ranks 0-2, 3: escape                   ``d1`` plane, every weight
2     1 bit  0: rank 3, 1: escape                        block area
3     2 bit  0-2: ranks 4-6, 3: escape                   block area
4     4 bit  0-14: ranks 7-21, 15: escape                block area
raw   8 bit  the exponent itself                         block area
====  =====  ==========================================  ==========================

The widths follow the measured exponent histograms of real weights (the 3 most common exponents
cover about 70-73%, the 4th about 10%): against a 2/2/4 split this saves 0.05-0.09 bits a weight.
Tiers 2 to raw live in a per-block area (a block = 512 consecutive weights of one row; the last
block of a row may be shorter) whose start is in an offset table, so any block decodes on its own:
no sequential bit stream. Byte-level layout: ``docs/format.md``.
"""

from __future__ import annotations

import torch

from glyd.codec.packed import Packed, as_bf16_matrix, check_no_extra, expect_array, round_up, u16_to_bf16
from glyd.errors import CorruptError, FormatError

NAME = "tiered"
#: K is padded to a multiple of GROUP; byte j of a group's 16 ``d1`` bytes holds weights j, j+16, j+32, j+48.
GROUP = 64
SUB = GROUP // 4
#: Weights a block of the escape area covers.
BLOCK = 512
#: Blocks a superblock groups: one 32-bit base a superblock, then a 16-bit offset a block
#: (16/512 + 32/8192 = 0.035 bits a weight, against 0.0625 for a 32-bit offset a block).
#: A superblock's area is at most 16 * 960 bytes, so the 16-bit offsets never overflow.
SUPER = 16
#: (digit width in bits, ranks the tier covers) for tiers 1 to 4; past the last tier, the raw exponent.
TIERS = ((2, 3), (1, 1), (2, 3), (4, 15))
TABLE = sum(cap for _, cap in TIERS)
ARRAYS = ("sm", "d1", "table", "esc_base", "esc_off", "area")


def padded_cols(k: int) -> int:
    return round_up(k, GROUP)


def blocks_per_row(k: int) -> int:
    return (padded_cols(k) + BLOCK - 1) // BLOCK


def exponent_order(exp: torch.Tensor) -> torch.Tensor:
    """Exponent values by descending count (ties: lower value first), as int64[256]."""
    hist = torch.bincount(exp.reshape(-1).to(torch.int64), minlength=256)
    # A stable sort on -count keeps ties in ascending exponent order: deterministic tables.
    return torch.sort(-hist, stable=True).indices


def _rank_in_block(block: torch.Tensor, nblocks: int) -> torch.Tensor:
    """For a sorted 1-D tensor of block ids, each element's position among its block's elements."""
    if block.numel() == 0:
        return block
    counts = torch.bincount(block, minlength=nblocks)
    starts = torch.cumsum(counts, 0) - counts
    return torch.arange(block.numel(), dtype=torch.int64) - starts[block]


def _block_ids(n: int, kp: int, flat: torch.Tensor) -> torch.Tensor:
    nb = (kp + BLOCK - 1) // BLOCK
    return (flat // kp) * nb + (flat % kp) // BLOCK


def pack(w: torch.Tensor) -> Packed:
    w = as_bf16_matrix(w)
    n, k = w.shape
    kp = padded_cols(k)
    nb = blocks_per_row(k)
    nblocks = n * nb
    bits = w.view(torch.int16).to(torch.int32) & 0xFFFF
    exp = (bits >> 7) & 0xFF
    order = exponent_order(exp)
    rank_of = torch.empty(256, dtype=torch.int64)
    rank_of[order] = torch.arange(256)

    sm = torch.zeros(n, kp, dtype=torch.uint8)
    sm[:, :k] = (((bits >> 8) & 0x80) | (bits & 0x7F)).to(torch.uint8)
    rank = torch.zeros(n, kp, dtype=torch.int64)  # padding: rank 0, digit 0, never escapes
    rank[:, :k] = rank_of[exp.to(torch.int64)]
    width0, cap0 = TIERS[0]
    d1 = rank.clamp(max=cap0).to(torch.uint8)
    q = d1.view(n, kp // GROUP, 4, SUB)
    d1_plane = (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(n, kp // 4)

    # Escapes of each tier in natural (row-major) order, with their block ids.
    flat = torch.nonzero(rank.reshape(-1) >= cap0).reshape(-1)
    r = rank.reshape(-1)[flat]
    blk = _block_ids(n, kp, flat)
    first = cap0
    streams = []  # per tier 2..4: (block ids, digit values, width)
    for width, cap in TIERS[1:]:
        digit = (r - first).clamp(max=(1 << width) - 1)
        streams.append((blk, digit, width))
        keep = r >= first + cap
        first += cap
        blk, r = blk[keep], r[keep]
    raw_blk, raw_val = blk, order[r]

    sizes = []
    for b, _, width in streams:
        per_byte = 8 // width
        sizes.append((torch.bincount(b, minlength=nblocks) + per_byte - 1) // per_byte)
    sizes.append(torch.bincount(raw_blk, minlength=nblocks))
    off = torch.zeros(nblocks + 1, dtype=torch.int64)
    torch.cumsum(torch.stack(sizes).sum(0), 0, out=off[1:])
    total = int(off[-1])
    area = torch.zeros(total, dtype=torch.int32)
    start = off[:-1].clone()
    for (b, digit, width), size in zip(streams, sizes):
        per_byte = 8 // width
        rk = _rank_in_block(b, nblocks)
        area.index_add_(0, start[b] + rk // per_byte, (digit << (width * (rk % per_byte))).to(torch.int32))
        start += size
    if raw_blk.numel():
        area.index_add_(0, start[raw_blk] + _rank_in_block(raw_blk, nblocks), raw_val.to(torch.int32))

    base = torch.cat([off[:-1][::SUPER], off[-1:]])  # superblock starts, then the total
    rel = off[:-1] - base[torch.arange(nblocks) // SUPER]
    arrays = {
        "sm": sm,
        "d1": d1_plane.contiguous(),
        "table": order[:TABLE].to(torch.uint8),
        "esc_base": base.to(torch.int32 if total < 2**31 else torch.int64),
        "esc_off": rel.to(torch.uint16),
        "area": area.to(torch.uint8),
    }
    return Packed(NAME, (n, k), arrays)


def check_arrays(shape: tuple[int, int], arrays: dict[str, torch.Tensor]) -> None:
    n, k = shape
    kp = padded_cols(k)
    nblocks = n * blocks_per_row(k)
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


def unpack(p: Packed) -> torch.Tensor:
    n, k = p.shape
    a = p.arrays
    kp = a["sm"].shape[1]
    nblocks = n * blocks_per_row(k)
    area = a["area"]
    table = a["table"].to(torch.int64)
    base = a["esc_base"].to(torch.int64)
    off = torch.cat([base[torch.arange(nblocks) // SUPER] + a["esc_off"].to(torch.int64), base[-1:]])
    if int(base[0]) != 0 or int(base[-1]) != area.numel() or bool((off[1:] < off[:-1]).any()):
        raise CorruptError("tiered 'esc_base'/'esc_off' are not an increasing table of offsets into 'area'")
    room = off[1:] - off[:-1]

    q = a["d1"].view(n, kp // GROUP, 1, SUB).to(torch.int64)
    d1 = torch.cat([q & 3, (q >> 2) & 3, (q >> 4) & 3, q >> 6], dim=2).reshape(-1)
    width0, cap0 = TIERS[0]
    rank = d1.clone()
    esc = torch.nonzero(d1 == cap0).reshape(-1)  # flat indices still unresolved
    blk = _block_ids(n, kp, esc)
    used = torch.zeros(nblocks, dtype=torch.int64)
    first = cap0
    for width, cap in TIERS[1:]:
        per_byte = 8 // width
        size = (torch.bincount(blk, minlength=nblocks) + per_byte - 1) // per_byte
        if bool((used + size > room).any()):
            raise CorruptError("tiered escape area is smaller than its escape digits need (corrupt 'esc_off' or 'area')")
        rk = _rank_in_block(blk, nblocks)
        digit = (area[(off[:-1] + used)[blk] + rk // per_byte].to(torch.int64) >> (width * (rk % per_byte))) & (
            (1 << width) - 1
        )
        used += size
        rank[esc] = first + digit
        more = digit == (1 << width) - 1
        esc, blk = esc[more], blk[more]
        first += cap
    if not torch.equal(used + torch.bincount(blk, minlength=nblocks), room):
        raise CorruptError("tiered escape area sizes do not match its escape digits (corrupt 'esc_off' or 'area')")
    exp = table[rank.clamp(max=TABLE - 1)]
    if esc.numel():
        exp[esc] = area[(off[:-1] + used)[blk] + _rank_in_block(blk, nblocks)].to(torch.int64)

    sm = a["sm"].reshape(-1).to(torch.int32)
    bits = ((sm & 0x80) << 8) | (exp.to(torch.int32) << 7) | (sm & 0x7F)
    return u16_to_bf16(bits.view(n, kp)[:, :k])
