"""A kernel that runs ``glyd.kernels.dense11.gemv_v2.row_sum`` alone (``test_dense11_v2_kernels.py``; a module
of its own, not a test module, so ``benchmarks/compile_sm90.py`` compiles it for sm_90 too)."""

from __future__ import annotations

import triton
import triton.language as tl

from glyd.kernels._interp import isolated
from glyd.kernels.dense11.gemv_v2 import row_sum


# in: fp32 [BN, W, 4] (contiguous); out: fp32 [1, BN] (written)
@isolated
@triton.jit
def row_sum_kernel(in_ptr, out_ptr, BN: tl.constexpr, W: tl.constexpr):
    i = tl.arange(0, BN)[:, None, None] * (4 * W) + tl.arange(0, W)[None, :, None] * 4 + tl.arange(0, 4)[None, None, :]
    tl.store(out_ptr + tl.arange(0, BN)[None, :], row_sum(tl.load(in_ptr + i), BN, W))
