"""The ``fixed12`` tensor-core tile on byte tiles (``mma``): the raw planes reach the MMA operand
registers from shared memory and are decoded there (no decoded tile in shared memory). Chosen
for the lm_heads at 17-32 x rows on GPUs without the Gluon kernels."""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from glyd.kernels import _common as C
from glyd.kernels._fields import flags, ints
from glyd.kernels._interp import isolated
from glyd.kernels.fixed12.exceptions import prepare
from glyd.kernels.fixed12.words import exception_delta_tile
from glyd.kernels.registry import Kernel


@dataclasses.dataclass(frozen=True)
class MmaConfig(C.KernelConfig):
    """``bm`` x rows, ``bn`` weight rows a program, ``g`` 64-weight groups a K step (fewer where
    the row's groups are not a multiple), ``stages`` of the async-copy pipeline, ``fixup``."""

    bm: int = 16
    bn: int = 64
    g: int = 4
    stages: int = 3
    fixup: bool = False

    def validate(self) -> None:
        C.pow2(self, "bm", "bn", "g")
        flags(self, "fixup")
        ints(self, 1, None, "stages")
        if self.bm < 16 or self.bn < 16 or self.stages < 1:
            raise ValueError(f"MmaConfig needs bm >= 16, bn >= 16 and stages >= 1, got {self}")


@isolated
@triton.jit
def _mma_kernel(
    x_ptr, code_ptr, lo_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, bias_ptr, out_ptr, fin_ptr, cnt_ptr,
    M, N, K, KP, stride_xm, K_SPLIT, stride_code, stride_lo,
    BASE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, EVEN: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr, F32DOT: tl.constexpr,
    FIXUP: tl.constexpr,
):
    # out^T tile [BN, BM] = W tile [BN, 32] @ x^T [32, BM], twice a 64-weight group (its two
    # halves share the code bytes). The weights are the MMA's A operand: Triton keeps A in
    # registers, and because the decode is element-wise from the loads with only constants in it,
    # it moves the layout change onto the shared-memory read of the raw planes (the pipeliner
    # streams them in by async copy). BASE is a compile-time constant for that reason: a runtime
    # base (even a scalar argument) stops that move, and the decoded tile then takes a round trip
    # through shared memory with barriers.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rn = pid_n * BN + tl.arange(0, BN)
    rm = pid_m * BM + tl.arange(0, BM)
    # Out-of-range rows read row N-1 / M-1 again (no load masks); their results are not stored.
    rnl = tl.minimum(rn, N - 1)
    rml = tl.minimum(rm, M - 1)
    j = tl.arange(0, 32)
    code_off = rnl[:, None] * stride_code + j[None, :]
    lo_off = rnl[:, None] * stride_lo + j[None, :]
    x_off = rml[None, :] * stride_xm + j[:, None]
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(k0 + K_SPLIT, KP)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for kb in range(k0, k1, 64 * G):
        for g in tl.static_range(G):
            kg = kb + 64 * g
            c = tl.load(code_ptr + code_off + kg // 2).to(tl.uint16)
            la = tl.load(lo_ptr + lo_off + kg).to(tl.uint16)
            lb = tl.load(lo_ptr + lo_off + kg + 32).to(tl.uint16)
            if EVEN:
                xa = tl.load(x_ptr + x_off + kg)
                xb = tl.load(x_ptr + x_off + kg + 32)
            else:  # padding columns: x is 0 there (the padded weights are finite)
                xa = tl.load(x_ptr + x_off + kg, mask=(kg + j < K)[:, None], other=0.0)
                xb = tl.load(x_ptr + x_off + kg + 32, mask=(kg + 32 + j < K)[:, None], other=0.0)
            # bf16 bits: sign = code bit 3 (7), exponent >> 1 = code bits 0-2 (4-6) + BASE, low byte = lo
            wa = ((((c & 8) << 12) | (((c & 7) + BASE) << 8)) | la).to(tl.bfloat16, bitcast=True)
            wb = ((((c & 0x80) << 8) | ((((c >> 4) & 7) + BASE) << 8)) | lb).to(tl.bfloat16, bitcast=True)
            if F32DOT:  # the interpreter's tl.dot reads bf16 as raw integers
                acc = tl.dot(wa.to(tl.float32), xa.to(tl.float32), acc)
                acc = tl.dot(wb.to(tl.float32), xb.to(tl.float32), acc)
            else:
                acc = tl.dot(wa, xa, acc)
                acc = tl.dot(wb, xb, acc)
    mmask = rm < M
    nmask = rn < N
    if HAS_EXC:  # each split program its share of the tile's exceptions
        acc += exception_delta_tile(rowptr_ptr, eidx_ptr, ehi_ptr, lo_ptr, x_ptr, rn, rm, mmask, stride_xm,
                                    BASE, pid_n, N, K, stride_lo, BN, BM, pid_k, tl.num_programs(1))
    omask = nmask[:, None] & mmask[None, :]
    C.store_out(acc, out_ptr, fin_ptr, cnt_ptr, bias_ptr, rm[None, :] * N + rn[:, None], omask,
                rn[:, None] + 0 * rm[None, :], pid_m * tl.num_programs(0) + pid_n, pid_k, tl.num_programs(1), M * N,
                PARTIAL, FIXUP, HAS_BIAS)


class MmaKernel(Kernel):
    """The byte-tile tensor-core kernel: any shape, any CUDA GPU (and the interpreter)."""

    name = "fixed12_operand_dot"
    layout = "fixed12"
    Config = MmaConfig

    # x: bf16 [M, K]; packed: fixed12 [N, K]; bias: [N] or None; out: bf16 [M, N] (written) -> out
    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        C.check_launch_shapes(cls.name, x2, tuple(packed.shape), out, bias)  # a direct launch read, wrote past them
        cfg = config
        m, k = x2.shape
        n = packed.shape[0]
        a = packed.arrays
        kp = a["lo"].shape[1]
        prep = prepare(packed)
        g = cfg.g
        while (kp // 64) % g:  # whole steps only: a split never reads past the row's padding
            g //= 2
        step = 64 * g
        tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, cfg.bm)
        split, per = C.choose_split(tiles, kp, step, x2.device, cfg.split, cfg.waves)
        partial = split > 1
        dst = torch.empty(split, m, n, dtype=torch.float32, device=x2.device) if partial else out
        fixup = partial and cfg.fixup
        cnt = C.counters(x2.device, tiles) if fixup else out
        grid = (triton.cdiv(n, cfg.bn), split, triton.cdiv(m, cfg.bm))
        _mma_kernel[grid](
            x2, a["code"], a["lo"], prep.rowptr, a["exc_idx"], a["exc_hi"], bias if bias is not None else out, dst,
            out, cnt,
            m, n, k, kp, x2.stride(0), per, kp // 2, kp,
            BASE=prep.base, BM=cfg.bm, BN=cfg.bn, G=g, EVEN=k == kp, HAS_BIAS=bias is not None,
            HAS_EXC=prep.nexc > 0, PARTIAL=partial, F32DOT=C.interpreting(), FIXUP=fixup, num_warps=cfg.warps,
            num_stages=cfg.stages,
        )
        if partial and not fixup:
            C.finalize(dst, bias, out, cfg.pdl)
        return out
