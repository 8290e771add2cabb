"""Triton kernels for the ``tiered`` layout: GPU unpack and the fused linear.

One step decodes one escape-area block (1024 consecutive weights of the padded matrix) of BN rows, in natural order: the tier-1
digit of every weight comes from ``d1`` (byte j of a 64-weight group's 16 bytes holds weights j,
j+16, j+32, j+48); the escapes of each tier get their rank inside the block from ``tl.cumsum``
along the row, which addresses their digit in the block's area (tier 2 bits, tier 3 2-bit
digits, tier 4 nibbles, then raw exponent bytes). The first three exponents come from scalars
loaded once; deeper ranks read the 22-byte table (L1-resident). Tiers past the third run only
when a step holds such an escape (a branch on the whole tile).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glyd.codec import tiered as _codec
from glyd.codec.packed import Packed
from glyd.kernels import _common as C

BLOCK = _codec.BLOCK
SUPER = _codec.SUPER


@triton.jit
def _excl_rank(e):
    ei = e.to(tl.int32)
    return tl.cumsum(ei, axis=1) - ei, tl.sum(ei, axis=1)


@triton.jit
def _decode(sm_ptr, d1_ptr, table_ptr, ebase_ptr, eoff_ptr, area_ptr, t0, t1, t2, b, bmask, TOTAL,
            BB: tl.constexpr):
    # fp32 bits (sign, exponent, mantissa << 16) of the weights of escape blocks b ([BB, 1024], uint32).
    i = tl.arange(0, 1024)
    f = b[:, None] * 1024 + i[None, :]  # flat index in the padded [N, Kp] matrix
    fm = bmask[:, None] & (f < TOTAL)
    sm = tl.load(sm_ptr + f, mask=fm, other=0).to(tl.uint32)
    db = tl.load(d1_ptr + (f >> 6) * 16 + (f & 15), mask=fm, other=0).to(tl.int32)
    d = (db >> (2 * ((f >> 4) & 3))) & 3
    exp = tl.where(d == 0, t0, tl.where(d == 1, t1, t2))
    off = tl.load(ebase_ptr + b // 16, mask=bmask, other=0).to(tl.int64) + \
        tl.load(eoff_ptr + b, mask=bmask, other=0).to(tl.int64)
    # tier 2: one bit an escape (0: rank 3)
    e1 = d == 3
    r1, c1 = _excl_rank(e1)
    b2 = tl.load(area_ptr + off[:, None] + (r1 >> 3), mask=e1, other=0).to(tl.int32)
    e2 = e1 & (((b2 >> (r1 & 7)) & 1) == 1)
    rank = tl.where(e1, 3, d)
    # tier 3: one bit (0: rank 4)
    s = off + (c1 + 7) // 8
    r2, c2 = _excl_rank(e2)
    b3 = tl.load(area_ptr + s[:, None] + (r2 >> 3), mask=e2, other=0).to(tl.int32)
    e3 = e2 & (((b3 >> (r2 & 7)) & 1) == 1)
    rank = tl.where(e2, 4, rank)
    # tier 4: 2 bits (0-2: ranks 5-7)
    s += (c2 + 7) // 8
    r3, c3 = _excl_rank(e3)
    b4 = tl.load(area_ptr + s[:, None] + (r3 >> 2), mask=e3, other=0).to(tl.int32)
    d4 = (b4 >> (2 * (r3 & 3))) & 3
    rank = tl.where(e3, 5 + d4, rank)
    e4 = e3 & (d4 == 3)
    if tl.sum(tl.sum(e4.to(tl.int32), axis=1), axis=0) > 0:  # deeper tiers: skipped when none
        s += (c3 + 3) // 4
        r4, c4 = _excl_rank(e4)
        b5 = tl.load(area_ptr + s[:, None] + (r4 >> 1), mask=e4, other=0).to(tl.int32)
        d5 = (b5 >> (4 * (r4 & 1))) & 15
        rank = tl.where(e4, 8 + d5, rank)
        e5 = e4 & (d5 == 15)
        s += (c4 + 1) // 2
        r5, c5 = _excl_rank(e5)
        raw = tl.load(area_ptr + s[:, None] + r5, mask=e5, other=0).to(tl.int32)
        exp = tl.where(e5, raw, exp)
        deep = e1 & ~e5
    else:
        deep = e1
    exp = tl.where(deep, tl.load(table_ptr + rank, mask=deep, other=0).to(tl.int32), exp)
    return ((sm & 0x80) << 24) | (exp.to(tl.uint32) << 23) | ((sm & 0x7F) << 16)


@triton.jit
def _gemv_kernel(
    x_ptr, sm_ptr, d1_ptr, table_ptr, ebase_ptr, eoff_ptr, area_ptr, bias_ptr, out_ptr,
    N, K, KP, TOTAL, NBLK, stride_xm,
    BN: tl.constexpr, BB: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    # One program owns rows [r0, r0 + BN) and walks the escape blocks that cover them (needs Kp >= 1024,
    # so a block holds pieces of at most two rows); one activation row (pid 1) a program.
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    r0 = pid_n * BN
    rn = r0 + tl.arange(0, BN)
    nmask = rn < N
    t0 = tl.load(table_ptr).to(tl.int32)
    t1 = tl.load(table_ptr + 1).to(tl.int32)
    t2 = tl.load(table_ptr + 2).to(tl.int32)
    f0 = r0 * KP
    f1 = tl.minimum(r0 + BN, N) * KP
    bend = tl.minimum((f1 + 1023) // 1024, NBLK)
    acc = tl.zeros([BN], dtype=tl.float32)
    i = tl.arange(0, 1024)
    for blk0 in range(f0 // 1024, bend, BB):
        b = blk0 + tl.arange(0, BB)  # BB consecutive blocks a step: independent work in flight
        bmask = b < bend
        wv = _decode(sm_ptr, d1_ptr, table_ptr, ebase_ptr, eoff_ptr, area_ptr, t0, t1, t2, b, bmask, TOTAL,
                     BB).to(tl.float32, bitcast=True)
        fb = b * 1024
        ra = fb // KP  # row of each block's first weight; the rest of the block belongs to ra + 1
        bnd = (ra + 1) * KP - fb
        first = i[None, :] < bnd[:, None]
        col = (fb - ra * KP)[:, None] + i[None, :] - tl.where(first, 0, KP)
        row = ra[:, None] + tl.where(first, 0, 1)
        ok = bmask[:, None] & (row >= r0) & (row < r0 + BN) & (row < N) & (col < K)
        xv = tl.load(x_ptr + m * stride_xm + col, mask=ok, other=0.0).to(tl.float32)
        prod = tl.where(ok, wv * xv, 0.0)
        s0 = tl.sum(tl.where(first, prod, 0.0), axis=1)
        s1 = tl.sum(prod, axis=1) - s0
        acc += tl.sum(tl.where(rn[:, None] == ra[None, :], s0[None, :], 0.0), axis=1)
        acc += tl.sum(tl.where(rn[:, None] == ra[None, :] + 1, s1[None, :], 0.0), axis=1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * N + rn, acc.to(tl.bfloat16), mask=nmask)


@triton.jit
def _unpack_kernel(sm_ptr, d1_ptr, table_ptr, ebase_ptr, eoff_ptr, area_ptr, out_ptr, K, KP, TOTAL, NBLK,
                   BB: tl.constexpr):
    b = tl.program_id(0) * BB + tl.arange(0, BB)
    bmask = b < NBLK
    t0 = tl.load(table_ptr).to(tl.int32)
    t1 = tl.load(table_ptr + 1).to(tl.int32)
    t2 = tl.load(table_ptr + 2).to(tl.int32)
    bits = _decode(sm_ptr, d1_ptr, table_ptr, ebase_ptr, eoff_ptr, area_ptr, t0, t1, t2, b, bmask, TOTAL, BB)
    f = b[:, None] * 1024 + tl.arange(0, 1024)[None, :]
    row = f // KP
    col = f - row * KP
    tl.store(out_ptr + row * K + col, (bits >> 16).to(tl.uint16).to(tl.int16, bitcast=True),
             mask=bmask[:, None] & (f < TOTAL) & (col < K))


def _check(p: Packed) -> None:
    if not isinstance(p, Packed) or p.layout != _codec.NAME:
        raise TypeError("packed must be a tiered glyd.Packed")
    n = p.shape[0]
    kp = p.arrays["sm"].shape[1]
    C.check_size("tiered 'sm'", n * kp + BLOCK)
    if p.arrays["area"].numel() >= 2**31:
        raise C.FormatError("tiered 'area' is too large for 32-bit offsets")


def _args(p: Packed):
    a = p.arrays
    return a["sm"], a["d1"], a["table"], a["esc_base"], a["esc_off"], a["area"]


# packed: tiered [N, K] (sm [N, Kp], d1 [N, Kp/4], table [23], esc_base, esc_off, area) -> bf16 [N, K]
def unpack(p: Packed, out: torch.Tensor | None = None, bb: int = 0, warps: int = 4) -> torch.Tensor:
    _check(p)
    n, k = p.shape
    kp = p.arrays["sm"].shape[1]
    nblk = _codec.num_blocks(n, k)
    if out is None:
        out = torch.empty(n, k, dtype=torch.bfloat16, device=p.device)
    elif out.shape != (n, k) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [{n}, {k}] tensor, got {out.dtype} {tuple(out.shape)}")
    if n and k:
        bb, warps = (bb, warps) if bb else (UNPACK_BB, UNPACK_WARPS)
        _unpack_kernel[(triton.cdiv(nblk, bb),)](*_args(p), out.view(torch.int16), k, kp, n * kp, nblk, BB=bb,
                                                  num_warps=warps)
    return out


#: Fused GEMV shape: rows a program, escape blocks a step (``Config.bm`` overrides), warps; and the
#: unpack kernel's blocks a program and warps (see benchmarks/notes-kernels.md).
GEMV_BN, GEMV_BB, GEMV_WARPS = 16, 4, 8
UNPACK_BB, UNPACK_WARPS = 1, 1

#: Largest M the fused tiered GEMV serves by default (one program per activation row: it decodes
#: again for every row); larger M unpack to a scratch buffer and call cuBLAS. 0: measured on the H200,
#: the fused GEMV (193 ms a 7B step at M = 1) lost to unpack + cuBLAS (174 ms), so it runs only
#: when a ``Config`` asks for it.
FUSED_MAX_M = 0


# x: bf16 [..., K]; packed: tiered [N, K]; bias: [N] or None -> bf16 [..., N]
def linear(x: torch.Tensor, p: Packed, bias: torch.Tensor | None = None, config: C.Config | None = None) -> torch.Tensor:
    _check(p)
    n, k = p.shape
    x2 = C.check_x(x, k)
    C.check_device(p, x2)
    bias = C.check_bias(bias, n, x2.device)
    m = x2.shape[0]
    kp = p.arrays["sm"].shape[1]
    C.check_size("output", m * n)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x2.device)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    fused = kp >= BLOCK and (m <= FUSED_MAX_M if config is None else not config.long)
    if not fused:
        w = unpack(p, C.scratch(x2.device, n * k).view(n, k))
        return torch.nn.functional.linear(x2, w, bias).reshape(*x.shape[:-1], n)
    bn = config.bn if config is not None else GEMV_BN
    _gemv_kernel[(triton.cdiv(n, bn), m)](
        x2, *_args(p), bias if bias is not None else out, out,
        n, k, kp, n * kp, _codec.num_blocks(n, k), x2.stride(0),
        BN=bn, BB=config.bm if config is not None else GEMV_BB, HAS_BIAS=bias is not None,
        num_warps=config.warps if config is not None else GEMV_WARPS,
    )
    return out.reshape(*x.shape[:-1], n)
