"""Research (issue 38, 2026-12-03): prompts on ``fixed12`` (M >= 65) as one fused product that decodes each packed [BN, BK] tile in
registers and multiplies it on the tensor cores (``tl.dot``), for every M tile that needs it.

The unpack + cuBLAS path (``fixed12_unpack_cublas``) writes 16 bits a weight and reads them back, so it can
never beat bf16; the small-M tiles split K and re-read x per byte lane. Here a program owns a
[BM, BN] output tile and walks all of K: the plane bytes are loaded in natural column order (a
code byte holds columns j and j + 32 of its 64-column group, so its address is ``(c // 64) * 32 +
c % 32`` and its nibble ``(c // 32) & 1``), decoded to bf16 and fed to ``tl.dot`` with Triton's
software pipeline loading the next steps. Programs run M tiles fastest, so a weight tile is read
from DRAM once and from L2 by the other M tiles, and x stays in L2.

``swap``: the decoded weights are the first dot operand (wgmma's register A operand on Hopper),
x^T the second; else x first and the decoded tile transposed second.

Exceptions (weights outside the window) are not in the tile: ``fixed12_exc.add_exceptions`` writes
their corrections to an fp32 partial that is added to the bf16 output (one more rounding). That pass
re-walks a row's exceptions for every 16 x rows: at M = 2048 it took 2.6 ms on one gate_up, twice the
product's own 1.34 ms (Nsight Compute, H200): a long-M kernel needs its exceptions in the tile.

Measured on the H200 (2026-12-03, ``probe_prefill.py``): 3.0-10x bf16 at M = 65-4608, against unpack
+ cuBLAS's 1.1-2.6x; the product alone (ncu, gate_up at M = 2048, bm 256, bn 128) 1.93x cuBLAS,
tensor pipe 43% busy, issue slots 37% busy, 236 registers (one 8-warp program an SM): latency-bound.
Kept as a probe, not in ``src/``, until a version beats unpack + cuBLAS.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from glyd.kernels import _common as C
from glyd.kernels._interp import isolated
from glyd.kernels.fixed12.exceptions import add_exceptions, prepare


@dataclasses.dataclass(frozen=True)
class PrefillConfig(C.KernelConfig):
    """``bm`` x rows and ``bn`` weight rows a program, K steps of ``bk`` (64 or 128), ``stages`` of
    Triton's software pipeline, ``swap``: weights as the first dot operand."""

    bm: int = 128
    bn: int = 128
    bk: int = 64
    stages: int = 3
    swap: bool = True

    def validate(self) -> None:
        C.pow2(self, "bm", "bn", "bk")
        if self.bm < 16 or self.bn < 16 or self.bk not in (64, 128) or self.stages < 1:
            raise ValueError(f"PrefillConfig needs bm >= 16, bn >= 16, bk 64 or 128, stages >= 1; got {self}")


@isolated
@triton.jit
def _prefill_kernel(
    x_ptr, lo_ptr, code_ptr, base_ptr, bias_ptr, out_ptr, M, N, K, KP, stride_xm,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SWAP: tl.constexpr, EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, F32DOT: tl.constexpr, STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    npm = tl.cdiv(M, BM)
    pid_m = pid % npm  # M tiles fastest: a weight tile is decoded by consecutive programs (L2)
    pid_n = pid // npm
    rn = pid_n * BN + tl.arange(0, BN)
    rm = pid_m * BM + tl.arange(0, BM)
    # Rows past the end read the last row (never stored): no masks on the plane loads.
    rn_c = tl.minimum(rn, N - 1).to(tl.int64)
    rm_c = tl.minimum(rm, M - 1).to(tl.int64)
    ck = tl.arange(0, BK)
    coff = (ck // 64) * 32 + (ck % 32)  # the code byte of column ck (natural order)
    csh = ((ck // 32) % 2) * 4  # its nibble
    base = tl.load(base_ptr).to(tl.int32)
    lo_p = lo_ptr + rn_c[:, None] * KP + ck[None, :]
    co_p = code_ptr + rn_c[:, None] * (KP // 2) + coff[None, :]
    if SWAP:  # x^T [BK, BM] loaded as the dot wants it (a tl.trans between load and dot stops the pipeline)
        x_p = x_ptr + rm_c[None, :] * stride_xm + ck[:, None]
    else:
        x_p = x_ptr + rm_c[:, None] * stride_xm + ck[None, :]
    if SWAP:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    for kb in tl.range(0, KP, BK, num_stages=STAGES):
        if EVEN_K:  # K a multiple of BK: no masks (a masked x load is not pipelined by Triton 3.6)
            lo = tl.load(lo_p + kb)
            cb = tl.load(co_p + kb // 2)
            xk = tl.load(x_p + kb)  # [BK, BM] (SWAP) or [BM, BK]
        else:  # x past K reads 0 (the padding's weights are finite); the plane past KP reads 0
            pm = (kb + ck < KP)[None, :]
            lo = tl.load(lo_p + kb, mask=pm, other=0)
            cb = tl.load(co_p + kb // 2, mask=pm, other=0)
            if SWAP:
                xk = tl.load(x_p + kb, mask=(kb + ck < K)[:, None], other=0.0)
            else:
                xk = tl.load(x_p + kb, mask=(kb + ck < K)[None, :], other=0.0)
        nib = (cb.to(tl.int32) >> csh[None, :]) & 15
        hi = ((nib & 8) << 4) | ((nib & 7) + base)
        w = ((hi << 8) | lo.to(tl.int32)).to(tl.int16).to(tl.bfloat16, bitcast=True)  # [BN, BK]
        if F32DOT:  # the interpreter's tl.dot reads bf16 as raw integers
            w = w.to(tl.float32)
            xk = xk.to(tl.float32)
        if SWAP:
            acc = tl.dot(w, xk, acc)
        else:
            acc = tl.dot(xk, tl.trans(w), acc)
    if SWAP:
        optr = rm[None, :] * N + rn[:, None]
        omask = (rm < M)[None, :] & (rn < N)[:, None]
        boff = rn[:, None] + 0 * rm[None, :]
    else:
        optr = rm[:, None] * N + rn[None, :]
        omask = (rm < M)[:, None] & (rn < N)[None, :]
        boff = rn[None, :] + 0 * rm[:, None]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + boff, mask=omask, other=0.0).to(tl.float32)
    tl.store(out_ptr + optr, acc.to(tl.bfloat16), mask=omask)


# x: bf16 [M, K]; packed: fixed12 [N, K]; bias: [N] or None -> bf16 [M, N]
def linear(x2: torch.Tensor, packed, bias, cfg: PrefillConfig) -> torch.Tensor:
    """``x2 @ W^T (+ bias)`` through the probe kernel (CUDA, or the interpreter)."""
    m, k = x2.shape
    n = packed.shape[0]
    if x2.dtype != torch.bfloat16 or x2.dim() != 2 or x2.stride(1) != 1 or k != packed.shape[1]:
        raise ValueError(f"x must be a bf16 [M, {packed.shape[1]}] matrix with unit stride, got {x2.dtype} {tuple(x2.shape)}")
    a = packed.arrays
    kp = a["lo"].shape[1]
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x2.device)
    prep = prepare(packed)
    grid = (triton.cdiv(m, cfg.bm) * triton.cdiv(n, cfg.bn),)
    _prefill_kernel[grid](
        x2, a["lo"], a["code"], a["base"], bias if bias is not None else out, out,
        m, n, k, kp, x2.stride(0),
        BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, SWAP=cfg.swap, EVEN_K=k % cfg.bk == 0, HAS_BIAS=bias is not None,
        F32DOT=C.interpreting(), STAGES=cfg.stages, num_warps=cfg.warps, num_stages=cfg.stages,
    )
    if prep.nexc:
        own = torch.zeros(1, m, n, dtype=torch.float32, device=x2.device)
        add_exceptions(own, x2, packed, prep, add=False)
        out = (out.float() + own[0]).to(torch.bfloat16)
    return out
