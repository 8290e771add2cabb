"""Decode selected rows of a packed matrix (the embedding lookup), bit for bit, with torch ops: the
implementation of ``glyd::rows`` on every device.

Every operation here has a fixed output shape that depends only on tensor shapes, never on
values, so it runs on the CPU and the GPU alike with no host synchronization (safe under CUDA
graphs) once a matrix's first lookup has checked its arrays (``glyd.ops._checks``: the ids every
call, the offsets and exception indices read from a file once a matrix). The full-matrix reference
in ``glyd.codec`` stays the source of truth: tests compare these rows against it. Each layout's
entry (``glyd.codec.LAYOUTS``) names its row decode here.
"""

from __future__ import annotations

import torch

from glyd.codec import dense11, dense11_v2, dense11_v3, fixed12, tiered, unpack
from glyd.codec.layout import LAYOUTS, resolve
from glyd.codec.packed import Packed
from glyd.ops._checks import check_arrays_once, check_ids


def unpack_rows(packed: Packed, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` (any shape of int indices) of ``packed`` as bf16, shape ``(*rows.shape, k)``.

    An id outside ``[0, n)`` raises IndexError (a device-side assert on CUDA, as ``nn.Embedding``);
    damaged offsets or exception indices raise CorruptError (checked once a matrix).

    >>> import torch, glyd
    >>> from glyd.ops.rows import unpack_rows
    >>> w = torch.randn(10, 7).to(torch.bfloat16)
    >>> r = unpack_rows(glyd.pack(w, "tiered"), torch.tensor([3, 3, 9]))
    >>> torch.equal(r.view(torch.int16), w[[3, 3, 9]].view(torch.int16))
    True
    """
    check_ids(rows, packed.shape[0])
    check_arrays_once(packed)
    flat = rows.reshape(-1).to(device=packed.device, dtype=torch.int64)
    decode = LAYOUTS[packed.layout].rows
    out = resolve(decode)(packed, flat) if decode is not None else _rows_of_whole(packed, flat)
    return out.reshape(*rows.shape, packed.shape[1])


def _rows_of_whole(p: Packed, rows: torch.Tensor) -> torch.Tensor:
    # A layout with no row decode of its own: the codec's whole matrix, then the rows.
    return unpack(p).to(rows.device)[rows]


def rows_fixed12(p: Packed, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` (int64, 1-D, on the arrays' device) of the fixed12 matrix ``p`` as bf16 (b, k)."""
    n, k = p.shape
    a = p.arrays
    b = rows.numel()
    kp = a["lo"].shape[1]
    cp = a["code"][rows].view(b, kp // fixed12.GROUP, 1, fixed12.HALF)
    codes = torch.cat([cp & 0xF, cp >> 4], dim=2).reshape(b, kp)[:, :k].to(torch.int32)
    base = a["base"].to(torch.int32)  # a tensor, not int(): no host sync
    hi = ((codes & 0x8) << 4) | ((codes & 0x7) + base)
    bits = (hi << 8) | a["lo"][rows, :k].to(torch.int32)
    idx = a["exc_idx"]
    if idx.numel() and b:
        safe = idx.to(torch.int64).clamp(0, n * k - 1)
        value = a["lo"][safe // k, safe % k].to(torch.int32) | (a["exc_hi"].to(torch.int32) << 8)
        bits = _patch(bits, rows, n, k, safe, value)
    return bits.to(torch.int16).view(torch.bfloat16)


def _patch(bits: torch.Tensor, rows: torch.Tensor, n: int, k: int, idx: torch.Tensor,
           value: torch.Tensor) -> torch.Tensor:
    """``bits`` (b, k) of rows ``rows`` with the words at flat indices ``idx`` (inside the matrix) set
    to ``value``, wherever their row was looked up."""
    b = rows.numel()
    # A row asked for twice is patched at one canonical position (the last write of pos[]) and then
    # gathered for all its positions. The indices were checked once a matrix (glyd.ops._checks); the
    # clamp only keeps a read in bounds should a tensor change behind torch's version counter.
    er, ec = idx // k, idx % k
    pos = torch.full((n,), -1, dtype=torch.int64, device=rows.device)
    pos[rows] = torch.arange(b, device=rows.device)
    canon = pos[rows]
    p_of = pos[er]
    dummy = b * k
    target = torch.where(p_of >= 0, p_of * k + ec, torch.full_like(p_of, dummy))
    flat = torch.cat([bits.reshape(-1), bits.new_zeros(1)])
    flat.scatter_(0, target, value.to(flat.dtype))
    return flat[:dummy].view(b, k)[canon]


def rows_dense11(p: Packed, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` (int64, 1-D, on the arrays' device) of the dense11 matrix ``p`` as bf16 (b, k)."""
    # Follows glyd.codec.dense11: a row's escapes are consecutive in the digit stream (blocks and the
    # stream are both row-major), from its first block's offset; ranks are a cumulative sum along it.
    n, k = p.shape
    a = p.arrays
    b = rows.numel()
    kp = a["sm"].shape[1]
    dev = rows.device
    code_rows, sm_col = a["code"][rows], None
    if p.version == 3:  # version 2's arrays permuted inside each block: the rows' words and bytes put back
        code_rows, sm_col = dense11_v3.restore_code(code_rows), dense11_v3.sm_columns(kp, dev)
    words = code_rows.view(b, kp // dense11.WORD, 3)
    if p.version == 1:
        planes = words.to(torch.int64) & 0xFFFFFFFF
        bit = (planes[..., None] >> torch.arange(dense11.WORD, device=dev)) & 1  # (b, W, 3, 32)
        code = (bit[:, :, 0] | (bit[:, :, 1] << 1) | (bit[:, :, 2] << 2)).reshape(b, kp)[:, :k]
    else:  # versions 2, 3: the same stream; ranks 8 and up of a run are digit 15 and in the exception list
        code = dense11_v2.codes_of(words).reshape(b, kp)[:, :k]
    esc = code == dense11.ESCAPE
    blk = (rows * dense11.blocks_per_row(k)).clamp(max=max(a["esc_off"].numel() - 1, 0))
    if a["esc"].numel() and b:
        start = a["esc_base"].to(torch.int64)[blk // dense11.SUPER] + a["esc_off"].to(torch.int32)[blk].to(torch.int64)
        rank = torch.where(esc, start[:, None] + _rank(esc), torch.zeros_like(code)).clamp(0, a["esc"].numel() * 8 - 1)
        digit = (a["esc"].to(torch.int64)[rank >> 3] >> (4 * (rank & 7))) & 15
    else:
        digit = torch.zeros_like(code)
    etab = torch.cat([a["etab"], a["etab"].new_zeros(1)]).to(torch.int64)
    exp = torch.where(esc, etab[digit], code + a["base"].to(torch.int64))
    sm = (a["sm"][rows, :k] if sm_col is None else a["sm"][rows][:, sm_col[:k]]).to(torch.int64)
    bits = ((sm & 0x80) << 8) | (exp << 7) | (sm & 0x7F)
    idx = a["exc_idx"]
    if idx.numel() and b:
        safe = idx.to(torch.int64).clamp(0, n * k - 1)
        sme = a["sm"][safe // k, safe % k if sm_col is None else sm_col[safe % k]].to(torch.int64)
        value = ((sme & 0x80) << 8) | (a["exc_exp"].to(torch.int64) << 7) | (sme & 0x7F)
        bits = _patch(bits, rows, n, k, safe, value)
    return bits.to(torch.int16).view(torch.bfloat16)


def _rank(mask: torch.Tensor) -> torch.Tensor:
    """Position of each set element among the set elements of its block (last dim)."""
    return torch.cumsum(mask.to(torch.int64), dim=-1) - 1


def _gather(area: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Unused slots read byte 0 (clamped index): their values are masked out by the caller.
    safe = torch.where(mask, idx, torch.zeros_like(idx)).clamp_(0, area.numel() - 1)
    return area[safe].to(torch.int64)


def rows_tiered(p: Packed, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` (int64, 1-D, on the arrays' device) of the tiered matrix ``p`` as bf16 (b, k)."""
    # Follows glyd.codec.tiered (GROUP, BLOCK, SUPER, TIERS): escape blocks cover BLOCK consecutive
    # weights of the row-major padded matrix, so a row touches at most kp // BLOCK + 2 of them. Those
    # blocks are decoded whole (escapes ranked by a cumulative sum inside each block), then the
    # row's own weights are gathered out of them.
    n, k = p.shape
    a = p.arrays
    b = rows.numel()
    dev = rows.device
    kp = a["sm"].shape[1]
    blk_w = tiered.BLOCK
    nblocks = tiered.num_blocks(n, k)
    span = kp // blk_w + 2
    sub = tiered.GROUP // 4
    table = a["table"].to(torch.int64)
    first_blk = (rows * kp) // blk_w  # (b,)
    blocks = first_blk[:, None] + torch.arange(span, device=dev)  # (b, span)
    valid_blk = blocks < nblocks
    blocks = torch.where(valid_blk, blocks, torch.zeros_like(blocks))
    flat = blocks[..., None] * blk_w + torch.arange(blk_w, device=dev)  # (b, span, BLOCK)
    in_matrix = valid_blk[..., None] & (flat < n * kp)
    flat = torch.where(in_matrix, flat, torch.zeros_like(flat))
    d1_plane = a["d1"].reshape(-1)
    byte = d1_plane[(flat // tiered.GROUP) * sub + flat % sub].to(torch.int64)
    d1 = (byte >> (2 * ((flat % tiered.GROUP) // sub))) & 3
    d1 = torch.where(in_matrix, d1, torch.zeros_like(d1))  # outside the matrix: digit 0, no escape
    _, cap0 = tiered.TIERS[0]
    rank = d1
    area = a["area"]
    if area.numel():
        base = a["esc_base"].to(torch.int64)
        # int32 first: CUDA has few kernels for uint16 (indexing among the missing ones).
        off = (base[blocks // tiered.SUPER] + a["esc_off"].to(torch.int32)[blocks].to(torch.int64))[..., None]
        esc = d1 == cap0
        used = torch.zeros_like(off)
        first = cap0
        for width, cap in tiered.TIERS[1:]:
            per_byte = 8 // width
            r = _rank(esc)
            digit = (_gather(area, off + used + r // per_byte, esc) >> (width * (r % per_byte))) & ((1 << width) - 1)
            used = used + (esc.sum(-1, keepdim=True) + per_byte - 1) // per_byte
            rank = torch.where(esc, first + digit, rank)
            esc = esc & (digit == (1 << width) - 1)
            first += cap
        raw = _gather(area, off + used + _rank(esc), esc)
        exp = torch.where(esc, raw, table[rank.clamp(max=tiered.TABLE - 1)])
    else:
        exp = table[rank.clamp(max=cap0 - 1)]
    # Row r's column c is flat r*kp + c: block (flat // BLOCK) - first_blk, slot flat % BLOCK.
    cols = torch.arange(k, device=dev)
    f = rows[:, None] * kp + cols  # (b, k)
    idx = ((f // blk_w) - first_blk[:, None]) * blk_w + f % blk_w
    exp = torch.gather(exp.reshape(b, span * blk_w), 1, idx).to(torch.int32)
    sm = a["sm"][rows, :k].to(torch.int32)
    bits = ((sm & 0x80) << 8) | (exp << 7) | (sm & 0x7F)
    return bits.to(torch.int16).view(torch.bfloat16)
