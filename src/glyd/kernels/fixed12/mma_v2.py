"""fixed12 decode-step product with explicit register layouts (Triton's Gluon; CUDA GPUs only).

The ``tc`` kernel lets Triton choose layouts, and Triton 3.6 moves its decoded weight tile through
shared memory into the tensor cores' B operand. Here every layout is given: the plane words are
loaded in exactly the layout whose decoded bf16 lanes *are* the MMA v2 B operand (``k_width`` 4:
four consecutive k of one weight row a thread, which is one plane word's four lanes), so the tile
never leaves registers. The MMA's k order is a fixed permutation of the columns (bits 2-3 and 4-5 of
the column index swapped) chosen so that each thread's words and x values are 16 contiguous bytes;
x is loaded with the same permutation, which leaves the product unchanged. Gluon does not pipeline
loops, so ``GluonConfig.prefetch`` loads the next step's words and x rows before this step decodes.
bm 32 and 64 share one decoded tile among 2 or 4 x tiles, with the x tiles in the async-copy ring
(``ring_x``). Its twin for tests and the interpreter is ``tc`` (Gluon has no interpreter);
``benchmarks/sass_count.py`` counts its loop's instructions.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from glyd.codec.fixed12 import ARRAYS
from glyd.kernels import _common as C
from glyd.kernels._fields import flags, ints
from glyd.kernels import _plan
from glyd.kernels._gluon_bits import gdc_launch_dependents, gdc_wait, prmt, split16
from glyd.kernels.fixed12.exceptions import SidePass, exceptions_launch, prepare
from glyd.kernels.fixed12.mma_v2_parts import EXC_E, epilogue, exc_layouts, exc_preload, exc_rows_t, exc_tiles
from glyd.kernels.registry import Kernel

BM = 16  # x rows of one MMA tile; a program takes 1, 2 or 4 of them (GluonConfig.bm 16, 32, 64)
WARPS = 4  # default warps, side by side along N (GluonConfig.warps 1, 2 or 4)


@dataclasses.dataclass(frozen=True)
class GluonConfig(C.KernelConfig):
    """``bm`` (16, 32, 64) x rows, ``bn`` weight rows a program, K steps of ``bk`` (K a multiple of
    it), ``warps`` (1, 2, 4) side by side along N. ``prefetch``: the next step's plane words and x
    rows loaded before this step decodes (``prefetch_depth`` steps ahead: 2 applies with one x tile);
    ``ring`` > 1 brings the plane words by 16-byte async copies through a shared-memory ring of that
    many K steps instead of registers, ``ring_x`` puts the x rows in it too. ``exc_tile``: each
    tile's exceptions added in rounds shared among its split programs: one of 16 loaded before the K loop, then
    rounds of ``exc_chunk`` (16, 32 or 64) after it (else a pass of its own, beside the kernel on a second stream or
    after it with ``exc_after``); ``exc_rows`` (with ``exc_tile``): none loaded before the K loop and no one-hot MMA,
    but the threads holding each weight row in the accumulators add its exceptions with fp32 FMAs after it, the j-th
    of every row at once (``WsConfig.exc_rows``). ``x_ahead`` False loads
    each step's x rows in that step (frees the registers of a second x tile); ``x_rows8`` (bm 16):
    at M <= 8 only x rows 0-7 are loaded. ``maxnreg``: a register cap a thread (0: the compiler's).
    ``fixup``: split-K summed in the kernel."""

    bm: int = 16
    bn: int = 64
    bk: int = 128
    prefetch: bool = False
    prefetch_depth: int = 1
    ring: int = 1
    ring_x: bool = False
    exc_tile: bool = False
    exc_after: bool = False
    x_ahead: bool = True
    x_rows8: bool = False
    maxnreg: int = 0
    fixup: bool = False
    exc_chunk: int = 16
    exc_rows: bool = False

    def validate(self) -> None:
        C.pow2(self, "bm", "bn", "bk")
        ints(self, 16, 64, "exc_chunk")
        if self.exc_chunk not in (16, 32, 64):
            raise ValueError(f"GluonConfig.exc_chunk must be 16, 32 or 64, got {self.exc_chunk}")
        flags(self, "prefetch", "ring_x", "exc_tile", "exc_after", "x_ahead", "x_rows8", "fixup", "exc_rows")
        ints(self, 1, None, "ring")
        ints(self, 1, 2, "prefetch_depth")
        ints(self, 0, 255, "maxnreg")
        if self.bm not in (16, 32, 64) or self.warps not in (1, 2, 4) or self.bn < max(16, 8 * self.warps) \
                or self.bk < 64:
            raise ValueError("GluonConfig: bm 16, 32 or 64, 1, 2 or 4 warps, bn >= 16 and >= 8 a warp, bk >= 64; "
                             f"got {self}")
        if self.ring < 1 or (self.ring > 1 and not self.prefetch):
            raise ValueError(f"GluonConfig.ring > 1 (async-copy ring) needs prefetch, got ring = {self.ring}")
        if self.ring_x and self.ring < 2:
            raise ValueError("GluonConfig.ring_x puts x rows in the async ring: it needs ring > 1")
        if self.prefetch_depth not in (1, 2):
            raise ValueError(f"GluonConfig.prefetch_depth is 1 or 2, got {self.prefetch_depth}")
        if self.exc_tile and self.exc_after:
            raise ValueError("exc_tile (exceptions inside the tile kernel) and exc_after exclude each other")
        if (not self.x_ahead or self.x_rows8) and not (self.prefetch and not self.ring_x):
            raise ValueError("x_ahead=False and x_rows8 apply with prefetch and x outside the ring")
        if self.x_rows8 and self.bm != 16:
            raise ValueError("x_rows8 loads 8 of one 16-row x tile: it needs bm 16")
        if self.maxnreg and not 32 <= self.maxnreg <= 255:
            raise ValueError(f"GluonConfig.maxnreg must be 32-255 (0: none), got {self.maxnreg}")


@gluon.jit
def _gl_kernel(x_ptr, code_ptr, lo_ptr, base_ptr, part_ptr, M, N, KP, stride_xm, K_SPLIT, stride_code, stride_lo,
               BN: gl.constexpr, BK: gl.constexpr, WL: gl.constexpr, XL: gl.constexpr, ML: gl.constexpr,
               AL: gl.constexpr, BL: gl.constexpr, MT: gl.constexpr, PREFETCH: gl.constexpr,
               STAGES: gl.constexpr = 1, SL: gl.constexpr = None, XASYNC: gl.constexpr = False,
               XCL: gl.constexpr = None, XSL: gl.constexpr = None, rowptr_ptr=None, eidx_ptr=None, ehi_ptr=None,
               lo8_ptr=None, K=0, EXC: gl.constexpr = False, EL: gl.constexpr = None, EE: gl.constexpr = 16,
               EXL: gl.constexpr = None, XAHEAD: gl.constexpr = True, X8: gl.constexpr = False,
               X8L: gl.constexpr = None, PDL: gl.constexpr = 0, OUT: gl.constexpr = 0, out_ptr=None, bias_ptr=None,
               cnt_ptr=None, HAS_BIAS: gl.constexpr = False, CS: gl.constexpr = 1, XE: gl.constexpr = 16,
               ROWS: gl.constexpr = False):
    # part[pid_k, 16 * MT rows, BN cols] (fp32) = x rows @ W^T over this program's K range, the
    # decoded tile used for MT (1, 2 or 4) 16-row x tiles. Whole shapes only (K == KP, K_SPLIT a
    # multiple of BK); rows past M or N read row M-1 / N-1 again and are not stored.
    # OUT 0: store the fp32 partial (``finalize`` sums the splits); 1 (one split): store the bf16
    # result (+ bias) to out; 2: the last split program of each tile sums the others' partials
    # in the kernel (as ``_common.split_fixup``; counters CS int32 apart) and stores the bf16 result.
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    pid_m = gl.program_id(2)
    Q: gl.constexpr = BK // 4  # plane words a row and step: word q holds columns 4q..4q+3
    lo_off, code_off, high = _word_offsets(pid_n, N, stride_lo, stride_code, BK, BN, WL)
    b4 = gl.load(base_ptr).to(gl.uint32) * 0x01010101
    m0 = pid_m * (16 * MT)
    xp, xp1, xp2, xp3 = _x_tile_ptrs(x_ptr, m0, M, stride_xm, BK, XL, X8, X8L, MT)
    acc = gl.zeros([16, BN], gl.float32, ML)
    acc1 = gl.zeros([16, BN], gl.float32, ML)  # (unused below MT 2 and 4)
    acc2 = gl.zeros([16, BN], gl.float32, ML)
    acc3 = gl.zeros([16, BN], gl.float32, ML)
    # K steps as step indices so that every offset is a known multiple of BK (16-byte loads)
    s0 = (pid_k * K_SPLIT) // BK
    s1 = gl.minimum(pid_k * K_SPLIT + K_SPLIT, KP) // BK
    if PDL & 1:
        # launched early (config.pdl): the first step's plane words do not depend on the kernel before
        # this one, so they load while it ends; x and every store wait for it
        if STAGES == 1 and PREFETCH:
            lw, cw = _words(lo_ptr, code_ptr, lo_off, code_off, s0 * BK)
        gdc_wait()
    if PDL & 2:
        gdc_launch_dependents()
    if STAGES > 1:
        # plane words by async copy into a ring of STAGES steps in shared memory (STAGES - 1 in
        # flight, no registers held). Each thread copies and later reads back only its own words,
        # in the layout it decodes them in (SL: a warp's 16-byte vectors side by side).
        lo_s = gl.allocate_shared_memory(gl.int32, [STAGES, Q, BN], SL)
        co_s = gl.allocate_shared_memory(gl.int32, [STAGES, Q, BN], SL)
        if XASYNC:  # x rows too (all MT x tiles): copied once a program, read by every warp
            x_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 16 * MT, BK], XSL)
            xr = gl.minimum(m0 + gl.arange(0, 16 * MT, layout=gl.SliceLayout(1, XCL)), M - 1)
            xcp = x_ptr + xr[:, None] * stride_xm + gl.arange(0, BK, layout=gl.SliceLayout(0, XCL))[None, :]
        for i in gl.static_range(STAGES - 1):
            kc = gl.minimum(s0 + i, s1 - 1) * BK
            async_copy.async_copy_global_to_shared(lo_s.index(i), lo_ptr + lo_off + kc // 4)
            async_copy.async_copy_global_to_shared(co_s.index(i), code_ptr + code_off + kc // 8)
            if XASYNC:
                async_copy.async_copy_global_to_shared(x_s.index(i), xcp + kc)
            async_copy.commit_group()
    if EXC and not ROWS:
        # the first EE exceptions of the tile's rows (usually all of them) and their x values are
        # loaded before the K loop, so that their chain of dependent loads (row pointers, indices,
        # x gather) overlaps the loop instead of trailing it; other split programs load nothing
        n0, b8, e0, e1, er, ed, ed1, ed2, ed3 = exc_preload(x_ptr, base_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr,
                                                            pid_n, pid_k, m0, M, N, KP, K, stride_xm, BN, EE, EXL, MT)
    if PREFETCH:
        # register double buffer: the next step's words and x rows are in flight while this step
        # decodes and multiplies (Gluon does not pipeline loops by itself); the last step
        # reloads itself. Every program has at least one step (choose_split).
        kc = s0 * BK
        if STAGES == 1 and not PDL & 1:
            lw, cw = _words(lo_ptr, code_ptr, lo_off, code_off, kc)
        if not XASYNC and XAHEAD:
            xa, xa1, xa2, xa3 = _x_tiles(xp, xp1, xp2, xp3, kc, XL, X8, MT)
    if PREFETCH == 2:  # two steps ahead (one x tile only: MT == 1)
        kc = gl.minimum(s0 + 1, s1 - 1) * BK
        lw_b, cw_b = _words(lo_ptr, code_ptr, lo_off, code_off, kc)
        if XAHEAD:
            xa_b = _x_load(xp, kc, XL, X8)
    for st in range(s0, s1):
        kb = st * BK
        if PREFETCH:
            kn = gl.minimum(st + PREFETCH, s1 - 1) * BK
            if STAGES == 1:
                lw_n, cw_n = _words(lo_ptr, code_ptr, lo_off, code_off, kn)
            if not XASYNC and XAHEAD:
                xa_n, xa1_n, xa2_n, xa3_n = _x_tiles(xp, xp1, xp2, xp3, kn, XL, X8, MT)
            if not XASYNC and not XAHEAD:  # x rows loaded in the step (L1/L2 hits): fewer registers
                xa, xa1, xa2, xa3 = _x_tiles(xp, xp1, xp2, xp3, kb, XL, X8, MT)
        else:
            lw, cw = _words(lo_ptr, code_ptr, lo_off, code_off, kb)
            xa, xa1, xa2, xa3 = _x_tiles(xp, xp1, xp2, xp3, kb, XL, X8, MT)
        if STAGES > 1:
            # refill the slot read last step (its words are used up), then wait for this step's
            kq = gl.minimum(st + STAGES - 1, s1 - 1) * BK
            sq = (st - s0 + STAGES - 1) % STAGES
            async_copy.async_copy_global_to_shared(lo_s.index(sq), lo_ptr + lo_off + kq // 4)
            async_copy.async_copy_global_to_shared(co_s.index(sq), code_ptr + code_off + kq // 8)
            if XASYNC:
                async_copy.async_copy_global_to_shared(x_s.index(sq), xcp + kq)
            async_copy.commit_group()
            async_copy.wait_group(STAGES - 1)
            sc = (st - s0) % STAGES
            lw = lo_s.index(sc).load(WL).to(gl.uint32, bitcast=True)
            cw = co_s.index(sc).load(WL).to(gl.uint32, bitcast=True)
            if XASYNC:
                xa, xa1, xa2, xa3 = _ring_x(x_s.index(sc), XL, MT)
        w = _decode(lw, cw, high, b4, BK, BN, BL)
        acc, acc1, acc2, acc3 = _mma_tiles(w, xa, xa1, xa2, xa3, acc, acc1, acc2, acc3, BK, AL, MT)
        if PREFETCH == 2:
            lw = lw_b
            cw = cw_b
            lw_b = lw_n
            cw_b = cw_n
            if XAHEAD:
                xa = xa_b
                xa_b = xa_n
        elif PREFETCH:
            if STAGES == 1:
                lw = lw_n
                cw = cw_n
            if not XASYNC and XAHEAD:
                xa = xa_n
                if MT > 1:
                    xa1 = xa1_n
                if MT > 2:
                    xa2 = xa2_n
                    xa3 = xa3_n
    if STAGES > 1 and (EXC or OUT != 0):
        # the ring's last copies (of clamped, unused steps) are still landing, and the layout
        # changes of the exception step and the in-kernel split-K sum's counter broadcast take
        # shared scratch that may alias the ring: let them land first (without this the GPU
        # gave NaN and 1e34 on some tiles)
        async_copy.wait_group(0)
        gl.thread_barrier()
    if EXC and ROWS:  # GluonConfig.exc_rows: each x tile's accumulator, by the threads holding each weight row
        parts = gl.num_programs(1)
        acc = exc_rows_t(acc, x_ptr, m0, M, stride_xm, K, rowptr_ptr, eidx_ptr, lo8_ptr, base_ptr, pid_n * BN, N, pid_k,
                         parts, BN, ML)
        if MT > 1:
            acc1 = exc_rows_t(acc1, x_ptr, m0 + 16, M, stride_xm, K, rowptr_ptr, eidx_ptr, lo8_ptr, base_ptr,
                              pid_n * BN, N, pid_k, parts, BN, ML)
        if MT > 2:
            acc2 = exc_rows_t(acc2, x_ptr, m0 + 32, M, stride_xm, K, rowptr_ptr, eidx_ptr, lo8_ptr, base_ptr,
                              pid_n * BN, N, pid_k, parts, BN, ML)
            acc3 = exc_rows_t(acc3, x_ptr, m0 + 48, M, stride_xm, K, rowptr_ptr, eidx_ptr, lo8_ptr, base_ptr,
                              pid_n * BN, N, pid_k, parts, BN, ML)
    elif EXC:  # this split program's rounds of the exceptions of the tile's weight rows: past the splits' preloaded
        # rounds of EE, rounds of XE (round j by split j mod splits)
        parts = gl.num_programs(1)
        acc, acc1, acc2, acc3 = exc_tiles(acc, acc1, acc2, acc3, ed, ed1, ed2, ed3, er, x_ptr, m0, M, stride_xm,
                                           eidx_ptr, ehi_ptr, lo8_ptr, KP, b8, n0, K,
                                           e0 + parts * EE + pid_k * (XE - EE), e1, parts * XE, BN, XE, EL, EXL, ML,
                                           MT)
    epilogue(acc, acc1, acc2, acc3, part_ptr, out_ptr, bias_ptr, cnt_ptr, pid_n, pid_k, pid_m, m0, M, N, BN, ML,
              MT, OUT, HAS_BIAS, CS)


@gluon.jit
def _word_offsets(pid_n, N, stride_lo, stride_code, BK: gl.constexpr, BN: gl.constexpr, WL: gl.constexpr):
    # the [BK / 4, BN] word tile's offsets in the lo and code planes, and which words take their
    # code's high nibbles. Word q = 16g + 8h + w: code word 8g + w, low nibbles for h = 0, high for 1
    q = gl.arange(0, BK // 4, layout=gl.SliceLayout(1, WL))[:, None]
    n = gl.minimum(pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, WL)), N - 1)[None, :]
    return n * stride_lo + q, n * stride_code + (q // 16) * 8 + (q % 8), ((q // 8) % 2) == 1


@gluon.jit
def _x_tile_ptrs(x_ptr, m0, M, stride_xm, BK: gl.constexpr, XL: gl.constexpr, X8: gl.constexpr,
                 X8L: gl.constexpr, MT: gl.constexpr):
    # pointers of the program's MT 16-row x tiles (X8, M <= 8: rows 8-15 of the MMA tile are
    # zeros, not loaded: half the x registers)
    if not X8:
        xp = _x_ptrs(x_ptr, m0, M, stride_xm, BK, XL)
    else:
        xp = _x_ptrs(x_ptr, m0, M, stride_xm, BK, X8L, 8)
    xp1 = xp  # (unused below MT 2 and 4)
    xp2 = xp
    xp3 = xp
    if MT > 1:
        xp1 = _x_ptrs(x_ptr, m0 + 16, M, stride_xm, BK, XL)
    if MT > 2:
        xp2 = _x_ptrs(x_ptr, m0 + 32, M, stride_xm, BK, XL)
        xp3 = _x_ptrs(x_ptr, m0 + 48, M, stride_xm, BK, XL)
    return xp, xp1, xp2, xp3


@gluon.jit
def _ring_x(xs, XL: gl.constexpr, MT: gl.constexpr):
    # a ring slot's MT x tiles, in registers
    xa = xs.slice(0, 16).load(XL)
    xa1 = xa  # (unused below MT 2 and 4)
    xa2 = xa
    xa3 = xa
    if MT > 1:
        xa1 = xs.slice(16, 16).load(XL)
    if MT > 2:
        xa2 = xs.slice(32, 16).load(XL)
        xa3 = xs.slice(48, 16).load(XL)
    return xa, xa1, xa2, xa3


@gluon.jit
def _decode(lw, cw, high, b4, BK: gl.constexpr, BN: gl.constexpr, BL: gl.constexpr):
    # a step's plane words -> the decoded [BK, BN] bf16 tile, already the MMA's B operand (BL)
    Q: gl.constexpr = BK // 4
    nib = gl.where(high, cw >> 4, cw)
    h = ((nib << 4) & 0x80808080) | ((nib & 0x07070707) + b4)
    l0, l1 = split16(prmt(lw, h, 0x5140))
    l2, l3 = split16(prmt(lw, h, 0x7362))
    w = gl.reshape(gl.join(gl.join(l0, l2), gl.join(l1, l3)), [Q, BN, 4])  # [word, row, lane]
    w = gl.reshape(gl.permute(w, [0, 2, 1]), [BK // 64, 4, 4, 4, BN])  # column bits (76, 54, 32, 10)
    return gl.convert_layout(gl.reshape(gl.permute(w, [0, 2, 1, 3, 4]), [BK, BN]), BL)  # MMA k order


@gluon.jit
def _mma_tiles(w, xa, xa1, xa2, xa3, acc, acc1, acc2, acc3, BK: gl.constexpr, AL: gl.constexpr, MT: gl.constexpr):
    # the decoded tile times each of the program's MT 16-row x tiles
    acc = mma_v2(_x_operand(xa, BK, AL), w, acc)
    if MT > 1:
        acc1 = mma_v2(_x_operand(xa1, BK, AL), w, acc1)
    if MT > 2:
        acc2 = mma_v2(_x_operand(xa2, BK, AL), w, acc2)
        acc3 = mma_v2(_x_operand(xa3, BK, AL), w, acc3)
    return acc, acc1, acc2, acc3


@gluon.jit
def _words(lo_ptr, code_ptr, lo_off, code_off, kb):
    # the plane words of K step kb: low bytes and code nibbles, as uint32
    lw = gl.load(lo_ptr + lo_off + kb // 4).to(gl.uint32, bitcast=True)
    cw = gl.load(code_ptr + code_off + kb // 8).to(gl.uint32, bitcast=True)
    return lw, cw


@gluon.jit
def _x_ptrs(x_ptr, row0, M, stride_xm, BK: gl.constexpr, XL: gl.constexpr, R: gl.constexpr = 16):
    # [R, BK] pointers to x rows row0.. (rows past M read row M-1 again), step 0
    rows = gl.minimum(row0 + gl.arange(0, R, layout=gl.SliceLayout(1, XL)), M - 1)
    return x_ptr + rows[:, None] * stride_xm + gl.arange(0, BK, layout=gl.SliceLayout(0, XL))[None, :]


@gluon.jit
def _x_tiles(xp, xp1, xp2, xp3, kb, XL: gl.constexpr, X8: gl.constexpr, MT: gl.constexpr):
    # the MT x tiles of step kb (the unused ones are the first again, never read)
    xa = _x_load(xp, kb, XL, X8)
    xa1 = xa
    xa2 = xa
    xa3 = xa
    if MT > 1:
        xa1 = gl.load(xp1 + kb)
    if MT > 2:
        xa2 = gl.load(xp2 + kb)
        xa3 = gl.load(xp3 + kb)
    return xa, xa1, xa2, xa3


@gluon.jit
def _x_load(xp, kb, XL: gl.constexpr, X8: gl.constexpr):
    # the [16, BK] x tile of step kb (layout XL); with X8 only rows 0-7 are loaded, rows 8-15
    # (one register base of XL) are zeros
    xt = gl.load(xp + kb)
    if X8:
        xt = gl.reshape(gl.permute(gl.join(xt, gl.zeros_like(xt)), [2, 0, 1]), [16, xt.shape[1]])
        xt = gl.convert_layout(xt, XL)
    return xt


@gluon.jit
def _x_operand(xt, BK: gl.constexpr, AL: gl.constexpr):
    # a loaded [16, BK] x tile as the MMA's A operand, its columns in the decoded tile's k order
    xt = gl.reshape(xt, [16, BK // 64, 4, 4, 4])
    return gl.convert_layout(gl.reshape(gl.permute(xt, [0, 1, 3, 2, 4]), [16, BK]), AL)


@functools.lru_cache(maxsize=None)
def layouts(bn: int, bk: int, warps: int = WARPS):
    """(word, x, accumulator, A operand, B operand) layouts for a [16, bn] tile and K steps of bk,
    the ``warps`` warps side by side along N (each needs the whole x tile: fewer warps with more
    columns each read x fewer times per weight)."""
    mma = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, warps], instr_shape=[16, 8])
    a_op = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    b_op = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    q = bk // 4
    wb = warps.bit_length() - 1  # n bits 8, 16, ... taken by warps
    # B operand (k, n): registers k 1, 2, 16, 32, ...; lanes k 4, 8, n 1, 2, 4; warps n 8, ...;
    # registers n 8 * warps, ... In words (k / 4) with MMA k bits 2-3 and 4-5 swapped back to
    # columns: word bits 0, 1 and 4+ in registers (16-byte loads), 2, 3 across lanes.
    wreg = ([[1, 0], [2, 0]] + [[1 << i, 0] for i in range(4, q.bit_length() - 1)]
            + [[0, 1 << i] for i in range(3 + wb, bn.bit_length() - 1)])
    words = gl.DistributedLinearLayout(reg_bases=wreg, lane_bases=[[4, 0], [8, 0], [0, 1], [0, 2], [0, 4]],
                                       warp_bases=[[0, 8 << i] for i in range(wb)], block_bases=[], shape=[q, bn])
    # A operand (m, k) the same way: 16 contiguous columns of one row a thread, every warp all of x
    xreg = [[0, 1], [0, 2], [0, 4], [0, 8], [8, 0]] + [[0, 1 << i] for i in range(6, bk.bit_length() - 1)]
    x = gl.DistributedLinearLayout(reg_bases=xreg, lane_bases=[[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]],
                                   warp_bases=[[0, 0]] * wb, block_bases=[], shape=[16, bk])
    return words, x, mma, a_op, b_op


@functools.lru_cache(maxsize=None)
def x8_layout(bk: int, warps: int = WARPS):
    """The x layout of ``layouts`` for rows 0-7 only (its row-8 register base dropped)."""
    wb = warps.bit_length() - 1
    xreg = [[0, 1], [0, 2], [0, 4], [0, 8]] + [[0, 1 << i] for i in range(6, bk.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=xreg, lane_bases=[[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[0, 0]] * wb, block_bases=[], shape=[8, bk])


@functools.lru_cache(maxsize=None)
def ring_layout(bn: int, bk: int, warps: int, stages: int):
    """Shared layout of a [stages, bk / 4, bn] ring of plane words: each weight row's words
    contiguous (as in global memory), 16-byte vectors XOR-swizzled by row so that the 8 rows a
    warp reads in one phase fall on different banks."""
    return gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=min(8, bk // 16), order=[0, 1])


@functools.lru_cache(maxsize=None)
def x_ring_layouts(bk: int, warps: int):
    """(copy layout, shared layout) of a [16, bk] bf16 x tile in the async ring: 16-byte pieces a
    thread to copy; rows swizzled by 16-byte vectors for the readers' 32-byte row pieces."""
    tk = min(32, bk // 8)
    copy = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 // tk, tk], warps_per_cta=[warps, 1],
                            order=[1, 0])
    return copy, gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=min(8, bk // 8), order=[1, 0])


# x: bf16 [M, K]; packed: fixed12 [N, K], K == Kp; bias: [N] or None; out: bf16 [M, N] (written) -> out
def launch(x2: torch.Tensor, p, bias, cfg: GluonConfig, out: torch.Tensor) -> torch.Tensor:
    return plan(x2, p, bias, cfg)(x2, bias, out, tuple(p.arrays[a] for a in ARRAYS))


# x: bf16 [M, K]; packed: fixed12 [N, K], K == Kp -> run(x2, bias, out, arrays) (Kernel.plan)
def plan(x2: torch.Tensor, p, bias, cfg: GluonConfig):
    m, k, n, a, kp = C.gluon_launch_checks(x2, p, "fixed12_mma_v2", cfg.bk)
    prep = prepare(p)
    mt = cfg.bm // BM  # 16-row x tiles a program shares one decoded tile among
    tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, cfg.bm)
    split, per = C.choose_split(tiles, kp, cfg.bk, x2.device, cfg.split, cfg.waves)
    inline = cfg.exc_tile and prep.nexc > 0
    rows = inline and cfg.exc_rows  # by the accumulators' threads, the true values from prepare's list
    side = not cfg.exc_after and prep.nexc > 0 and not cfg.exc_tile
    # the bf16 result straight from the tile kernel when no exception pass adds to the partials:
    # with one split always, with several when GluonConfig.fixup asks for the in-kernel split-K sum
    direct = inline or prep.nexc == 0
    out_mode = 1 if direct and split == 1 else 2 if direct and cfg.fixup else 0
    # per call: x2, bias (or out), part (the partials, or out), out, then fixed12's arrays
    x, b, part, o = _plan.slots(4)
    lo, code, base, eidx, ehi = _plan.slots(5, 4, fixed=True)
    part = o if out_mode == 1 else part
    cnt = C.counters(x2.device, tiles) if out_mode == 2 else part
    words, xl, mma, a_op, b_op = layouts(cfg.bn, cfg.bk, cfg.warps)
    stages = cfg.ring  # GluonConfig checks that ring > 1 comes with prefetch and ring_x with ring > 1
    # x by async copy reads 16-byte pieces: Triton must know the row stride is a multiple of 16 elements
    xasync = cfg.ring_x and x2.stride(0) % 16 == 0 and x2.data_ptr() % 16 == 0
    xcl, xsl = x_ring_layouts(cfg.bk, cfg.warps) if xasync else (None, None)
    ee = EXC_E
    el, exl = exc_layouts(cfg.warps) if inline else (None, None)
    x8 = cfg.x_rows8 and m <= 8  # rows 8-15 of the one x tile are all padding
    pdl = 0 if side else C.pdl_flags(x2.device, cfg.pdl)
    grid = (triton.cdiv(n, cfg.bn), split, triton.cdiv(m, cfg.bm))
    tile = _plan.Launch(_gl_kernel, grid, (x, code.view(torch.int32), lo.view(torch.int32), base, part,
                                           m, n, kp, x2.stride(0), per, kp // 8, kp // 4), dict(
        BN=cfg.bn, BK=cfg.bk, WL=words, XL=xl, ML=mma, AL=a_op, BL=b_op, MT=mt,
        PREFETCH=(1 if stages > 1 else cfg.prefetch_depth if mt == 1 else 1) if cfg.prefetch else 0,
        STAGES=stages, SL=ring_layout(cfg.bn, cfg.bk, cfg.warps, stages) if stages > 1 else None,
        XASYNC=xasync, XCL=xcl, XSL=xsl, rowptr_ptr=prep.rowptr, eidx_ptr=eidx, ehi_ptr=ehi,
        lo8_ptr=prep.vals if rows else lo, K=k, EXC=inline, EE=ee, XE=cfg.exc_chunk, EL=el, EXL=exl, ROWS=rows, XAHEAD=cfg.x_ahead, X8=x8,
        X8L=x8_layout(cfg.bk, cfg.warps) if x8 else None, PDL=pdl, OUT=out_mode, out_ptr=o, bias_ptr=b,
        cnt_ptr=cnt, HAS_BIAS=bias is not None, CS=C.COUNTER_SLOTS, num_warps=cfg.warps,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}), **({"launch_pdl": True} if pdl & 1 else {})))
    pass_ = SidePass(x2, p, prep) if side else None
    after = exceptions_launch(x2, p, prep) if not side and not direct else None
    fin = C.finalize_launch(split + side, m, n, bias is not None, x2.device, cfg.pdl) if out_mode == 0 else None
    shape, dev = (split + side, m, n), x2.device

    def run(x2, bias, out, arrays):
        pt = torch.empty(shape, dtype=torch.float32, device=dev) if out_mode != 1 else out
        if pass_ is not None:
            cur = pass_.begin(pt[split:], x2, *arrays)
        tile(x2, bias if bias is not None else out, pt, out, *arrays)
        if pass_ is not None:
            pass_.join(cur)
        elif after is not None:
            after(pt, x2, *arrays)
        if fin is not None:
            fin(pt, bias if bias is not None else pt, out)
        return out

    return run


class GluonKernel(Kernel):
    """The Gluon tile: a CUDA GPU with Triton's Gluon, K (no padded columns) a multiple of ``bk``."""

    name = "fixed12_mma_v2"
    layout = "fixed12"
    Config = GluonConfig

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if not ok:
            return ok, why
        if "gluon" not in device.features:
            return False, "needs Triton's Gluon on a CUDA GPU (not the interpreter)"
        if problem.k != problem.kp or problem.k % config.bk:
            return False, f"needs K a multiple of bk = {config.bk} (no padded columns), got K = {problem.k}"
        return True, ""

    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        C.check_launch_shapes(cls.name, x2, tuple(packed.shape), out, bias)  # a direct launch read, wrote past them
        return launch(x2, packed, bias, config, out)

    @classmethod
    def plan(cls, x2, packed, bias, config):
        return plan(x2, packed, bias, config)
