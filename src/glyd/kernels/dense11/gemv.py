"""The fused ``dense11`` GEMV (``dense11_gemv``) for 1-16 x rows a program: each tile decoded once
(the decode of ``dense11/unpack.py``), exceptions added after the tiles."""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from glyd.codec import dense11 as _codec
from glyd.kernels import _common as C
from glyd.kernels._interp import isolated
from glyd.kernels.dense11.unpack import BLOCK, _args, _block_start, _decode, _tables, prepare
from glyd.kernels.registry import Kernel


@isolated
@triton.jit
def _gemv_kernel(
    x_ptr, sm_ptr, code_ptr, base_ptr, etab_ptr, esc_ptr, ebase_ptr, eoff_ptr, rowptr_ptr, eidx_ptr, eexp_ptr,
    bias_ptr, out_ptr, M, N, K, KP, NBR, NESC, K_SPLIT, stride_xm,
    BN: tl.constexpr, BK: tl.constexpr, MB: tl.constexpr, HW_POPC: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr,
):
    # Rows [pid_n * BN, +BN) x columns [pid_k * K_SPLIT, +K_SPLIT) (K_SPLIT a multiple of 1024: a
    # split starts on a block) for x rows [pid_m * MB, +MB): each tile decoded once for MB rows.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    rm = pid_m * MB + tl.arange(0, MB)
    mmask = rm < M
    base = tl.load(base_ptr).to(tl.int32)
    T0, T1, T2, T3 = _tables(etab_ptr)
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(k0 + K_SPLIT, KP)
    kk = tl.arange(0, BK)
    acc = tl.zeros([MB, BN], dtype=tl.float32)
    run = tl.zeros([BN], dtype=tl.int32)
    for kb in range(k0, k1, BK):
        new = kb % 1024 == 0
        start = _block_start(ebase_ptr, eoff_ptr, rn * NBR + kb // 1024, nmask & new)
        run = tl.where(new, start, run)
        bits, n_esc = _decode(sm_ptr, code_ptr, esc_ptr, rn, nmask, kb, KP, run, base, T0, T1, T2, T3, NESC,
                              BN, BK, HW_POPC)
        run += n_esc
        wv = bits.to(tl.float32, bitcast=True)
        xc = kb + kk
        xv = tl.load(x_ptr + rm[:, None] * stride_xm + xc[None, :], mask=mmask[:, None] & (xc < K)[None, :],
                     other=0.0).to(tl.float32)
        acc += tl.sum(wv[None, :, :] * xv[:, None, :], axis=2)
    if HAS_EXC:
        if pid_k == 0:  # exceptions: x[col] * (true - placeholder), placeholder exponent 0
            e0 = tl.load(rowptr_ptr + pid_n * BN)
            e1 = tl.load(rowptr_ptr + tl.minimum(pid_n * BN + BN, N))
            for e in range(e0, e1):
                idx = tl.load(eidx_ptr + e).to(tl.int64)
                r = idx // K
                c = idx - r * K
                sm = tl.load(sm_ptr + r * KP + c).to(tl.int32)
                pv = (((sm & 0x80) << 24) | ((sm & 0x7F) << 16)).to(tl.float32, bitcast=True)
                tv = (((sm & 0x80) << 24) | (tl.load(eexp_ptr + e).to(tl.int32) << 23)
                      | ((sm & 0x7F) << 16)).to(tl.float32, bitcast=True)
                xv = tl.load(x_ptr + rm * stride_xm + c, mask=mmask, other=0.0).to(tl.float32)
                acc += tl.where((rn.to(tl.int64) == r)[None, :], (xv * tv - xv * pv)[:, None], 0.0)
    optr = rm[:, None] * N + rn[None, :]
    omask = mmask[:, None] & nmask[None, :]
    if PARTIAL:
        tl.store(out_ptr + pid_k * M * N + optr, acc, mask=omask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + optr, acc.to(tl.bfloat16), mask=omask)


@dataclasses.dataclass(frozen=True)
class Dense11GemvConfig:
    """``bn`` weight rows a program, ``bk`` columns a step (dividing 1024), up to ``mb`` x rows
    decoded once (more: another program), ``split`` K splits of whole 1024-column blocks (0: one
    split a block when the row tiles alone would leave the GPU's SMs idle), ``warps``."""

    bn: int = 16
    bk: int = 256
    mb: int = 16
    split: int = 0
    warps: int = 4

    def __post_init__(self) -> None:
        C.pow2(self, "bn", "bk", "mb", "warps")
        if not 64 <= self.bk <= BLOCK or self.mb > 16:
            raise ValueError(f"bk must be 64-{BLOCK} and mb at most 16, got bk={self.bk}, mb={self.mb}")
        if not isinstance(self.split, int) or self.split < 0:
            raise ValueError(f"split must be an int >= 0, got {self.split!r}")


class Dense11GemvKernel(Kernel):
    """The fused dense11 GEMV: any shape, 1-16 x rows a program (any M: more programs)."""

    name = "dense11_gemv"
    layout = "dense11"
    Config = Dense11GemvConfig

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if ok and problem.version != 1:  # bit planes only: version 2 has its own kernels
            return False, f"{cls.name} decodes dense11 format version 1, not {problem.version}"
        return ok, why

    # x: bf16 [M, K]; packed: dense11 [N, K]; bias: [N] or None; out: bf16 [M, N] (written) -> out
    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        p = packed
        C.check_launch_shapes(cls.name, x2, p.shape, out, bias)  # (K = 0 and M = 0 divided by zero choosing the grid)
        prep = prepare(p)
        m, k = x2.shape
        n = p.shape[0]
        kp = p.arrays["sm"].shape[1]
        if x2.dtype != torch.bfloat16 or x2.stride(1) != 1:
            raise ValueError(f"x must be bf16 with unit stride along K, got {x2.dtype}, strides {x2.stride()}")
        if out.shape != (m, n) or out.dtype != torch.bfloat16:
            raise ValueError(f"out must be bf16 [{m}, {n}], got {out.dtype} {tuple(out.shape)}")
        nbr = _codec.blocks_per_row(k)
        mb = min(triton.next_power_of_2(m), config.mb)
        tiles = triton.cdiv(n, config.bn) * triton.cdiv(m, mb)
        split = config.split or (nbr if tiles < 2 * C.sm_count(x2.device) else 1)
        split = max(1, min(split, nbr))
        per = triton.cdiv(nbr, split) * BLOCK
        split = triton.cdiv(kp, per)
        dst = torch.empty(split, m, n, dtype=torch.float32, device=x2.device) if split > 1 else out
        a = p.arrays
        _gemv_kernel[(triton.cdiv(n, config.bn), split, triton.cdiv(m, mb))](
            x2, *_args(p), prep.rowptr, a["exc_idx"], a["exc_exp"], bias if bias is not None else out, dst,
            m, n, k, kp, nbr, prep.nesc, per, x2.stride(0),
            BN=config.bn, BK=min(config.bk, triton.next_power_of_2(kp)), MB=mb, HW_POPC=not C.interpreting(), HAS_BIAS=bias is not None,
            HAS_EXC=prep.nexc > 0, PARTIAL=split > 1, num_warps=config.warps,
        )
        if split > 1:
            C.finalize(dst, bias, out)
        return out
