"""The ``fixed12`` group-major GEMV for 1 to 16 activation rows: a [BN, BK] weight tile decoded once
(SWAR words, ``prmt.b32`` on the GPU) for BM x rows, on the CUDA cores.

``launch_word_tiles`` is the launch it shares with the tensor-core tile (``fixed12.word_dot``), which
loads the same group-major word tiles: split-K, the exception pass (in the tile, or a pass of its
own beside or after it) and the epilogue.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from glyd.kernels import _common as C
from glyd.kernels._fields import check_int, flags, ints
from glyd.kernels._interp import isolated
from glyd.codec.fixed12 import ARRAYS
from glyd.kernels import _plan
from glyd.kernels.fixed12.exceptions import SidePass, exceptions_launch, prepare
from glyd.kernels.fixed12.words import (exception_delta, exception_delta_tile, f32_lane, gm_offsets, gm_planes,
                                        hi_words, x_lane)
from glyd.kernels.registry import Kernel


@dataclasses.dataclass(frozen=True)
class WordTileConfig(C.KernelConfig):
    """Fields of the kernels on group-major word tiles. ``bm`` x rows, ``bn`` weight rows a program,
    K steps of ``bk``; ``prefetch``: the next step's plane words loaded into registers before this
    step decodes; ``exc_pass``: exceptions in a pass of their own over fp32 partials (beside the
    tile kernel on a second CUDA stream, or after it with ``exc_after``) instead of rounds in the
    tile, shared among its split programs; ``fixup``: split-K summed in the kernel (``split_fixup``)."""

    bm: int = 16
    bn: int = 64
    bk: int = 256
    prefetch: bool = False
    exc_pass: bool = False
    exc_after: bool = False
    fixup: bool = False

    def validate(self) -> None:
        C.pow2(self, "bm", "bn", "bk")
        flags(self, "prefetch", "exc_pass", "exc_after", "fixup")
        if self.bk < 64:
            raise ValueError(f"{type(self).__name__}.bk must be >= 64, got {self.bk}")
        if self.exc_after and not self.exc_pass:
            raise ValueError("exc_after (the exception pass after the tile kernel) needs exc_pass")


@dataclasses.dataclass(frozen=True)
class GemvConfig(WordTileConfig):
    """The GEMV: up to 16 x rows a program (one decoded tile serves them all)."""

    bm: int = 1
    bn: int = 16

    def validate(self) -> None:
        super().validate()
        if self.bm > 16:
            raise ValueError(f"the GEMV takes up to 16 x rows a program (GemvConfig.bm), got {self.bm}")


@triton.jit
def _gm_fma(acc, cw, la, lb, b4, x_ptr, x32_ptr, xoff, x32off, mmx, ka0, K, BM: tl.constexpr, EVEN: tl.constexpr,
            PRMT: tl.constexpr):
    # acc += decoded word tile * x, byte lane by byte lane. BM = 1: tiles [G, BN, 8], ka0 [G, 1, 8]
    # (column of each word's byte 0), xoff / x32off the row's offsets (scalars). BM > 1: every
    # tile carries a leading axis ([1, G, BN, 8], ka0 [1, G, 1, 8]), acc is [BM, G, BN, 8] and
    # xoff / x32off are [BM, 1, 1, 1]. (Planes loaded as 3-D tiles and expanded afterwards compile
    # to shared-memory round trips; a 4-D accumulator for one row does too: hence two shapes.)
    ha, hb = hi_words(cw, b4)
    kw = ka0
    if EVEN:
        # a word's 4 columns are contiguous in x: two bf16 pairs a word and half, each pair one
        # 4-byte load (4 loads, where the byte lanes took 8 scalar loads with their own addresses)
        xo = x32off + (kw >> 1)
        xa01 = tl.load(x32_ptr + xo).to(tl.uint32, bitcast=True)
        xa23 = tl.load(x32_ptr + xo + 1).to(tl.uint32, bitcast=True)
        xb01 = tl.load(x32_ptr + xo + 16).to(tl.uint32, bitcast=True)
        xb23 = tl.load(x32_ptr + xo + 17).to(tl.uint32, bitcast=True)
    for t in tl.static_range(4):
        wa = f32_lane(ha, la, t, PRMT)
        wb = f32_lane(hb, lb, t, PRMT)
        if EVEN:
            xa = x_lane(xa01, xa23, t)
            xb = x_lane(xb01, xb23, t)
        else:
            ka = kw + t
            xa = tl.load(x_ptr + xoff + ka, mask=mmx & (ka < K), other=0.0).to(tl.float32)
            xb = tl.load(x_ptr + xoff + ka + 32, mask=mmx & (ka + 32 < K), other=0.0).to(tl.float32)
        acc += wa * xa
        acc += wb * xb
    return acc


@isolated
@triton.jit
def _gemv_gm_kernel(
    x_ptr, x32_ptr, code_ptr, lo_ptr, lo8_ptr, base_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, bias_ptr, out_ptr, fin_ptr,
    cnt_ptr, M, N, K, KP, stride_xm, K_SPLIT, stride_code, stride_lo,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN: tl.constexpr, PREFETCH: tl.constexpr,
    PRMT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr, FIXUP: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    if PDL & 1:  # launched early (config.pdl): nothing read before the previous kernel is done
        C.gdc_wait()
    if PDL & 2:
        C.gdc_launch_dependents()
    # The group-major word-tile GEMV: a [BN, BK] weight tile decoded once for BM x rows. Options for
    # its memory path: EVEN (K == KP, whole steps, x rows 4-byte aligned): no load masks at all
    # (rows past N or M read row N-1 / M-1 again, not stored) and x read as bf16 pairs through
    # x32_ptr; PREFETCH: the next step's plane words are loaded into registers before this step's
    # decode, so a program always has one step of loads in flight (shared-memory pipelining of
    # the same loads measured slower).
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
    kx = gi * 64 + tl.arange(0, 8)[None, None, :] * 4
    rm4 = (tl.minimum(rm, M - 1) if EVEN else rm)[:, None, None, None]
    if BM > 1:
        code_off = code_off[None, :, :, :]
        lo_off = lo_off[None, :, :, :]
        m3 = m3[None, :, :, :]
        gi = gi[None, :, :, :]
        kx = kx[None, :, :, :]
    if BM == 1:
        mmx = pid_m < M
        xoff = pid_m * stride_xm
        x32off = pid_m * (stride_xm // 2)
    else:
        mmx = mmask[:, None, None, None]
        xoff = rm4 * stride_xm
        x32off = rm4 * (stride_xm // 2)
    k0 = pid_k * K_SPLIT
    k1 = tl.minimum(k0 + K_SPLIT, KP)
    if BM == 1:
        acc4 = tl.zeros([G, BN, 8], dtype=tl.float32)
    else:
        acc4 = tl.zeros([BM, G, BN, 8], dtype=tl.float32)
    if PREFETCH:
        cw, la, lb = gm_planes(code_ptr, lo_ptr, code_off, lo_off, k0, m3 & (k0 + gi * 64 < KP), BK, EVEN)
        for kb in range(k0, k1, BK):
            # the last step re-reads its own words (no mask, no branch): they are in L2
            kn = tl.minimum(kb + BK, k1 - BK) if EVEN else kb + BK
            cn, lan, lbn = gm_planes(code_ptr, lo_ptr, code_off, lo_off, kn, m3 & (kn + gi * 64 < k1), BK, EVEN)
            acc4 = _gm_fma(acc4, cw, la, lb, b4, x_ptr, x32_ptr, xoff, x32off, mmx, kb + kx, K, BM, EVEN, PRMT)
            cw = cn
            la = lan
            lb = lbn
    else:
        for kb in range(k0, k1, BK):
            cw, la, lb = gm_planes(code_ptr, lo_ptr, code_off, lo_off, kb, m3 & (kb + gi * 64 < KP), BK, EVEN)
            acc4 = _gm_fma(acc4, cw, la, lb, b4, x_ptr, x32_ptr, xoff, x32off, mmx, kb + kx, K, BM, EVEN, PRMT)
    if BM == 1:
        acc = tl.sum(tl.sum(acc4, axis=2), axis=0)[None, :]
    else:
        acc = tl.sum(tl.sum(acc4, axis=3), axis=1)  # [BM, BN]
    if HAS_EXC:  # each split program its share of the tile's exceptions
        if BM == 1:
            acc += exception_delta(rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, x_ptr + pid_m * stride_xm, rn, base,
                                   pid_n, N, K, KP, BN, pid_k, tl.num_programs(1))[None, :]
        else:
            acc += tl.trans(exception_delta_tile(rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, x_ptr, rn, rm, mmask,
                                                 stride_xm, base, pid_n, N, K, KP, BN, BM, pid_k, tl.num_programs(1)))
    C.store_out(acc, out_ptr, fin_ptr, cnt_ptr, bias_ptr, rm[:, None] * N + rn[None, :],
                mmask[:, None] & nmask[None, :], rn[None, :] + 0 * rm[:, None], pid_m * tl.num_programs(0) + pid_n,
                pid_k, tl.num_programs(1), M * N, PARTIAL, FIXUP, HAS_BIAS)


# x: bf16 [M, K]; packed: fixed12 [N, K]; out: bf16 [M, N] (written) -> out
def launch_word_tiles(x2: torch.Tensor, p, bias, cfg: WordTileConfig, out: torch.Tensor, kernel) -> torch.Tensor:
    """Launch ``kernel`` (the GEMV's or the tensor-core tile's) over group-major word tiles."""
    return plan_word_tiles(x2, p, bias, cfg, kernel)(x2, bias, out, tuple(p.arrays[a] for a in ARRAYS))


# x: bf16 [M, K]; packed: fixed12 [N, K] -> run(x2, bias, out, arrays) (Kernel.plan)
def plan_word_tiles(x2: torch.Tensor, p, bias, cfg: WordTileConfig, kernel):
    """``launch_word_tiles`` worked out once for x like ``x2`` and a bias like ``bias``."""
    m, k = x2.shape
    n = p.shape[0]
    kp = p.arrays["lo"].shape[1]
    prep = prepare(p)
    tc = kernel is not _gemv_gm_kernel
    tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, cfg.bm)
    split, per = C.choose_split(tiles, kp, cfg.bk, x2.device, cfg.split, cfg.waves)
    exc_pass = cfg.exc_pass and prep.nexc > 0  # exceptions in a pass of their own, on fp32 partials
    side = exc_pass and not cfg.exc_after and x2.is_cuda and not C.interpreting()
    partial = split > 1 or exc_pass
    even = k == kp and per % cfg.bk == 0 and kp % cfg.bk == 0
    if not tc:  # the GEMV also reads x as bf16 pairs: 4-byte aligned rows
        even = even and x2.stride(0) % 2 == 0 and x2.data_ptr() % 4 == 0
    fixup = partial and cfg.fixup and not exc_pass
    # per call: x2, bias (or out), dst (the partials, or out), out, then fixed12's arrays
    x, b, dst, o = _plan.slots(4)
    lo, code, base, eidx, ehi = _plan.slots(5, 4, fixed=True)
    cnt = C.counters(x2.device, tiles) if fixup else o
    grid = (triton.cdiv(n, cfg.bn), split, triton.cdiv(m, cfg.bm))
    args = (code.view(torch.int32), lo.view(torch.int32), lo, base, prep.rowptr, eidx, ehi, b, dst, o, cnt,
            m, n, k, kp, x2.stride(0), per, kp // 8, kp // 4)
    meta = dict(BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, EVEN=even, PRMT=not C.interpreting(), HAS_BIAS=bias is not None,
                HAS_EXC=prep.nexc > 0 and not exc_pass, PARTIAL=partial, FIXUP=fixup, PREFETCH=cfg.prefetch,
                num_warps=cfg.warps)
    flags = 0 if side else C.pdl_flags(x2.device, cfg.pdl)  # (a side-stream pass joins by events: plain launches)
    if flags:
        meta.update(PDL=flags, **({"launch_pdl": True} if flags & 1 else {}))
    if tc:  # stages > 1: Triton's software pipelining (async copies through shared memory)
        tile = _plan.Launch(kernel, grid, (x, *args), dict(meta, F32DOT=C.interpreting(), num_stages=cfg.stages))
    else:
        tile = _plan.Launch(kernel, grid, (x, x.view(torch.int32) if even else x, *args), dict(meta, num_stages=1))
    pass_ = SidePass(x2, p, prep) if side else None
    after = exceptions_launch(x2, p, prep) if exc_pass and not side else None
    fin = C.finalize_launch(split + side, m, n, bias is not None, x2.device, cfg.pdl) if partial and not fixup else None
    shape, dev = (split + side, m, n), x2.device

    def run(x2, bias, out, arrays):
        d = torch.empty(shape, dtype=torch.float32, device=dev) if partial else out
        if pass_ is not None:
            cur = pass_.begin(d[split:], x2, *arrays)
        tile(x2, bias if bias is not None else out, d, out, *arrays)
        if pass_ is not None:
            pass_.join(cur)
        elif after is not None:
            after(d, x2, *arrays)
        if fin is not None:
            fin(d, bias if bias is not None else d, out)
        return out

    return run


class GemvKernel(Kernel):
    """The group-major GEMV: any shape, any CUDA GPU (and the interpreter)."""

    name = "fixed12_gemv"
    layout = "fixed12"
    Config = GemvConfig

    @classmethod
    def make_config(cls, spec, problem):
        if spec.get("split") == "k_steps":  # one K step a program: the most programs in flight
            bk = spec.get("bk", GemvConfig.bk)
            check_int("GemvConfig.bk", bk, 1)  # before dividing by it (the config checks the rest)
            spec = {**spec, "split": max(1, -(-problem.kp // bk))}
        return super().make_config(spec, problem)

    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        C.check_launch_shapes(cls.name, x2, tuple(packed.shape), out, bias)  # a direct launch read, wrote past them
        return launch_word_tiles(x2, packed, bias, config, out, _gemv_gm_kernel)

    @classmethod
    def plan(cls, x2, packed, bias, config):
        return plan_word_tiles(x2, packed, bias, config, _gemv_gm_kernel)
