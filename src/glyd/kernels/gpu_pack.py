"""Packing with torch ops on any device (the GPU pack): bit-identical to ``glyd.codec``.

The CPU codec moves its input to the CPU; these functions keep every step on the tensor's own
device, so a CUDA matrix packs on the GPU (``glyd.pack`` calls them through each layout's
``device_pack``). They are plain torch (no Triton) and the tests compare their arrays byte for byte
with the CPU codec's on the CPU and on the GPU.

>>> import torch
>>> from glyd.kernels.gpu_pack import pack_tiered
>>> pack_tiered(torch.ones(2, 3, dtype=torch.bfloat16)).shape
(2, 3)
"""

from __future__ import annotations

import torch

from glyd.codec import fixed12 as _f12
from glyd.codec import tiered as _tr
from glyd.codec.packed import Packed


def _check(w: torch.Tensor) -> torch.Tensor:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"matrix must be a torch.Tensor, got {type(w).__name__}")
    if w.dtype != torch.bfloat16:
        raise TypeError(f"matrix must be bfloat16, got {w.dtype} (glyd packs bf16 weights only; convert explicitly)")
    if w.dim() != 2:
        raise ValueError(f"matrix must be 2-D, got shape {tuple(w.shape)}")
    return w.detach().contiguous()


def pack_fixed12(w: torch.Tensor) -> Packed:
    """``fixed12`` arrays of ``w`` computed on ``w.device``; equal to ``glyd.codec.pack(w, "fixed12")``."""
    w = _check(w)
    dev = w.device
    n, k = w.shape
    kp = _f12.padded_cols(k)
    bits = w.view(torch.int16)
    hi = (bits >> 8).to(torch.int32) & 0xFF  # int16 >> is arithmetic: mask back to the byte
    hi7 = hi & 0x7F
    if hi7.numel():
        hist = torch.bincount(hi7.reshape(-1), minlength=128)
        base = int(torch.argmax(hist.unfold(0, _f12.WINDOW, 1).sum(dim=1)))  # first maximum, as the codec
    else:
        base = 0
    off = hi7 - base
    inside = (off >= 0) & (off < _f12.WINDOW)
    code = ((hi >> 4) & 0x8) | torch.where(inside, off, torch.zeros_like(off))

    lo_plane = torch.zeros(n, kp, dtype=torch.uint8, device=dev)
    lo_plane[:, :k] = (bits & 0xFF).to(torch.uint8)
    codes = torch.zeros(n, kp, dtype=torch.uint8, device=dev)
    codes[:, :k] = code.to(torch.uint8)
    g = codes.view(n, kp // _f12.GROUP, 2, _f12.HALF)
    code_plane = (g[:, :, 0, :] | (g[:, :, 1, :] << 4)).reshape(n, kp // 2)

    exc = torch.nonzero(~inside.reshape(-1)).reshape(-1)
    idx_dtype = torch.int32 if n * k < 2**31 else torch.int64
    arrays = {
        "lo": lo_plane,
        "code": code_plane.contiguous(),
        "base": torch.tensor([base], dtype=torch.uint8, device=dev),
        "exc_idx": exc.to(idx_dtype),
        "exc_hi": hi.reshape(-1)[exc].to(torch.uint8),
    }
    return Packed(_f12.NAME, (n, k), arrays)


def _rank_in_block(block: torch.Tensor, nblocks: int) -> torch.Tensor:
    """For a sorted 1-D tensor of block ids, each element's position among its block's elements."""
    if block.numel() == 0:
        return block
    counts = torch.bincount(block, minlength=nblocks)
    starts = torch.cumsum(counts, 0) - counts
    return torch.arange(block.numel(), dtype=torch.int64, device=block.device) - starts[block]


def pack_tiered(w: torch.Tensor) -> Packed:
    """``tiered`` arrays of ``w`` computed on ``w.device``; equal to ``glyd.codec.pack(w, "tiered")``."""
    w = _check(w)
    dev = w.device
    n, k = w.shape
    kp = _tr.padded_cols(k)
    nblocks = _tr.num_blocks(n, k)
    bits = w.view(torch.int16).to(torch.int32) & 0xFFFF
    exp = (bits >> 7) & 0xFF
    hist = torch.bincount(exp.reshape(-1), minlength=256)
    order = torch.sort(-hist, stable=True).indices  # ties: ascending exponent, as the codec
    rank_of = torch.empty(256, dtype=torch.uint8, device=dev)
    rank_of[order] = torch.arange(256, device=dev).to(torch.uint8)

    sm = torch.zeros(n, kp, dtype=torch.uint8, device=dev)
    sm[:, :k] = (((bits >> 8) & 0x80) | (bits & 0x7F)).to(torch.uint8)
    rank = torch.zeros(n, kp, dtype=torch.uint8, device=dev)  # padding: rank 0, never escapes
    rank[:, :k] = rank_of[exp.to(torch.int64)]
    del bits, exp
    cap0 = _tr.TIERS[0][1]
    q = rank.clamp(max=cap0).view(n, kp // _tr.GROUP, 4, _tr.SUB)
    d1_plane = (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(n, kp // 4)
    del q

    flat = torch.nonzero(rank.reshape(-1) >= cap0).reshape(-1)
    r = rank.reshape(-1)[flat].to(torch.int64)
    del rank
    blk = flat // _tr.BLOCK
    first = cap0
    streams = []
    for width, cap in _tr.TIERS[1:]:
        streams.append((blk, (r - first).clamp(max=(1 << width) - 1), width))
        keep = r >= first + cap
        first += cap
        blk, r = blk[keep], r[keep]
    raw_blk, raw_val = blk, order[r]

    sizes = []
    for bl, _, width in streams:
        per_byte = 8 // width
        sizes.append((torch.bincount(bl, minlength=nblocks) + per_byte - 1) // per_byte)
    sizes.append(torch.bincount(raw_blk, minlength=nblocks))
    off = torch.zeros(nblocks + 1, dtype=torch.int64, device=dev)
    torch.cumsum(torch.stack(sizes).sum(0), 0, out=off[1:])
    total = int(off[-1])
    area = torch.zeros(total, dtype=torch.int32, device=dev)
    start = off[:-1].clone()
    for (bl, digit, width), size in zip(streams, sizes):
        per_byte = 8 // width
        rk = _rank_in_block(bl, nblocks)
        # Disjoint bit fields: integer adds OR them, exact in any order (CUDA atomics included).
        area.index_add_(0, start[bl] + rk // per_byte, (digit << (width * (rk % per_byte))).to(torch.int32))
        start += size
    if raw_blk.numel():
        area[start[raw_blk] + _rank_in_block(raw_blk, nblocks)] = raw_val.to(torch.int32)

    base = torch.cat([off[:-1][:: _tr.SUPER], off[-1:]])
    rel = off[:-1] - base[torch.arange(nblocks, device=dev) // _tr.SUPER]
    arrays = {
        "sm": sm,
        "d1": d1_plane.contiguous(),
        "table": order[: _tr.TABLE].to(torch.uint8),
        "esc_base": base.to(torch.int32 if total < 2**31 else torch.int64),
        "esc_off": rel.to(torch.int32).to(torch.int16).view(torch.uint16),  # < 2**16; int16 wraps
        "area": area.to(torch.uint8),
    }
    return Packed(_tr.NAME, (n, k), arrays)


def _wrap32(x: torch.Tensor) -> torch.Tensor:
    """int64 values 0 .. 2**32 - 1 as the int32 words of the same bits."""
    return torch.where(x >= 2**31, x - 2**32, x).to(torch.int32)


def pack_dense11(w: torch.Tensor, version: int | None = None) -> Packed:
    """``dense11`` arrays of ``w`` computed on ``w.device`` in format version ``version`` (2 or 3, through
    version 1's arrays; None: the version ``glyd.pack`` writes); equal to the codec's (``glyd.codec.dense11``)."""
    from glyd.codec import dense11 as _d
    from glyd.codec import dense11_v2 as _v2
    from glyd.codec import dense11_v3 as _v3

    version = _d.LAYOUT.writes if version is None else version
    if version not in (2, 3):
        raise ValueError(f"the GPU pack writes dense11 format versions 2 and 3 (pack_dense11_v1: 1), got {version!r}")
    p = pack_dense11_v1(w)
    arrays = _v2.from_v1(dict(p.arrays), p.shape)
    return Packed(p.layout, p.shape, _v3.from_v2(arrays) if version == 3 else arrays, version)


def pack_dense11_v1(w: torch.Tensor) -> Packed:
    """``dense11`` format version 1 (bit planes) of ``w`` on ``w.device``; equal to
    ``glyd.codec.dense11.pack_v1(w)`` (benchmarks that time version 1's kernels)."""
    from glyd.codec import dense11 as _d

    w = _check(w)
    n, k = w.shape
    dev = w.device
    kp = _d.padded_cols(k)
    u = w.view(torch.int16).to(torch.int32) & 0xFFFF
    exp = (u >> 7) & 0xFF
    hist = torch.bincount(exp.reshape(-1), minlength=256)
    base = int(torch.argmax(hist.unfold(0, _d.WINDOW, 1).sum(dim=1)))  # first maximum, as the codec
    h = hist.to(torch.int64)
    h[base : base + _d.WINDOW] = -1
    etab = torch.argsort(-h, stable=True)[: _d.ETAB]
    off = exp - base
    inside = (off >= 0) & (off < _d.WINDOW)
    codes = torch.zeros(n, kp, dtype=torch.int64, device=dev)
    codes[:, :k] = torch.where(inside, off, _d.ESCAPE)
    sm = torch.zeros(n, kp, dtype=torch.uint8, device=dev)
    sm[:, :k] = (((u >> 8) & 0x80) | (u & 0x7F)).to(torch.uint8)
    c = codes.view(n, kp // _d.WORD, _d.WORD)
    shifts = torch.arange(_d.WORD, device=dev)
    planes = torch.stack([(((c >> p) & 1) << shifts).sum(-1) for p in range(3)], dim=-1)  # [N, W, 3]
    flat = torch.nonzero(~inside.reshape(-1)).reshape(-1)  # row-major, as the codec's stream
    e = exp.reshape(-1)[flat].to(torch.int64)
    slot = torch.full((256,), _d.RAW, dtype=torch.int64, device=dev)
    slot[etab] = torch.arange(_d.ETAB, device=dev)
    digit = slot[e]
    i = torch.arange(flat.numel(), device=dev)
    words = torch.zeros((flat.numel() + 7) // 8, dtype=torch.int64, device=dev)
    words.index_add_(0, i // 8, digit << (4 * (i % 8)))  # disjoint nibbles: the sum is their OR
    nbr = _d.blocks_per_row(k)
    esc = torch.zeros(n, nbr * _d.BLOCK, dtype=torch.int64, device=dev)
    esc[:, :kp] = codes == _d.ESCAPE
    offs = torch.zeros(n * nbr + 1, dtype=torch.int64, device=dev)
    offs[1:] = esc.view(n * nbr, _d.BLOCK).sum(1).cumsum(0)
    ebase = torch.cat([offs[:-1][:: _d.SUPER], offs[-1:]])
    rel = offs[:-1] - ebase[torch.arange(n * nbr, device=dev) // _d.SUPER]
    raw = digit == _d.RAW
    arrays = {
        "sm": sm,
        "code": _wrap32(planes).view(n, 3 * (kp // _d.WORD)),
        "base": torch.tensor([base], dtype=torch.uint8, device=dev),
        "etab": etab.to(torch.uint8),
        "esc": _wrap32(words),
        "esc_base": ebase.to(torch.int32 if flat.numel() < 2**31 else torch.int64),
        "esc_off": rel.to(torch.int32).to(torch.int16).view(torch.uint16),  # < 2**16; int16 wraps
        "exc_idx": flat[raw].to(torch.int32 if n * k < 2**31 else torch.int64),
        "exc_exp": e[raw].to(torch.uint8),
    }
    return Packed(_d.NAME, (n, k), arrays, 1)


__all__ = ["pack_fixed12", "pack_tiered", "pack_dense11", "pack_dense11_v1"]
