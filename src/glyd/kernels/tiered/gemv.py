"""The fused ``tiered`` GEMV (``tiered_gemv``): each 1024-weight escape block decoded once (the
decode of ``tiered/unpack.py``) and multiplied with up to ``mb`` activation rows."""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from glyd.codec import tiered as _codec
from glyd.kernels import _common as C
from glyd.kernels._fields import flags, ints
from glyd.kernels._interp import isolated
from glyd.kernels.registry import Kernel
from glyd.kernels.tiered.unpack import AREA_REG_BYTES, BLOCK, _args, _decode, _load_blocks, _tables, check


@isolated
@triton.jit(do_not_specialize=["A", "FIT"])
def _gemv_kernel(
    x_ptr, sm_ptr, d1_ptr, table_ptr, ebase_ptr, eoff_ptr, area_ptr, bias_ptr, out_ptr,
    M, N, K, KP, TOTAL, NBLK, A, FIT, stride_xm,
    BN: tl.constexpr, BB: tl.constexpr, MB: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    # One program owns rows [r0, r0 + BN) and activation rows [m0, m0 + MB): it walks the escape
    # blocks that cover its rows (Kp >= 1024: a block holds pieces of at most two rows), BB blocks a
    # step, decodes each once and multiplies it with its MB activation rows.
    pid_n = tl.program_id(0)
    m0 = tl.program_id(1) * MB
    r0 = pid_n * BN
    rn = r0 + tl.arange(0, BN)
    nmask = rn < N
    mi = tl.arange(0, MB)
    TL, TH, T8, T12, T16, T20 = _tables(table_ptr)
    f0 = r0 * KP
    f1 = tl.minimum(r0 + BN, N) * KP
    bend = tl.minimum((f1 + 1023) // 1024, NBLK)
    acc = tl.zeros([MB, BN], dtype=tl.float32)
    u = tl.arange(0, 64)
    j = tl.arange(0, 16)
    for blk0 in range(f0 // 1024, bend, BB):
        b = blk0 + tl.arange(0, BB)
        bmask = b < bend
        fu = b[:, None] * 1024 + u[None, :] * 16
        ur = fu // KP  # row of each unit
        col = fu - ur * KP
        # every unit of a block decodes (the ranks count from the block's start); only this
        # program's rows multiply
        inb = bmask[:, None] & (fu < TOTAL)
        ok = inb & (ur >= r0) & (ur < r0 + BN)
        sm, db, off, ar, aw, fits = _load_blocks(sm_ptr, d1_ptr, ebase_ptr, eoff_ptr, area_ptr, b, bmask, fu, inb, A,
                                                 NBLK, FIT)
        if fits:
            bits = _decode(sm, db, aw, ar, area_ptr, off, A, TL, TH, T8, T12, T16, T20, True)
        else:
            bits = _decode(sm, db, aw, ar, area_ptr, off, A, TL, TH, T8, T12, T16, T20, False)
        wv = bits.to(tl.float32, bitcast=True)
        ra = (b * 1024) // KP  # row of each block's first unit
        first = ur == ra[:, None]
        xc = col[:, :, None] + j[None, None, :]
        xm = ok[:, :, None] & (xc < K)
        for mm in tl.static_range(MB):
            xv = tl.load(x_ptr + (m0 + mm) * stride_xm + xc, mask=xm & (m0 + mm < M), other=0.0).to(tl.float32)
            # masked weights (other rows', padding) may be inf (0 * inf: NaN), and a row's sum taken as the
            # block's total minus the other row's would be inf - inf: each row's units summed on their own
            su = tl.sum(tl.where(xm, wv * xv, 0.0), axis=2)  # [BB, 64]
            s0 = tl.sum(tl.where(first, su, 0.0), axis=1)
            s1 = tl.sum(tl.where(first, 0.0, su), axis=1)
            row = tl.sum(tl.where(rn[:, None] == ra[None, :], s0[None, :], 0.0), axis=1) + \
                tl.sum(tl.where(rn[:, None] == ra[None, :] + 1, s1[None, :], 0.0), axis=1)
            acc += tl.where(mi[:, None] == mm, row[None, :], 0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    mrow = m0 + mi
    tl.store(out_ptr + mrow[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=(mrow < M)[:, None] & nmask[None, :])


@dataclasses.dataclass(frozen=True)
class TieredGemvConfig:
    """``bn`` weight rows and ``bb`` escape blocks a step a program, up to ``mb`` activation rows
    decoded once (more: another program), ``warps``. Measured on the H200 (7B step, M = 1): 2 rows
    and one warp a program fastest (4 rows, or two warps with cross-warp scans, slower)."""

    bn: int = 2
    bb: int = 1
    mb: int = 16
    warps: int = 1
    area_reg_bytes: int = AREA_REG_BYTES

    def __post_init__(self) -> None:
        C.pow2(self, "bn", "bb", "mb", "warps")
        ints(self, 0, AREA_REG_BYTES, "area_reg_bytes")


class TieredGemvKernel(Kernel):
    """The fused tiered GEMV: rows of at least one escape block (Kp >= 1024). The H200 table takes
    it at M = 1 only (unpack + cuBLAS won from M = 2: 37.9 against 43.0 ms a 7B step)."""

    name = "tiered_gemv"
    layout = "tiered"
    Config = TieredGemvConfig

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if ok and problem.kp < BLOCK:
            return False, f"needs rows of at least one escape block (Kp >= {BLOCK}), got Kp = {problem.kp}"
        return ok, why

    # x: bf16 [M, K]; packed: tiered [N, K]; bias: [N] or None; out: bf16 [M, N] (written) -> out
    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        C.check_launch_shapes(cls.name, x2, tuple(packed.shape), out, bias)  # a direct launch read, wrote past them
        p = packed
        check(p)
        m, k = x2.shape
        n = p.shape[0]
        kp = p.arrays["sm"].shape[1]
        if kp < BLOCK:  # can_implement's rule: a direct launch gave a wrong product
            raise ValueError(f"{cls.name} launch: needs rows of at least one escape block (Kp >= {BLOCK}), "
                             f"got Kp = {kp}")
        mb = min(triton.next_power_of_2(m), config.mb)
        _gemv_kernel[(triton.cdiv(n, config.bn), triton.cdiv(m, mb))](
            x2, *_args(p), bias if bias is not None else out, out,
            m, n, k, kp, n * kp, _codec.num_blocks(n, k), p.arrays["area"].numel(), config.area_reg_bytes,
            x2.stride(0), BN=config.bn, BB=config.bb, MB=mb, HAS_BIAS=bias is not None, num_warps=config.warps,
        )
        return out
