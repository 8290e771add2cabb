"""The general ``fixed12`` tensor-core tile (``tl.dot``) for 65-255 activation rows: byte-lane
decode of [BN, G, 8] word tiles, x loaded per lane, split-K through fp32 partials."""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from glyd.kernels import _common as C
from glyd.kernels._fields import flags, ints
from glyd.kernels._interp import isolated
from glyd.kernels.fixed12.exceptions import prepare
from glyd.kernels.fixed12.words import exception_delta_tile, f32_bits, hi_bytes
from glyd.kernels.registry import Kernel


@dataclasses.dataclass(frozen=True)
class TileConfig(C.KernelConfig):
    """``bm`` x rows and ``bn`` weight rows a program, K steps of ``bk``, ``stages`` of Triton's
    software pipelining; ``fixup``: split-K summed by the last split program (``split_fixup``)."""

    bm: int = 16
    bn: int = 64
    bk: int = 256
    stages: int = 3
    fixup: bool = False

    def validate(self) -> None:
        C.pow2(self, "bm", "bn", "bk")
        flags(self, "fixup")
        ints(self, 1, None, "stages")
        if self.bm < 16 or self.bn < 16 or self.bk < 64 or self.stages < 1:
            raise ValueError(f"TileConfig needs bm >= 16, bn >= 16, bk >= 64 and stages >= 1, got {self}")


@isolated
@triton.jit
def _tile_kernel(
    x_ptr, code_ptr, lo_ptr, lo8_ptr, base_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, bias_ptr, out_ptr, fin_ptr, cnt_ptr,
    M, N, K, KP, stride_xm, K_SPLIT, stride_code, stride_lo,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr, F32DOT: tl.constexpr,
    STAGES: tl.constexpr, FIXUP: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    G: tl.constexpr = BK // 64  # 64-weight groups a step; a group is 8 code words (bytes 4w..4w+3)
    W: tl.constexpr = BK // 8
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    base = tl.load(base_ptr).to(tl.uint32)  # from device memory: no host sync
    b4 = base * 0x01010101
    # 3-D tiles [BN, G, 8] with explicit aranges (no // or %): the compiler sees 8 contiguous
    # words along the last axis and vectorises every plane load to 16 bytes.
    gi = tl.arange(0, G)[None, :, None]
    r3 = rn[:, None, None]
    m3 = nmask[:, None, None]
    wi = tl.arange(0, 8)[None, None, :]
    # Row strides come in as arguments (KP // 8, KP // 4): Triton specialises their divisibility by
    # 16, which proves 16-byte alignment of each row's words.
    code_off = r3 * stride_code + gi * 8 + wi
    lo_off = r3 * stride_lo + gi * 16 + wi
    kx = gi * 64 + wi * 4  # column (within the step) of byte 0 of each word, first half
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(k0 + K_SPLIT, KP)
    rm = pid_m * BM + tl.arange(0, BM)
    mmask = rm < M
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for kb in tl.range(k0, k1, BK, num_stages=STAGES):
        lmask = m3 & (kb + gi * 64 < KP)
        kw = tl.multiple_of(kb // 8, BK // 8)
        kl = tl.multiple_of(kb // 4, BK // 4)
        cw = tl.load(code_ptr + code_off + kw, mask=lmask, other=0).to(tl.uint32, bitcast=True)
        la = tl.load(lo_ptr + lo_off + kl, mask=lmask, other=0).to(tl.uint32, bitcast=True)
        lb = tl.load(lo_ptr + lo_off + (kl + 8), mask=lmask, other=0).to(tl.uint32, bitcast=True)
        ha = hi_bytes(cw & 0x0F0F0F0F, b4)
        hb = hi_bytes((cw >> 4) & 0x0F0F0F0F, b4)
        # Byte lane t of a word is column 4w + t of its half. Each lane multiplies the matching
        # strided x (order within K does not matter): no re-layout of the decoded tile.
        for t in tl.static_range(4):
            wa = f32_bits(ha, la, t).to(tl.float32, bitcast=True)
            wb = f32_bits(hb, lb, t).to(tl.float32, bitcast=True)
            ka = (kb + t + kx).reshape(1, W)
            kb2 = ka + 32
            xa = tl.load(x_ptr + rm[None, :] * stride_xm + ka.reshape(W, 1),
                         mask=mmask[None, :] & (ka.reshape(W, 1) < K), other=0.0)
            xb = tl.load(x_ptr + rm[None, :] * stride_xm + kb2.reshape(W, 1),
                         mask=mmask[None, :] & (kb2.reshape(W, 1) < K), other=0.0)
            wa2 = wa.reshape(BN, W)
            wb2 = wb.reshape(BN, W)
            if F32DOT:  # the interpreter's tl.dot reads bf16 as raw integers
                acc = tl.dot(wa2, xa.to(tl.float32), acc)
                acc = tl.dot(wb2, xb.to(tl.float32), acc)
            else:
                acc = tl.dot(wa2.to(tl.bfloat16), xa, acc)
                acc = tl.dot(wb2.to(tl.bfloat16), xb, acc)
    if HAS_EXC:  # each split program its share of the tile's exceptions
        acc += exception_delta_tile(rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, x_ptr, rn, rm, mmask, stride_xm,
                                    base, pid_n, N, K, KP, BN, BM, pid_k, tl.num_programs(1))
    tile = pid_m * tl.num_programs(0) + pid_n
    C.store_out(acc, out_ptr, fin_ptr, cnt_ptr, bias_ptr, rm[None, :] * N + rn[:, None],
                nmask[:, None] & mmask[None, :], rn[:, None] + 0 * rm[None, :], tile, pid_k, tl.num_programs(1),
                M * N, PARTIAL, FIXUP, HAS_BIAS)


class TileKernel(Kernel):
    """The general tensor-core tile: any shape, any CUDA GPU (and the interpreter)."""

    name = "fixed12_byte_dot"
    layout = "fixed12"
    Config = TileConfig

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
        tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, cfg.bm)
        split, per = C.choose_split(tiles, kp, cfg.bk, x2.device, cfg.split, cfg.waves)
        partial = split > 1
        dst = torch.empty(split, m, n, dtype=torch.float32, device=x2.device) if partial else out
        fixup = partial and cfg.fixup
        cnt = C.counters(x2.device, tiles) if fixup else out
        grid = (triton.cdiv(n, cfg.bn), split, triton.cdiv(m, cfg.bm))
        _tile_kernel[grid](
            x2, a["code"].view(torch.int32), a["lo"].view(torch.int32), a["lo"], a["base"], prep.rowptr,
            a["exc_idx"], a["exc_hi"], bias if bias is not None else out, dst, out, cnt,
            m, n, k, kp, x2.stride(0), per, kp // 8, kp // 4,
            BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, HAS_BIAS=bias is not None, HAS_EXC=prep.nexc > 0, PARTIAL=partial,
            F32DOT=C.interpreting(), STAGES=cfg.stages, FIXUP=fixup, num_warps=cfg.warps, num_stages=cfg.stages,
        )
        if partial and not fixup:
            C.finalize(dst, bias, out, cfg.pdl)
        return out
