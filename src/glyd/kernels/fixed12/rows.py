"""Rows of a ``fixed12`` matrix by id on the GPU (the packed embedding's lookup): one launch, bit for bit.

The torch twin (``glyd.ops.rows``) takes about thirty small ops a lookup, which a host-bound prefill
pays in full (1.2-1.6 ms a forward of Qwen2.5-0.5B on the H200, against 0.15 for ``nn.Embedding``);
here each program decodes a block of one looked-up row and writes that block's exceptions over it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glyd.codec import fixed12 as _codec
from glyd.codec.packed import Packed
from glyd.kernels import _common as C
from glyd.kernels._interp import isolated
from glyd.kernels.fixed12.exceptions import prepare

G = 16  # 64-weight groups a program (1024 weights: one program a row of a <= 1024-wide embedding)
WARPS = 4


@isolated
@triton.jit
def _rows_kernel(ids_ptr, code_ptr, lo_ptr, base_ptr, rowptr_ptr, epos_ptr, eval_ptr, out_ptr, K, KP,
                 G: tl.constexpr, HAS_EXC: tl.constexpr):
    # out row b = matrix row ids[b], columns [pid_k * 64 G, +64 G); then this block's exceptions
    b = tl.program_id(0).to(tl.int64)
    pid_k = tl.program_id(1)
    r = tl.load(ids_ptr + b).to(tl.int64)
    base = tl.load(base_ptr).to(tl.int32)
    j = tl.arange(0, 32)
    for gi in tl.static_range(G):
        col0 = (pid_k * G + gi) * 64
        m = col0 + j < KP
        c = tl.load(code_ptr + r * (KP // 2) + col0 // 2 + j, mask=m, other=0).to(tl.int32)
        la = tl.load(lo_ptr + r * KP + col0 + j, mask=m, other=0).to(tl.int32)
        lb = tl.load(lo_ptr + r * KP + col0 + 32 + j, mask=m, other=0).to(tl.int32)
        na = c & 0xF
        nb = c >> 4
        va = (((na & 8) << 4) | ((na & 7) + base)) << 8 | la
        vb = (((nb & 8) << 4) | ((nb & 7) + base)) << 8 | lb
        tl.store(out_ptr + b * K + col0 + j, va.to(tl.int16), mask=col0 + j < K)
        tl.store(out_ptr + b * K + col0 + 32 + j, vb.to(tl.int16), mask=col0 + 32 + j < K)
    if HAS_EXC:
        tl.debug_barrier()  # the placeholders above are stored before the exceptions go over them
        lo_col = pid_k * G * 64
        e0 = tl.load(rowptr_ptr + r)
        e1 = tl.load(rowptr_ptr + r + 1)
        for e in range(e0, e1):
            col = tl.load(epos_ptr + e) - r * K
            if (col >= lo_col) & (col < lo_col + G * 64):
                tl.store(out_ptr + b * K + col, tl.load(eval_ptr + e))


# packed: fixed12 [N, K]; ids: int64 [B] (each in [0, N): checked by the caller) -> bf16 [B, K]
def rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of ``p`` as bf16 ``[B, K]``, bit for bit (one launch; the exception index is
    built once a matrix, with a host sync: run a lookup once outside a CUDA graph capture first).

    Example (needs a CUDA GPU)::

        p = glyd.pack(torch.randn(1000, 64).to(torch.bfloat16), "fixed12").to("cuda")
        glyd.kernels.fixed12.rows.rows(p, torch.tensor([3, 3, 999], device="cuda"))  # -> [3, 64]
    """
    if p.layout != _codec.NAME:
        raise ValueError(f"expected a fixed12 packed matrix, got layout {p.layout!r}")
    if ids.dim() != 1 or ids.dtype != torch.int64:
        raise ValueError(f"ids must be a 1-D int64 tensor, got {ids.dim()}-D {ids.dtype}")
    if ids.device != p.device:
        raise ValueError(f"ids are on {ids.device}, the packed matrix on {p.device}")
    n, k = p.shape
    kp = p.arrays["lo"].shape[1]
    C.check_size("fixed12 'lo'", n * kp)
    C.check_size("out", ids.numel() * k)
    out = torch.empty(ids.numel(), k, dtype=torch.int16, device=ids.device)
    if ids.numel() == 0 or k == 0:
        return out.view(torch.bfloat16)
    prep = prepare(p)
    has_exc = prep.nexc > 0
    epos, evals = (prep.pos, prep.vals) if has_exc else (out, out)
    grid = (ids.numel(), triton.cdiv(kp, 64 * G))
    _rows_kernel[grid](ids.contiguous(), p.arrays["code"], p.arrays["lo"], p.arrays["base"], prep.rowptr, epos, evals,
                       out, k, kp, G=G, HAS_EXC=has_exc, num_warps=WARPS)
    return out.view(torch.bfloat16)
