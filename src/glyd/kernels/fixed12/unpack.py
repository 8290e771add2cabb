"""``fixed12`` unpack on the GPU: bit-exact bf16 from the packed planes, then the exceptions scattered in.

Whole rows (K == Kp) are one stream of 64-weight groups (the flat kernel); padded rows take byte
tiles. ``unpack_rows`` decodes a row range (the long-prompt path, a chunk at a time).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from glyd.codec.packed import Packed
from glyd.kernels import _common as C
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
        if self.flat_groups:
            C.pow2(self, "flat_groups")


@isolated
@triton.jit
def _unpack_kernel(code_ptr, lo_ptr, base_ptr, out_ptr, N, K, KP, BN: tl.constexpr, G: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    base = tl.load(base_ptr).to(tl.int32)
    j = tl.arange(0, 32)
    for gi in tl.static_range(G):
        col0 = (pid_k * G + gi) * 64
        m = nmask[:, None] & (col0 + j < KP)[None, :]
        c = tl.load(code_ptr + rn[:, None] * (KP // 2) + (col0 // 2 + j)[None, :], mask=m, other=0).to(tl.int32)
        la = tl.load(lo_ptr + rn[:, None] * KP + (col0 + j)[None, :], mask=m, other=0).to(tl.int32)
        lb = tl.load(lo_ptr + rn[:, None] * KP + (col0 + 32 + j)[None, :], mask=m, other=0).to(tl.int32)
        na = c & 0xF
        nb = c >> 4
        va = (((na & 8) << 4) | ((na & 7) + base)) << 8 | la
        vb = (((nb & 8) << 4) | ((nb & 7) + base)) << 8 | lb
        ca = col0 + j
        tl.store(out_ptr + rn[:, None] * K + ca[None, :], va.to(tl.int16),
                 mask=nmask[:, None] & (ca < K)[None, :])
        tl.store(out_ptr + rn[:, None] * K + (ca + 32)[None, :], vb.to(tl.int16),
                 mask=nmask[:, None] & (ca + 32 < K)[None, :])


@isolated
@triton.jit
def _unpack_flat_kernel(code_ptr, lo_ptr, base_ptr, out_ptr, NG, BG: tl.constexpr):
    # K == Kp: the planes and the output are one stream of 64-weight groups (code 32 bytes, lo 64,
    # out 64 bf16 each, rows back to back), so a program takes BG whole groups with no row math.
    g = tl.program_id(0).to(tl.int64) * BG + tl.arange(0, BG)[:, None]
    j = tl.arange(0, 32)[None, :]
    m = g < NG
    base = tl.load(base_ptr).to(tl.int32)
    c = tl.load(code_ptr + g * 32 + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int32)
    la = tl.load(lo_ptr + g * 64 + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int32)
    lb = tl.load(lo_ptr + g * 64 + 32 + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int32)
    na = c & 0xF
    nb = c >> 4
    va = (((na & 8) << 4) | ((na & 7) + base)) << 8 | la
    vb = (((nb & 8) << 4) | ((nb & 7) + base)) << 8 | lb
    tl.store(out_ptr + g * 64 + j, va.to(tl.int16), mask=m)
    tl.store(out_ptr + g * 64 + 32 + j, vb.to(tl.int16), mask=m)


# packed: fixed12 [N, K] (lo uint8 [N, Kp], code uint8 [N, Kp/2], base uint8 [1]) -> bf16 [N, K]
def unpack(p: Packed, out: torch.Tensor | None = None, config: UnpackConfig | None = None) -> torch.Tensor:
    cfg = config or UnpackConfig()
    n, k = p.shape
    a = p.arrays
    kp = a["lo"].shape[1]
    C.check_size("fixed12 'lo'", n * kp)
    prep = prepare(p)
    if out is None:
        out = torch.empty(n, k, dtype=torch.bfloat16, device=a["lo"].device)
    elif out.shape != (n, k) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [{n}, {k}] tensor, got {out.dtype} {tuple(out.shape)}")
    if not (n and k):
        return out
    if cfg.flat_groups and k == kp:
        ng = n * kp // 64
        _unpack_flat_kernel[(triton.cdiv(ng, cfg.flat_groups),)](a["code"], a["lo"], a["base"], out.view(torch.int16),
                                                                 ng, BG=cfg.flat_groups, num_warps=cfg.flat_warps)
    else:
        grid = (triton.cdiv(n, cfg.rows), triton.cdiv(kp, 64 * cfg.groups))
        _unpack_kernel[grid](a["code"], a["lo"], a["base"], out.view(torch.int16), n, k, kp, BN=cfg.rows,
                             G=cfg.groups, num_warps=cfg.warps)
    if prep.nexc:
        out.view(torch.int16).view(-1)[prep.pos] = prep.vals
    return out


# packed: fixed12 [N, K], rows r0:r1 -> out bf16 [r1 - r0, K] (written, contiguous)
def unpack_rows(p: Packed, prep: Prepared, r0: int, r1: int, out: torch.Tensor,
                config: UnpackConfig | None = None) -> None:
    cfg = config or UnpackConfig()
    n, k = p.shape
    a = p.arrays
    kp = a["lo"].shape[1]
    rows = r1 - r0
    if out.shape != (rows, k) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{rows}, {k}] tensor, got {tuple(out.shape)}")
    grid = (triton.cdiv(rows, cfg.rows), triton.cdiv(kp, 64 * cfg.groups))
    _unpack_kernel[grid](a["code"][r0:r1], a["lo"][r0:r1], a["base"], out.view(torch.int16), rows, k, kp,
                         BN=cfg.rows, G=cfg.groups, num_warps=cfg.warps)
    if prep.nexc:
        e0, e1 = prep.rowptr_host[r0], prep.rowptr_host[r1]
        if e1 > e0:
            out.view(torch.int16).view(-1)[prep.pos[e0:e1] - r0 * k] = prep.vals[e0:e1]
