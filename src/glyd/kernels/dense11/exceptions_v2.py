"""The exception pass of dense11 format versions 2 and 3's fused products (``gemv_v2``, ``gemv_mma``): after the
K loop, the tile's split programs add ``x[col] * (true - placeholder)`` for its rows' exceptions (digit 15 and a
run's escapes of rank 8 and up, which the decode gives the placeholder exponent 0), in rounds shared among them."""

from __future__ import annotations

import triton
import triton.language as tl

from glyd.codec import dense11 as _codec

BLOCK_C = tl.constexpr(_codec.BLOCK)  # what a jit function may read of a global


@triton.jit
def _sm_col(c, KP, V3: tl.constexpr):
    # where column c's sm byte sits in its row: c (version 2), its block-wise place (version 3, a block of rb runs:
    # half h of run j at 1024 b + 16 h rb + 16 j)
    if V3:
        b = c // BLOCK_C
        cc = c - b * BLOCK_C
        j = cc // 32
        t = cc - 32 * j
        rb = tl.minimum(KP // 32 - 32 * b, 32)
        r = b * BLOCK_C + (t // 16) * 16 * rb + 16 * j + (t % 16)
    else:
        r = c
    return r


@triton.jit
def exceptions(acc, rn, rm, mmask, pid_n, N, K, KP, x_ptr, stride_xm, sm_ptr, rowptr_ptr, eidx_ptr, eexp_ptr,
               part, parts, BN: tl.constexpr, MB: tl.constexpr, V3: tl.constexpr = False):
    # acc [MB, BN] + x[col] * (true - placeholder) for the row tile's exceptions (placeholder exponent 0), E a round
    # (one round of dependent loads for all of them; [MB, BN, E] at most 4096), summed onto their rows by a one-hot
    # mask; program `part` of `parts` (the tile's split-K programs) takes rounds part, part + parts, ...
    E: tl.constexpr = 4096 // (BN * MB) if BN * MB < 4096 else 1
    e0 = tl.load(rowptr_ptr + pid_n * BN)
    e1 = tl.load(rowptr_ptr + tl.minimum(pid_n * BN + BN, N))
    for es in range(e0 + part * E, e1, parts * E):
        e = es + tl.arange(0, E)
        em = e < e1
        idx = tl.load(eidx_ptr + e, mask=em, other=0).to(tl.int64)
        r = idx // K
        c = idx - r * K
        sm = tl.load(sm_ptr + r * KP + _sm_col(c, KP, V3), mask=em, other=0).to(tl.int32)
        pv = (((sm & 0x80) << 24) | ((sm & 0x7F) << 16)).to(tl.float32, bitcast=True)
        tv = (((sm & 0x80) << 24) | (tl.load(eexp_ptr + e, mask=em, other=0).to(tl.int32) << 23)
              | ((sm & 0x7F) << 16)).to(tl.float32, bitcast=True)
        xv = tl.load(x_ptr + rm[:, None] * stride_xm + c[None, :], mask=mmask[:, None] & em[None, :],
                     other=0.0).to(tl.float32)  # [MB, E]
        d = xv * tv[None, :] - xv * pv[None, :]
        hit = (rn.to(tl.int64)[:, None] == r[None, :]) & em[None, :]  # [BN, E]
        acc += tl.sum(tl.where(hit[None, :, :], d[:, None, :], 0.0), axis=2)
    return acc
