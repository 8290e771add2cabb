"""The ``fixed12`` tensor-core tile fed from register loads (``tc``): the GEMV's group-major word
tiles decoded to bf16 in registers, then ``tl.dot`` (Triton passes the decoded tile through shared
memory to the MMA). The tensor-core path for 3 to 64 x rows on GPUs without the Gluon kernels."""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from glyd.kernels import _common as C
from glyd.kernels._fields import flags, ints
from glyd.kernels._interp import isolated
from glyd.kernels.fixed12.gemv import WordTileConfig, launch_word_tiles, plan_word_tiles
from glyd.kernels.fixed12.words import bf16x4, exception_delta_tile, gm_offsets, gm_planes, hi_words
from glyd.kernels.registry import Kernel


@dataclasses.dataclass(frozen=True)
class TcConfig(WordTileConfig):
    """``stages`` > 1: the plane loads pipelined by async copy (not with ``prefetch``)."""

    stages: int = 3

    def validate(self) -> None:
        super().validate()
        if self.bm < 16 or self.bn < 16:
            raise ValueError(f"the tensor-core tile needs bm >= 16 and bn >= 16, got {self}")
        ints(self, 1, None, "stages")
        if self.stages < 1 or (self.prefetch and self.stages > 1):
            raise ValueError("TcConfig takes prefetch (register double buffer) or stages > 1 (pipelining), not both")


@triton.jit
def _tc_step(acc, cw, la, lb, b4, x_ptr, rml, mmask, kk, kb, K, stride_xm, BK: tl.constexpr, BN: tl.constexpr,
             EVEN: tl.constexpr, PRMT: tl.constexpr, F32DOT: tl.constexpr):
    # acc [BM, BN] += x [BM, BK] @ decoded word tile [BK, BN]
    ha, hb = hi_words(cw, b4)
    w = tl.join(bf16x4(la, ha, PRMT), bf16x4(lb, hb, PRMT))  # [G, BN, 8, 4, 2]
    w = tl.reshape(tl.permute(w, (0, 4, 2, 3, 1)), (BK, BN))
    if EVEN:
        xt = tl.load(x_ptr + rml[:, None] * stride_xm + (kb + kk)[None, :])
    else:  # padding columns: x is 0 there (the padded weights are finite)
        xt = tl.load(x_ptr + rml[:, None] * stride_xm + (kb + kk)[None, :],
                     mask=mmask[:, None] & (kb + kk < K)[None, :], other=0.0)
    if F32DOT:  # the interpreter's tl.dot reads bf16 as raw integers
        return tl.dot(xt.to(tl.float32), w.to(tl.float32), acc)
    return tl.dot(xt, w, acc)


@isolated
@triton.jit
def _tc_kernel(
    x_ptr, code_ptr, lo_ptr, lo8_ptr, base_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, bias_ptr, out_ptr, fin_ptr, cnt_ptr,
    M, N, K, KP, stride_xm, K_SPLIT, stride_code, stride_lo,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN: tl.constexpr, PRMT: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr, F32DOT: tl.constexpr, FIXUP: tl.constexpr,
    PREFETCH: tl.constexpr, PDL: tl.constexpr = 0,
):
    if PDL & 1:  # launched early (config.pdl): nothing read before the previous kernel is done
        C.gdc_wait()
    if PDL & 2:
        C.gdc_launch_dependents()
    # out tile [BM, BN] = x [BM, BK] @ W^T [BK, BN], the planes loaded as the GEMV loads them
    # (group-major [G, BN, 8] word tiles, 16-byte loads straight to registers) and decoded to bf16
    # there. The decoded tile is joined and reshaped into natural column order ([G, half, word,
    # lane] = column 64g + 32h + 4w + t), so x loads stay contiguous. Triton 3.6 then stores the
    # decoded tile to shared memory and reads it back as the MMA's B operand (ttgir: local_alloc
    # of the [BK, BN] bf16 tile; 32 KB at bk 256 bn 64), as it must for wgmma (bm 64).
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    G: tl.constexpr = BK // 64
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    rm = pid_m * BM + tl.arange(0, BM)
    mmask = rm < M
    base = tl.load(base_ptr).to(tl.uint32)
    b4 = base * 0x01010101
    code_off, lo_off, m3 = gm_offsets(rn, N, stride_code, stride_lo, G, EVEN)
    gi = tl.arange(0, G)[:, None, None]
    rml = tl.minimum(rm, M - 1) if EVEN else rm
    kk = tl.arange(0, BK)
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(k0 + K_SPLIT, KP)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    if PREFETCH:  # the next step's plane words in flight while this step decodes (as in the GEMV)
        cw, la, lb = gm_planes(code_ptr, lo_ptr, code_off, lo_off, k0, m3 & (k0 + gi * 64 < KP), BK, EVEN)
        for kb in range(k0, k1, BK):
            # the last step re-reads its own words (no mask, no branch): they are in L2
            kn = tl.minimum(kb + BK, k1 - BK) if EVEN else kb + BK
            cn, lan, lbn = gm_planes(code_ptr, lo_ptr, code_off, lo_off, kn, m3 & (kn + gi * 64 < k1), BK, EVEN)
            acc = _tc_step(acc, cw, la, lb, b4, x_ptr, rml, mmask, kk, kb, K, stride_xm, BK, BN, EVEN, PRMT, F32DOT)
            cw = cn
            la = lan
            lb = lbn
    else:
        for kb in range(k0, k1, BK):
            cw, la, lb = gm_planes(code_ptr, lo_ptr, code_off, lo_off, kb, m3 & (kb + gi * 64 < KP), BK, EVEN)
            acc = _tc_step(acc, cw, la, lb, b4, x_ptr, rml, mmask, kk, kb, K, stride_xm, BK, BN, EVEN, PRMT, F32DOT)
    if HAS_EXC:  # each split program its share of the tile's exceptions
        acc += tl.trans(exception_delta_tile(rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, x_ptr, rn, rm, mmask,
                                             stride_xm, base, pid_n, N, K, KP, BN, BM, pid_k, tl.num_programs(1)))
    C.store_out(acc, out_ptr, fin_ptr, cnt_ptr, bias_ptr, rm[:, None] * N + rn[None, :],
                mmask[:, None] & nmask[None, :], rn[None, :] + 0 * rm[:, None], pid_m * tl.num_programs(0) + pid_n,
                pid_k, tl.num_programs(1), M * N, PARTIAL, FIXUP, HAS_BIAS)


class TcKernel(Kernel):
    """The tensor-core tile on word tiles: any shape, any CUDA GPU (and the interpreter)."""

    name = "fixed12_word_dot"
    layout = "fixed12"
    Config = TcConfig

    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        C.check_launch_shapes(cls.name, x2, tuple(packed.shape), out, bias)  # a direct launch read, wrote past them
        return launch_word_tiles(x2, packed, bias, config, out, _tc_kernel)

    @classmethod
    def plan(cls, x2, packed, bias, config):
        return plan_word_tiles(x2, packed, bias, config, _tc_kernel)
