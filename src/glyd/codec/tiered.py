"""``tiered``: the densest layout that still multiplies on the GPU (about 10.5-10.8 bits a weight).

Sign and mantissa are kept raw in one byte a weight (``sm = sign<<7 | mantissa``). The exponent
is coded in tiers by its rank in the matrix's exponent frequency order:

* tier 1, every weight: a 2-bit digit, 0-2 = the 3 most common exponents, 3 = escape;
* tier 2, escaped weights: a 2-bit digit, 0-2 = the next 3 exponents, 3 = escape;
* tier 3: a 4-bit digit, 0-14 = the next 15 exponents, 15 = escape;
* tier 4: the raw exponent byte.

Tiers 2-4 live in a per-block area (a block = 256 consecutive weights of one row) whose start is
in an offset table, so any block decodes on its own: no sequential bit stream. Byte-level layout:
``docs/format.md``.
"""

from __future__ import annotations

import torch

from glyd.codec.packed import Packed, as_bf16_matrix, check_no_extra, expect_array, round_up, u16_to_bf16
from glyd.errors import CorruptError, FormatError

NAME = "tiered"
BLOCK = 256
QUARTER = BLOCK // 4
T1, T2, T3 = 3, 3, 15
TABLE = T1 + T2 + T3
ARRAYS = ("sm", "d1", "table", "esc_off", "area")


def padded_cols(k: int) -> int:
    return round_up(k, BLOCK)


def exponent_order(exp: torch.Tensor) -> torch.Tensor:
    """Exponent values by descending count (ties: lower value first), as int64[256]."""
    hist = torch.bincount(exp.reshape(-1).to(torch.int64), minlength=256)
    # Stable sort on -count keeps ascending exponent order among ties: deterministic tables.
    return torch.sort(-hist, stable=True).indices


def _rank_in_block(block: torch.Tensor, nblocks: int) -> torch.Tensor:
    """For a sorted 1-D tensor of block ids, each element's position among its block's elements."""
    if block.numel() == 0:
        return block
    counts = torch.bincount(block, minlength=nblocks)
    starts = torch.cumsum(counts, 0) - counts
    return torch.arange(block.numel(), dtype=torch.int64) - starts[block]


def _scatter_bits(area: torch.Tensor, pos: torch.Tensor, values: torch.Tensor, per_byte: int, width: int,
                  rank: torch.Tensor) -> None:
    area.index_add_(0, pos + rank // per_byte, values.to(torch.int32) << (width * (rank % per_byte)).to(torch.int32))


def pack(w: torch.Tensor) -> Packed:
    w = as_bf16_matrix(w)
    n, k = w.shape
    kp = padded_cols(k)
    nb = kp // BLOCK
    bits = w.view(torch.int16).to(torch.int32) & 0xFFFF
    exp = (bits >> 7) & 0xFF
    order = exponent_order(exp)
    rank_of = torch.empty(256, dtype=torch.int64)
    rank_of[order] = torch.arange(256)

    sm = torch.zeros(n, kp, dtype=torch.uint8)
    sm[:, :k] = (((bits >> 8) & 0x80) | (bits & 0x7F)).to(torch.uint8)
    rank = torch.zeros(n, kp, dtype=torch.int64)  # padding: rank 0, digit 0, no escape
    rank[:, :k] = rank_of[exp.to(torch.int64)]
    d1 = rank.clamp(max=T1).to(torch.uint8)
    q = d1.view(n, nb, 4, QUARTER)  # byte j of a block holds weights j, j+64, j+128, j+192
    d1_plane = (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(n, kp // 4)

    # Escapes in natural order (row-major over the padded matrix): flat // BLOCK is the block id.
    flat_rank = rank.reshape(-1)
    e1 = torch.nonzero(flat_rank >= T1).reshape(-1)
    r1 = flat_rank[e1]
    e2_mask = r1 >= T1 + T2
    r2 = r1[e2_mask]
    e3_mask = r2 >= T1 + T2 + T3
    b1 = e1 // BLOCK
    b2 = b1[e2_mask]
    b3 = b2[e3_mask]
    nblocks = n * nb
    c1 = torch.bincount(b1, minlength=nblocks)
    c2 = torch.bincount(b2, minlength=nblocks)
    c3 = torch.bincount(b3, minlength=nblocks)
    s1 = (c1 + 3) // 4
    s2 = (c2 + 1) // 2
    size = s1 + s2 + c3
    off = torch.zeros(nblocks + 1, dtype=torch.int64)
    torch.cumsum(size, 0, out=off[1:])
    total = int(off[-1])
    area = torch.zeros(total, dtype=torch.int32)
    _scatter_bits(area, off[b1], (r1 - T1).clamp(max=T2), 4, 2, _rank_in_block(b1, nblocks))
    _scatter_bits(area, off[b2] + s1[b2], (r2 - T1 - T2).clamp(max=T3), 2, 4, _rank_in_block(b2, nblocks))
    if b3.numel():
        area.index_add_(0, off[b3] + s1[b3] + s2[b3] + _rank_in_block(b3, nblocks), order[r2[e3_mask]].to(torch.int32))

    off_dtype = torch.int32 if total < 2**31 else torch.int64
    arrays = {
        "sm": sm,
        "d1": d1_plane.contiguous(),
        "table": order[:TABLE].to(torch.uint8),
        "esc_off": off.to(off_dtype),
        "area": area.to(torch.uint8),
    }
    return Packed(NAME, (n, k), arrays)


def check_arrays(shape: tuple[int, int], arrays: dict[str, torch.Tensor]) -> None:
    n, k = shape
    kp = padded_cols(k)
    check_no_extra(arrays, ARRAYS, NAME)
    expect_array(arrays, "sm", torch.uint8, (n, kp))
    expect_array(arrays, "d1", torch.uint8, (n, kp // 4))
    expect_array(arrays, "table", torch.uint8, (TABLE,))
    expect_array(arrays, "esc_off", (torch.int32, torch.int64), (n * (kp // BLOCK) + 1,))
    area = expect_array(arrays, "area", torch.uint8, None)
    if area.dim() != 1:
        raise FormatError(f"packed array 'area' must be 1-D, got shape {tuple(area.shape)}")
    # Each block's area holds at most 256 2-bit + 256 4-bit digits + 256 raw bytes.
    if area.numel() > n * (kp // BLOCK) * (BLOCK // 4 + BLOCK // 2 + BLOCK):
        raise FormatError(f"packed array 'area' is larger than any {n}x{k} matrix needs")


def _read_digits(area: torch.Tensor, pos: torch.Tensor, rank: torch.Tensor, per_byte: int, width: int) -> torch.Tensor:
    byte = area[pos + rank // per_byte].to(torch.int64)
    return (byte >> (width * (rank % per_byte))) & ((1 << width) - 1)


def unpack(p: Packed) -> torch.Tensor:
    n, k = p.shape
    a = p.arrays
    kp = a["sm"].shape[1]
    nb = kp // BLOCK
    nblocks = n * nb
    off = a["esc_off"].to(torch.int64)
    area = a["area"]
    table = a["table"].to(torch.int64)

    q = a["d1"].view(n, nb, 1, QUARTER).to(torch.int64)
    d1 = torch.cat([q & 3, (q >> 2) & 3, (q >> 4) & 3, q >> 6], dim=2).reshape(-1)
    e1 = torch.nonzero(d1 == 3).reshape(-1)
    b1 = e1 // BLOCK
    c1 = torch.bincount(b1, minlength=nblocks)
    s1 = (c1 + 3) // 4
    if off[0] != 0 or off[-1] != area.numel() or bool((off[1:] < off[:-1]).any()):
        raise CorruptError("tiered esc_off is not an increasing table of offsets into 'area'")
    if bool((off[1:] - off[:-1] < s1).any()):
        raise CorruptError("tiered escape area is smaller than the escape digits need")
    d2 = _read_digits(area, off[b1], _rank_in_block(b1, nblocks), 4, 2)
    m2 = d2 == 3
    b2 = b1[m2]
    c2 = torch.bincount(b2, minlength=nblocks)
    s2 = (c2 + 1) // 2
    if bool((off[1:] - off[:-1] < s1 + s2).any()):
        raise CorruptError("tiered escape area is smaller than the escape digits need")
    d3 = _read_digits(area, off[b2] + s1[b2], _rank_in_block(b2, nblocks), 2, 4)
    m3 = d3 == 15
    b3 = b2[m3]
    c3 = torch.bincount(b3, minlength=nblocks)
    if not torch.equal(off[1:] - off[:-1], s1 + s2 + c3):
        raise CorruptError("tiered escape area sizes do not match the escape digits (corrupt 'esc_off' or 'area')")

    exp = table[d1.clamp(max=T1 - 1)]  # clamp: escaped slots are overwritten below
    exp2 = table[(T1 + d2).clamp(max=T1 + T2 - 1)]
    exp3 = table[(T1 + T2 + d3).clamp(max=TABLE - 1)]
    if b3.numel():
        exp3[m3] = area[off[b3] + s1[b3] + s2[b3] + _rank_in_block(b3, nblocks)].to(torch.int64)
    exp2[m2] = exp3
    exp[e1] = exp2

    sm = a["sm"].reshape(-1).to(torch.int32)
    bits = ((sm & 0x80) << 8) | (exp.to(torch.int32) << 7) | (sm & 0x7F)
    return u16_to_bf16(bits.view(n, kp)[:, :k])
