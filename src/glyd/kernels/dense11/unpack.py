"""Triton kernels for the ``dense11`` layout: the decode and the bit-exact unpack (the fused GEMV for
1-16 x rows in ``gemv.py``).

A step decodes a [BN, BK] tile (BK columns of BN rows, BK dividing the 1024-column escape block) as
[BN, BK/32, 32]: a weight in the window is its ``sm`` byte, three plane bits and an add
(``exponent = base + code``). Escapes (code 7, 3-4% of real weights) are found with the AND of a
run's three plane words; an escape's place in the digit stream is its block's offset, plus the
escapes of the block's earlier steps (a running count a row, one popcount a plane word), plus the
popcounts of the tile's earlier words and of its own word below it: no prefix sum over weights.
Digits 0-14 pick an exponent from the table, packed four a word (a select and a shift); digit 15
decodes with the placeholder exponent 0 and its exception is added afterwards as
``x[col] * (true - placeholder)`` (unpack: patched in by each tile, as fixed12's exceptions are).

On the GPU the popcounts are ``popc`` (libdevice); Triton's interpreter cannot run libdevice, so
there they are SWAR bit counts (``HW_POPC=False``). Nothing here is timed yet.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from glyd.codec import dense11 as _codec
from glyd.codec import dense11_v2 as _v2
from glyd.codec import dense11_v3 as _v3
from glyd.codec.packed import Packed
from glyd.errors import CorruptError, FormatError
from glyd.kernels import _common as C
from glyd.kernels import _plan
from glyd.kernels._interp import isolated

BLOCK = _codec.BLOCK
SUPER = _codec.SUPER
log = logging.getLogger(__name__)
#: Whether this process said once that version-1 matrices run these (slower) kernels.
_SAID = [False]


@triton.jit
def _popc(x, HW_POPC: tl.constexpr):
    # bits set in each 32-bit word (x: uint32)
    if HW_POPC:
        return libdevice.popc(x.to(tl.int32, bitcast=True))
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def _etab_word(etab_ptr, r: tl.constexpr):
    # etab[r .. r + 3] as one little-endian word (entry 15, past the table: the placeholder 0)
    w = tl.load(etab_ptr + r).to(tl.int32)
    for i in tl.static_range(1, 4):
        if r + i < 15:
            w |= tl.load(etab_ptr + r + i).to(tl.int32) << (8 * i)
    return w


@triton.jit
def _block_start(ebase_ptr, eoff_ptr, b, mask):
    # index in the digit stream of block b's first escape
    return tl.load(ebase_ptr + b // 16, mask=mask, other=0) + tl.load(eoff_ptr + b, mask=mask, other=0).to(tl.int32)


@triton.jit
def _decode(sm_ptr, code_ptr, esc_ptr, rn, nmask, kb, KP, run, base, T0, T1, T2, T3, NESC,
            BN: tl.constexpr, BK: tl.constexpr, HW_POPC: tl.constexpr):
    # fp32 bits [BN, BK] of columns kb .. kb + BK of rows rn, and each row's escapes in the tile.
    # run [BN]: the stream index of the first escape at or after column kb in each row.
    W: tl.constexpr = BK // 32
    wi = tl.arange(0, W)
    j = tl.arange(0, 32)
    cw = (rn * (3 * (KP // 32)))[:, None] + 3 * (kb // 32 + wi)[None, :]  # [BN, W] first plane word
    m2 = nmask[:, None] & (kb // 32 + wi < KP // 32)[None, :]
    p0 = tl.load(code_ptr + cw, mask=m2, other=0).to(tl.uint32, bitcast=True)
    p1 = tl.load(code_ptr + cw + 1, mask=m2, other=0).to(tl.uint32, bitcast=True)
    p2 = tl.load(code_ptr + cw + 2, mask=m2, other=0).to(tl.uint32, bitcast=True)
    col = kb + wi[:, None] * 32 + j[None, :]  # [W, 32]
    sm = tl.load(sm_ptr + (rn * KP)[:, None, None] + col[None, :, :], mask=nmask[:, None, None] & (col < KP)[None, :, :],
                 other=0).to(tl.int32)
    j3 = j[None, None, :].to(tl.uint32)
    code = (((p0[:, :, None] >> j3) & 1) | (((p1[:, :, None] >> j3) & 1) << 1)
            | (((p2[:, :, None] >> j3) & 1) << 2)).to(tl.int32)
    # escapes: the run's mask, then the popcounts below each one
    em = p0 & p1 & p2
    cnt = _popc(em, HW_POPC)  # [BN, W]
    pre = tl.cumsum(cnt, axis=1) - cnt + run[:, None]
    below = _popc(em[:, :, None] & ((tl.full([1, 1, 32], 1, tl.uint32) << j3) - 1), HW_POPC)
    rank = pre[:, :, None] + below
    esc = (code == 7) & (rank < NESC)
    dw = tl.load(esc_ptr + (rank >> 3), mask=esc, other=0)
    d = (dw >> ((rank & 7) * 4)) & 15
    t = tl.where(d < 8, tl.where(d < 4, T0, T1), tl.where(d < 12, T2, T3))
    exp = tl.where(code == 7, (t >> ((d & 3) * 8)) & 0xFF, base + code)
    bits = ((sm & 0x80) << 24) | (exp << 23) | ((sm & 0x7F) << 16)
    return tl.reshape(bits, [BN, BK]), tl.sum(cnt, axis=1)


@triton.jit
def _tables(etab_ptr):
    return _etab_word(etab_ptr, 0), _etab_word(etab_ptr, 4), _etab_word(etab_ptr, 8), _etab_word(etab_ptr, 12)


@isolated
@triton.jit
def _unpack_kernel(sm_ptr, code_ptr, base_ptr, etab_ptr, esc_ptr, ebase_ptr, eoff_ptr, out_ptr, tile_ptr, epos_ptr,
                   eval_ptr, N, K, KP, NBR, NESC, BN: tl.constexpr, BK: tl.constexpr, HW_POPC: tl.constexpr,
                   HAS_EXC: tl.constexpr, E: tl.constexpr):
    # rows [pid_n * BN, +BN) of block column pid_b (columns 1024 pid_b .. +1024), BK a step
    pid_n = tl.program_id(0)
    pid_b = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    base = tl.load(base_ptr).to(tl.int32)
    T0, T1, T2, T3 = _tables(etab_ptr)
    run = _block_start(ebase_ptr, eoff_ptr, rn * NBR + pid_b, nmask)
    k1 = tl.minimum(pid_b * 1024 + 1024, KP)
    kk = tl.arange(0, BK)
    for kb in range(pid_b * 1024, k1, BK):
        bits, n_esc = _decode(sm_ptr, code_ptr, esc_ptr, rn, nmask, kb, KP, run, base, T0, T1, T2, T3, NESC,
                              BN, BK, HW_POPC)
        run += n_esc
        c = kb + kk
        tl.store(out_ptr + (rn * K)[:, None] + c[None, :], (bits >> 16).to(tl.int16),
                 mask=nmask[:, None] & (c < K)[None, :])
    if HAS_EXC:  # this tile's exceptions over their placeholders (exponent 0)
        C.patch_exceptions(out_ptr, tile_ptr, epos_ptr, eval_ptr, pid_n * NBR + pid_b, 0, N * K, E)


class Prepared:
    """Per-matrix data checked and derived once (host syncs allowed here, never in ``linear``):
    the escape offsets checked against the codes (every digit read lies inside ``esc``), the
    exceptions' row pointers and their true bf16 words."""

    def __init__(self, p: Packed) -> None:
        n, k = p.shape
        a = p.arrays
        kp = a["sm"].shape[1]
        C.check_size("dense11 'sm'", n * kp)
        if a["esc"].numel() * 8 >= 2**31 or n * _codec.blocks_per_row(k) >= 2**31:
            raise C.FormatError("dense11 escape stream is too large for 32-bit offsets")
        for name in _codec.ARRAYS:  # the kernels take each array's pointer as one dense array
            if not a[name].is_contiguous():
                raise FormatError(f"dense11 array '{name}' must be contiguous (the kernels read it as one array), "
                                  f"got strides {a[name].stride()}")
        base = int(a["base"][0])
        if base > _codec.MAX_BASE:  # base + code past exponent 255 would carry into the sign bit
            raise CorruptError(f"dense11 base {base} is out of range 0..{_codec.MAX_BASE}")
        self.nesc = _check_offsets(p) if n * kp else 0
        idx = a["exc_idx"].to(torch.int64)
        self.nexc = int(idx.numel())
        if self.nexc and (int(idx.min()) < 0 or int(idx.max()) >= n * k or bool((idx[1:] <= idx[:-1]).any())):
            raise CorruptError("dense11 'exc_idx' is not strictly increasing inside the matrix")
        # the kernels decode digit 15 as exponent 0 and add or patch every listed index: the list must
        # be exactly those escapes (padding and version 2's rank rule checked there too)
        if n * kp and not torch.equal(_codec.device_escapes(p)[1], idx):
            raise CorruptError("dense11 'exc_idx' does not list exactly the escapes whose digit is 15")
        if self.nexc:
            bounds = torch.arange(n + 1, device=idx.device, dtype=torch.int64) * k
            self.rowptr = torch.searchsorted(idx, bounds).to(torch.int32)
            col = idx % k if p.version != 3 else _v3.sm_columns(kp, idx.device)[idx % k]  # version 3: block-wise
            sm = a["sm"].reshape(-1)[(idx // k) * kp + col].to(torch.int32)
            self.pos = idx
            self.vals = (((sm & 0x80) << 8) | (a["exc_exp"].to(torch.int32) << 7) | (sm & 0x7F)).to(torch.int16)
        else:
            self.rowptr = torch.zeros(n + 1, dtype=torch.int32, device=idx.device)
            self.pos = self.vals = None


def _popcount32(x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.int64) & 0xFFFFFFFF
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) & 0xFFFFFFFF) >> 24


def _check_offsets(p: Packed) -> int:
    # Every block's offset must equal the escapes before it and 'esc' must hold exactly their
    # digits before a kernel reads a digit: the offsets come from a file. Torch ops on the
    # arrays' device, once a matrix. Returns the number of escapes.
    n, k = p.shape
    a = p.arrays
    nbr = _codec.blocks_per_row(k)
    if p.version == 1:
        planes = a["code"].view(n, -1, 3).to(torch.int64)
        cnt = _popcount32(planes[..., 0] & planes[..., 1] & planes[..., 2])  # [N, Kp/32]
    else:  # version 2's nibble words (glyd.codec.dense11_v2); version 3's in version 2's order
        code = _v3.restore_code(a["code"]) if p.version == 3 else a["code"]
        cnt = _popcount32(_v2.escape_masks(code.view(n, -1, 3)))
    pad = torch.zeros(n, nbr * 32, dtype=torch.int64, device=cnt.device)
    pad[:, : cnt.shape[1]] = cnt
    per_block = pad.view(n * nbr, 32).sum(1)
    want = torch.cat([per_block.new_zeros(1), per_block.cumsum(0)])
    base = a["esc_base"].to(torch.int64)
    blk = torch.arange(n * nbr, device=base.device)
    got = torch.cat([base[blk // SUPER] + a["esc_off"].to(torch.int32).to(torch.int64), base[-1:]])
    total = int(want[-1])
    bad = (got.shape != want.shape) or bool((got != want).any()) or a["esc"].numel() != (total + 7) // 8
    if bad or bool((base[1:] < base[:-1]).any()):
        raise CorruptError("dense11 'esc_base'/'esc_off'/'esc' do not match the escape codes (a damaged or crafted file)")
    _codec.check_stream_tail(a["esc"], total)
    return total


def prepare(p: Packed) -> Prepared:
    """The checked per-matrix data of ``p`` (built once a matrix; again after an in-place change)."""
    if not isinstance(p, Packed) or p.layout != _codec.NAME:
        raise TypeError("packed must be a dense11 glyd.Packed")
    if p.version != 1:  # glyd.kernels.dense11.versions picks a version's kernels
        raise ValueError(f"dense11 format version {p.version}: these kernels decode version 1 (version 2: unpack_v2)")
    return C.cached(p.arrays["code"], lambda: _prepared_v1(p), p.arrays.values(), C.packed_tag(p))


def _prepared_v1(p: Packed) -> Prepared:
    if not _SAID[0]:  # once a process (a model's matrices come one after another): say how to get version 3
        _SAID[0] = True
        log.warning("dense11 format version 1 matrices (bit planes) run the version-1 kernels, several times "
                    "slower than versions 2 and 3's; re-save the model with this glyd (glyd.pack writes version 3)")
    return Prepared(p)


def _args(p: Packed):
    a = p.arrays
    return a["sm"], a["code"], a["base"], a["etab"], a["esc"], a["esc_base"], a["esc_off"]


@dataclasses.dataclass(frozen=True)
class Dense11UnpackConfig:
    """``rows`` rows a program (one 1024-column block each), ``bk`` columns a step, ``warps``."""

    rows: int = 8
    bk: int = 256
    warps: int = 4

    def __post_init__(self) -> None:
        C.pow2(self, "rows", "bk", "warps")
        if not 64 <= self.bk <= BLOCK:
            raise ValueError(f"bk must be 64-{BLOCK}, got {self.bk}")


# packed: dense11 [N, K] -> launch(out, *arrays): out bf16 [N, K] (written, contiguous)
def unpack_launch(p: Packed, config: Dense11UnpackConfig | None = None) -> _plan.Launch:
    """The unpack of ``p`` as one ``glyd.kernels._plan.Launch``, its exceptions patched in by the same
    launch (``arrays``: dense11's, in its order). Version 1 only (``versions.py`` picks by version)."""
    if config is not None and not isinstance(config, Dense11UnpackConfig):
        raise TypeError(f"config must be a Dense11UnpackConfig (the dense11 unpack's), got {type(config).__name__}")
    cfg = config or Dense11UnpackConfig()
    prep = prepare(p)
    n, k = p.shape
    kp = p.arrays["sm"].shape[1]
    nbr = _codec.blocks_per_row(k)
    out = _plan.Slot(0).view(torch.int16)
    has_exc = prep.nexc > 0
    if has_exc:
        pos, bn = prep.pos, cfg.rows
        tiles = C.exception_tiles(prep, ("rows", bn), pos, prep.vals, (pos // k // bn) * nbr + pos % k // BLOCK,
                                  triton.cdiv(n, bn) * nbr)
    else:
        tiles = (out,) * 3
    return _plan.Launch(_unpack_kernel, (triton.cdiv(n, cfg.rows), nbr),
                        (*_plan.slots(7, 1, fixed=True), out, *tiles, n, k, kp, nbr, prep.nesc),
                        dict(BN=cfg.rows, BK=min(cfg.bk, triton.next_power_of_2(kp)), HW_POPC=not C.interpreting(),
                             HAS_EXC=has_exc, E=C.PATCH_CHUNK, num_warps=cfg.warps))


# packed: dense11 [N, K] (sm [N, Kp], code int32 [N, 3 Kp/32], esc, offsets, exceptions) -> bf16 [N, K]
def unpack(p: Packed, out: torch.Tensor | None = None, config: Dense11UnpackConfig | None = None) -> torch.Tensor:
    launch = unpack_launch(p, config)
    n, k = p.shape
    if out is None:
        out = torch.empty(n, k, dtype=torch.bfloat16, device=p.device)
    elif out.shape != (n, k) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [{n}, {k}] tensor, got {out.dtype} {tuple(out.shape)}")
    if n and k:
        launch(out, *(p.arrays[a] for a in _codec.ARRAYS))
    return out
