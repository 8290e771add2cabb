"""``fixed12`` unpack on the GPU: bit-exact bf16 from the packed planes, the exceptions patched in by
the same launch.

Whole rows (K == Kp) are one stream of 64-weight groups (the flat kernel); padded rows take byte
tiles. ``unpack_rows`` decodes a row range (the long-prompt path, a chunk at a time). Each program
writes its tile's exceptions over the placeholders it has just stored, from a per-tile list of
them built once a matrix and tiling (``_common.exception_tiles``): one launch, where a second
scatter (``index_put``) used to follow, costing a launch's host time on every long-prompt product.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from glyd.codec import fixed12 as _codec
from glyd.codec.packed import Packed
from glyd.kernels import _common as C
from glyd.kernels._fields import flags, ints
from glyd.kernels import _plan
from glyd.kernels._interp import isolated
from glyd.kernels.fixed12.exceptions import Prepared, prepare


@dataclasses.dataclass(frozen=True)
class UnpackConfig:
    """``flat_groups`` 64-weight groups and ``flat_warps`` warps a program of the flat kernel (0
    groups: byte tiles always; 16 groups, 2 warps: 66.1 us an 18944 x 3584 matrix on the H200, 3.6
    TB/s, against 88.8 us for the byte tiles); the byte tiles' ``rows``, ``groups`` and ``warps``."""

    flat_groups: int = 16
    flat_warps: int = 2
    rows: int = 32
    groups: int = 2
    warps: int = 4

    def __post_init__(self) -> None:
        for name in ("rows", "groups", "flat_warps", "warps"):
            C.pow2(self, name)
        ints(self, 0, None, "flat_groups")
        if self.flat_groups:
            C.pow2(self, "flat_groups")


@isolated
@triton.jit
def _unpack_kernel(code_ptr, lo_ptr, base_ptr, out_ptr, tile_ptr, epos_ptr, eval_ptr, N, K, KP, R0, T0, POS0,
                   BN: tl.constexpr, G: tl.constexpr, HAS_EXC: tl.constexpr, E: tl.constexpr):
    # rows R0 + [pid_n * BN, +BN) (out's rows from 0), columns [pid_k * 64 G, +64 G); then the
    # exceptions of this tile (tile T0 + pid_n of the rows, pid_k of the columns) over them
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    rp = (R0 + rn).to(tl.int64)
    base = tl.load(base_ptr).to(tl.int32)
    j = tl.arange(0, 32)
    for gi in tl.static_range(G):
        col0 = (pid_k * G + gi) * 64
        m = nmask[:, None] & (col0 + j < KP)[None, :]
        c = tl.load(code_ptr + rp[:, None] * (KP // 2) + (col0 // 2 + j)[None, :], mask=m, other=0).to(tl.int32)
        la = tl.load(lo_ptr + rp[:, None] * KP + (col0 + j)[None, :], mask=m, other=0).to(tl.int32)
        lb = tl.load(lo_ptr + rp[:, None] * KP + (col0 + 32 + j)[None, :], mask=m, other=0).to(tl.int32)
        na = c & 0xF
        nb = c >> 4
        va = (((na & 8) << 4) | ((na & 7) + base)) << 8 | la
        vb = (((nb & 8) << 4) | ((nb & 7) + base)) << 8 | lb
        ca = col0 + j
        tl.store(out_ptr + rn[:, None] * K + ca[None, :], va.to(tl.int16),
                 mask=nmask[:, None] & (ca < K)[None, :])
        tl.store(out_ptr + rn[:, None] * K + (ca + 32)[None, :], vb.to(tl.int16),
                 mask=nmask[:, None] & (ca + 32 < K)[None, :])
    if HAS_EXC:
        C.patch_exceptions(out_ptr, tile_ptr, epos_ptr, eval_ptr, (T0 + pid_n) * tl.num_programs(1) + pid_k, POS0,
                           N * K, E)


@isolated
@triton.jit
def _unpack_flat_kernel(code_ptr, lo_ptr, base_ptr, out_ptr, tile_ptr, epos_ptr, eval_ptr, NG, G0, T0, POS0,
                        BG: tl.constexpr, HAS_EXC: tl.constexpr, E: tl.constexpr):
    # K == Kp: the planes and the output are one stream of 64-weight groups (code 32 bytes, lo 64,
    # out 64 bf16 each, rows back to back), so a program takes BG whole groups with no row math;
    # then the exceptions among its 64 BG weights over them. A row range starts at group G0, the
    # matrix's flat tile T0 (a whole tile) and weight POS0; out holds only its NG groups.
    g = tl.program_id(0).to(tl.int64) * BG + tl.arange(0, BG)[:, None]
    j = tl.arange(0, 32)[None, :]
    m = g < NG
    base = tl.load(base_ptr).to(tl.int32)
    src = G0 + g
    c = tl.load(code_ptr + src * 32 + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int32)
    la = tl.load(lo_ptr + src * 64 + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int32)
    lb = tl.load(lo_ptr + src * 64 + 32 + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int32)
    na = c & 0xF
    nb = c >> 4
    va = (((na & 8) << 4) | ((na & 7) + base)) << 8 | la
    vb = (((nb & 8) << 4) | ((nb & 7) + base)) << 8 | lb
    tl.store(out_ptr + g * 64 + j, va.to(tl.int16), mask=m)
    tl.store(out_ptr + g * 64 + 32 + j, vb.to(tl.int16), mask=m)
    if HAS_EXC:
        C.patch_exceptions(out_ptr, tile_ptr, epos_ptr, eval_ptr, T0 + tl.program_id(0), POS0, NG * 64, E)


def _tiles(p: Packed, prep: Prepared, key: tuple, tile_of):
    """The exception tiles of ``p`` for one tiling (``tile_of(r, c) -> tile ids``, ``key[-1]`` tiles)."""
    k = p.shape[1]
    pos = prep.pos
    return C.exception_tiles(prep, key, pos, prep.vals, tile_of(pos // k, pos % k), key[-1])


# packed: fixed12 [N, K] rows r0:r1 -> launch(out, *arrays): out bf16 [r1 - r0, K] (written, contiguous)
def unpack_launch(p: Packed, r0: int = 0, r1: int | None = None, config: UnpackConfig | None = None) -> _plan.Launch:
    """The unpack of rows ``r0:r1`` of ``p`` as one ``glyd.kernels._plan.Launch``, exceptions included
    (``arrays``: fixed12's, in its order). The flat kernel where K == Kp for whole matrices and row ranges on
    its tiles' bounds (multiples of 1,024 weights at the default 16 groups), else byte tiles."""
    if config is not None and not isinstance(config, UnpackConfig):
        raise TypeError(f"config must be a UnpackConfig (the fixed12 unpack's), got {type(config).__name__}")
    cfg = config or UnpackConfig()
    n, k = p.shape
    r1 = n if r1 is None else r1
    if not 0 <= r0 <= r1 <= n:
        raise ValueError(f"rows {r0}:{r1} are outside the matrix's {n} rows")
    kp = p.arrays["lo"].shape[1]
    C.check_size("fixed12 'lo'", n * kp)
    prep = prepare(p)
    rows = r1 - r0
    out = _plan.Slot(0).view(torch.int16)
    lo, code, base, _idx, _hi = _plan.slots(5, 1, fixed=True)
    has_exc = prep.nexc > 0 and rows > 0
    span = cfg.flat_groups * 64
    if cfg.flat_groups and k == kp and rows and r0 * k % span == 0 and (r1 == n or r1 * k % span == 0):
        # whole matrices, and row ranges that start and end on the flat tiling's tiles (chunks of 64 rows and more
        # for K a multiple of 64): the matrix's flat tiles from T0 (its exception tiles, made once)
        ntiles = triton.cdiv(n * kp // 64, cfg.flat_groups)
        tiles = _tiles(p, prep, ("flat", span, ntiles), lambda r, c: (r * k + c) // span) if has_exc else (out,) * 3
        ng = rows * kp // 64
        return _plan.Launch(_unpack_flat_kernel, (triton.cdiv(ng, cfg.flat_groups),),
                            (code, lo, base, out, *tiles, ng, r0 * kp // 64, r0 * k // span, r0 * k),
                            dict(BG=cfg.flat_groups, HAS_EXC=has_exc, E=C.PATCH_CHUNK, num_warps=cfg.flat_warps))
    bn = cfg.rows
    while r0 % bn:  # the tiles' rows must start at r0 (a power of two that divides it)
        bn //= 2
    cols = 64 * cfg.groups
    ntc = triton.cdiv(kp, cols)
    grid = (triton.cdiv(rows, bn), ntc)
    ntiles = triton.cdiv(n, bn) * ntc
    tiles = (_tiles(p, prep, ("rows", bn, cols, ntiles), lambda r, c: (r // bn) * ntc + c // cols) if has_exc
             else (out,) * 3)
    return _plan.Launch(_unpack_kernel, grid, (code, lo, base, out, *tiles, rows, k, kp, r0, r0 // bn, r0 * k),
                        dict(BN=bn, G=cfg.groups, HAS_EXC=has_exc, E=C.PATCH_CHUNK, num_warps=cfg.warps))


# packed: fixed12 [N, K] (lo uint8 [N, Kp], code uint8 [N, Kp/2], base uint8 [1]) -> bf16 [N, K]
def unpack(p: Packed, out: torch.Tensor | None = None, config: UnpackConfig | None = None) -> torch.Tensor:
    n, k = p.shape
    if out is None:
        out = torch.empty(n, k, dtype=torch.bfloat16, device=p.arrays["lo"].device)
    elif out.shape != (n, k) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [{n}, {k}] tensor, got {out.dtype} {tuple(out.shape)}")
    launch = unpack_launch(p, 0, n, config)
    if n and k:
        launch(out, *(p.arrays[a] for a in _codec.ARRAYS))
    return out


# packed: fixed12 [N, K], rows r0:r1 -> out bf16 [r1 - r0, K] (written, contiguous)
def unpack_rows(p: Packed, prep: Prepared, r0: int, r1: int, out: torch.Tensor,
                config: UnpackConfig | None = None) -> None:
    """Rows ``r0:r1`` of ``p`` (the long-prompt path, a chunk at a time); ``prep``: ``prepare(p)``."""
    k = p.shape[1]
    if out.shape != (r1 - r0, k) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{r1 - r0}, {k}] tensor, got {tuple(out.shape)}")
    launch = unpack_launch(p, r0, r1, config)
    if r1 > r0 and k:
        launch(out, *(p.arrays[a] for a in _codec.ARRAYS))
