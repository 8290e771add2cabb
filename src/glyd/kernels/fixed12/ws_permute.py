"""x permuted for the ws tile (``fixed12.wgmma_warpspec``): each 128-column K step's columns in the wgmma slot
order (``fixed12.wgmma.X_ORDER``), since a TMA copy cannot permute columns; and, where the tile's exceptions read x's
columns, x transposed from the same load. A small Triton kernel and its torch twin."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glyd.kernels import _common as C
from glyd.kernels import _plan
from glyd.kernels._interp import isolated
from glyd.kernels.fixed12.wgmma import X_ORDER

BK = 128  # columns a K step: 32 lo words and 16 code words a row, two 64-column x boxes


@isolated
@triton.jit
def _permute_x_kernel(x_ptr, out_ptr, xt_ptr, M, stride_xm, K: tl.constexpr, BM: tl.constexpr,
                      XT: tl.constexpr = False):
    # out[m, 128 s + slot] = x[m, 128 s + col(slot)]: slot bits (hh i1 i0 h g a j), high to low,
    # are column bits (g hh a i1 i0 h j); a program does BM rows of one 128-column step. XT: also
    # xt[c, m] = x[m, c] (the exceptions' x, [K, M]) from the same load: one read of x for both
    rows = tl.program_id(0) * BM + tl.arange(0, BM)[:, None]
    slot = tl.arange(0, 128)[None, :]
    col = (((slot >> 2) & 1) << 6 | ((slot >> 6) & 1) << 5 | ((slot >> 1) & 1) << 4 | ((slot >> 5) & 1) << 3
           | ((slot >> 4) & 1) << 2 | ((slot >> 3) & 1) << 1 | (slot & 1))
    c0 = tl.program_id(1) * 128
    v = tl.load(x_ptr + rows.to(tl.int64) * stride_xm + c0 + col, mask=rows < M)
    tl.store(out_ptr + rows.to(tl.int64) * K + c0 + slot, v, mask=rows < M)
    if XT:  # transposed in registers, so that a column's rows are stored together
        rt = tl.trans(rows)
        tl.store(xt_ptr + (c0 + tl.trans(col)).to(tl.int64) * M + rt, tl.trans(v), mask=rt < M)


# x: bf16 [M, K] -> bf16 [M, K], each 128-column step's columns in wgmma slot order
def permute_x_torch(x2: torch.Tensor) -> torch.Tensor:
    """x with each 128-column K step in the MMA's slot order (``fixed12.wgmma.X_ORDER``), contiguous
    (the torch twin of ``permute_x``)."""
    m, k = x2.shape
    if k % BK:
        raise ValueError(f"permute_x needs K a multiple of {BK}, got {k}")
    order = [0, 1] + [d + 1 for d in X_ORDER.value[1:]]
    return x2.reshape(m, k // BK, 2, 2, 2, 2, 2, 2, 2).permute(order).reshape(m, k)


# x: bf16 [M, K] (unit column stride), K a multiple of 128 -> bf16 [M, K], contiguous
def permute_x(x2: torch.Tensor) -> torch.Tensor:
    """``permute_x_torch`` as one small Triton kernel (CUDA; the torch twin elsewhere, which took
    3.9-5.4 us at M = 16-64 on the H200)."""
    m, k = x2.shape
    if k % BK:
        raise ValueError(f"permute_x needs K a multiple of {BK}, got {k}")
    if x2.device.type != "cuda" or C.interpreting() or x2.stride(1) != 1:
        return permute_x_torch(x2)
    out = torch.empty(m, k, dtype=x2.dtype, device=x2.device)
    _permute_launch(m, k, x2.stride(0))(x2, out)
    return out


# x: bf16 [M, K] (these strides) -> launch(x2, out) or, with xt, launch(x2, out, xt) (xt: bf16 [K, M], x transposed)
def _permute_launch(m: int, k: int, stride: int, xt: bool = False):
    # 16 rows a program at every M (64 rows took 3x as long at M = 64)
    x, out, t = _plan.slots(3)
    return _plan.Launch(_permute_x_kernel, (triton.cdiv(m, 16), k // BK), (x, out, t if xt else None, m, stride),
                        dict(K=k, BM=16, XT=xt, num_warps=4))
