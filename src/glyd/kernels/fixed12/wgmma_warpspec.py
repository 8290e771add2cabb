"""fixed12 decode-step product on wgmma with a warp-specialized TMA ring (Hopper only).

The wgmma tile of ``fixed12.wgmma`` loads each K step's plane words into registers and its x tile
through registers into shared memory, in the same warps that decode and multiply: one warpgroup
waits on every load in turn. Here one extra warp only issues TMA copies (the plane words of
``stages`` K steps and their x tiles) into a shared-memory ring guarded by mbarriers, and the
warpgroup only reads words from shared memory, decodes them and issues the MMAs, so the loads of
the next steps are always in flight.

Same product as ``fixed12.wgmma``: the decoded tile is wgmma's register A operand in the MMA's
slot order (``fixed12.wgmma.DECODE_ORDER``), here in two 64-column halves a step (a TMA box of bf16
x is at most 64 columns wide under 128-byte swizzling), and x is B from shared memory in the same
slot order. A TMA copy cannot permute columns, so ``launch`` permutes x once (``ws_permute.permute_x``, a
copy of the [M, K] activations) before the kernel. Rows past M or N are TMA's zero fill.

The grid is persistent and stream-K: each program multiplies an equal range of all tiles' K
steps, across tile boundaries; a tile shared by several programs is summed by the last of them
to finish, in program order (``_ws_finish``), and the exceptions are added where a tile is
finished. The H200 table's choice on lm_heads at M = 3-64 and gate/up at M = 33-64. CUDA only,
Hopper only (Gluon has no interpreter; the twin for tests is ``tc``).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from glyd.codec.fixed12 import ARRAYS
from glyd.kernels import _common as C
from glyd.kernels._fields import flags, ints
from glyd.kernels import _plan
from glyd.kernels.fixed12.exceptions import exceptions_launch, prepare
from glyd.kernels.fixed12.wgmma import exc_layout, wg_exceptions, wg_pairs, wg_row_exceptions
from glyd.kernels.fixed12.ws_load import _ws_loader, _ws_tile
from glyd.kernels.fixed12.ws_permute import BK, _permute_launch, permute_x, permute_x_torch  # noqa: F401 (the tile's x)
from glyd.kernels.registry import Kernel

HALF_ORDER = gl.constexpr((0, 3, 4, 6, 1, 2, 5))  # [row, g, a, i1, i0, j, h] -> slots (i1 i0 h g a j)


@dataclasses.dataclass(frozen=True)
class WsConfig(C.KernelConfig):
    """``bm`` (8-256) x rows and ``bn`` weight rows a tile, 4 warps (or 8 with ``bn`` 128 or 256: two
    warpgroups decoding the same ring slot, 64 or 128 rows each; 256 halves the x tiles' reads a weight
    row past M = 64, where x is read again for every tile), a ring of ``stages`` (2-8) K steps; the
    grid is persistent: ``waves`` programs an SM, or ``split`` programs in all. ``maxnreg``: a
    register cap (80 gives three programs an SM). ``pipe``: a step's MMAs stay in flight while the
    warpgroup reads and decodes the next step's first half (else it waits for them before reading the
    next step: the tensor cores idle while it decodes); measured on an H100 at M = 96-4608 it gained
    nothing (benchmarks/history/2026-12-05-h100-9.md), and no table row turns it on. ``exc_chunk``:
    exceptions a one-hot MMA where a tile is finished (16, 32, 64 or 128: half the rounds of 64, each a
    chain of dependent loads, for 2 x bm x 128 bf16 more shared memory), ``exc_xt``: their x columns read
    from a transposed copy of x (one contiguous read a column, not a strided gather): past M = 64 a
    tile of 128 rows holds hundreds of exceptions at real weights' 0.1%. ``exc_pre``: their true values
    from the prepared list (no load into the lo plane behind the index's), each round's loaded during
    the round before; ``exc_vals`` the same values in the round itself. ``exc_corr``: none of that,
    but the exceptions' pass of its own (``fixed12.exceptions``, x transposed, up to 128 x rows a
    program) into an fp32 [M, N] correction before the kernel, which each finished tile adds
    (exc_chunk, exc_xt, exc_pre and exc_vals then do nothing). ``exc_rows``: no one-hot MMA either; the
    threads holding a weight row in the accumulator add its exceptions themselves, the j-th of every row
    at once, with the prepared values in fp32, x's columns from x itself or, with exc_xt, from its transposed
    copy (one more kernel a call; exc_chunk and exc_vals then do nothing; exc_corr takes precedence); with
    exc_pre each round's x columns and values are loaded during the round before (the rounds' loads in flight
    while the one before adds: at M = 512 the rounds after the MMAs cost the tile 24%, history/2026-12-06-h100-25.md).
    ``x_outer``: the tiles in x-tile-major order (every weight tile of the first x rows, then of the next), so
    that the programs holding one weight tile for each x tile run its K steps at the same time and its words
    come from DRAM once (x tiles inner, one program takes a weight tile's x tiles one after another, long
    enough apart that each reads the words from DRAM again: 52.6-69.7% of DRAM's bandwidth for 2-4.4x the
    words' bytes at M = 512, Nsight Compute on an H100, history/2026-12-06-h100-24.md); the programs then a
    multiple of the x tiles (128 of 132 SMs at 8 or 16 x tiles), unless ``split`` is given. The same tiles
    either way; past M = bm they are split among the programs at other K steps (the same bits within
    float64's bound, not the same bits). ``halves``: a slot's two 64-column halves each with its own
    mbarriers (the words and the first x box, then the second x box), the first freed once its MMAs are done while
    the second's run: a slot's copies then have a step and a half to land, not one (at bm 256 two 88 KB slots fit,
    and the step took 3,980 cycles for 2,048 of MMAs with L2 at 61%: the copies' latency, Nsight Compute on an H100,
    history/2026-12-06-h100-24.md). The same MMAs in the same order: the same bits. With ``pipe`` the first half is
    freed before the next step's words are read. ``wg_parts`` (8 warps): each warpgroup a ``warp_specialize``
    partition of its own, the consumer of half the tile's rows with its own barriers, work slots and tile counters,
    a slot freed once both arrived; else the 8 warps are one partition whose CTA barrier (three a step, Triton's
    shared-memory fences) holds each warpgroup until the other's MMAs are done (41% of the issue stalls at gate_up
    M = 512, Nsight Compute on an H100, history/2026-12-06-h100-24.md), where it could decode its next step. The same
    MMAs and exception rounds a row in the same order: the same bits."""

    bm: int = 16
    bn: int = 64
    stages: int = 2
    maxnreg: int = 0
    pipe: bool = False
    exc_chunk: int = 16
    exc_xt: bool = False
    exc_pre: bool = False
    exc_corr: bool = False
    exc_vals: bool = False
    exc_rows: bool = False
    x_outer: bool = False
    halves: bool = False
    wg_parts: bool = False

    def validate(self) -> None:
        C.pow2(self, "bm", "bn")
        ints(self, 0, 255, "stages", "maxnreg")
        flags(self, "pipe", "exc_xt", "exc_pre", "exc_corr", "exc_vals", "exc_rows", "x_outer", "halves", "wg_parts")
        if self.wg_parts and self.warps != 8:
            raise ValueError(f"WsConfig.wg_parts needs 8 warps (two warpgroups), got {self.warps}")
        if self.exc_pre and self.exc_vals:
            raise ValueError("WsConfig.exc_pre (the values a round ahead) and exc_vals (in the round) exclude each other")
        ints(self, 16, 128, "exc_chunk")
        if self.exc_chunk not in (16, 32, 64, 128):
            raise ValueError(f"WsConfig.exc_chunk must be 16, 32, 64 or 128, got {self.exc_chunk}")
        if self.bm not in (8, 16, 32, 64, 128, 256) or not (self.warps == 4 or (self.warps, self.bn) in ((8, 128),
                                                                                                     (8, 256))):
            raise ValueError(f"WsConfig: bm 8-256, 4 warps (or 8 with bn 128 or 256); got {self}")
        if self.bn not in (16 * self.warps, 32 * self.warps) or not 2 <= self.stages <= 8:
            raise ValueError(f"WsConfig: bn 16 or 32 rows a warp, a ring of 2-8 stages; got {self}")
        if self.maxnreg and not 32 <= self.maxnreg <= 255:
            raise ValueError(f"WsConfig.maxnreg must be 32-255 (0: none), got {self.maxnreg}")


@gluon.jit
def _ws_half(lw, nib, b4, BN: gl.constexpr, AL: gl.constexpr):
    # one 64-column half of a step's decoded tile ([BN, 64] bf16, slot order) as the A operand
    w = wg_pairs(lw, nib, b4)  # [BN, 16 (g a i1 i0), 2 (j), 2 (h)]
    w = gl.reshape(w, [BN, 2, 2, 2, 2, 2, 2])
    return gl.convert_layout(gl.reshape(gl.permute(w, HALF_ORDER.value), [BN, 64]), AL)


@gluon.jit
def _ws_first(g, P, W):
    # the program whose K-step range holds global step g (program p has p W / P .. (p + 1) W / P)
    return ((g + 1) * P - 1) // W


@gluon.jit
def _ws_finish(acc, t, n0, m0, g0, P, W, S, pid, x_ptr, out_ptr, bias_ptr, work_ptr, cnt_ptr, M, N, KP, stride_xm,
               rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, BN: gl.constexpr, BT: gl.constexpr,
               ML: gl.constexpr, OL: gl.constexpr, HAS_BIAS: gl.constexpr, EXC: gl.constexpr, EL: gl.constexpr,
               CS: gl.constexpr, XE: gl.constexpr = 16, XT: gl.constexpr = False,
               PRE: gl.constexpr = 0, CORR: gl.constexpr = False, corr_ptr=None):
    # the end of this program's part of tile t (its BN rows from n0): its share of the tile's
    # exceptions, then for a whole tile bias and bf16 out. A part: store the fp32 partial in this
    # program's work slot (2 pid if it began at the program's first step, else 2 pid + 1), count in;
    # the last of the tile's programs to count in sums every part in program order (the same bits
    # whoever is last), then finishes the tile.
    ts = t * S
    q0 = _ws_first(ts, P, W)
    q1 = _ws_first(ts + S - 1, P, W)
    r = gl.arange(0, BN, layout=gl.SliceLayout(1, ML))[:, None]
    c = gl.arange(0, BT, layout=gl.SliceLayout(0, ML))[None, :]
    if EXC and PRE >= 3:  # WsConfig.exc_rows: by the accumulator's own threads, a row's list from its pointers
        if XT:  # x_ptr: x transposed ([K, M])
            acc = wg_row_exceptions(acc, x_ptr, M, 1, m0, M, KP, rowptr_ptr, eidx_ptr, lo8_ptr, base_ptr, n0, N,
                                    pid - q0, q1 - q0 + 1, BN, BT, ML, PRE == 4)
        else:
            acc = wg_row_exceptions(acc, x_ptr, 1, stride_xm, m0, M, KP, rowptr_ptr, eidx_ptr, lo8_ptr, base_ptr, n0,
                                    N, pid - q0, q1 - q0 + 1, BN, BT, ML, PRE == 4)
    elif EXC:  # this program's share of the tile's exceptions (the rounds shared among the tile's programs)
        e0 = gl.load(rowptr_ptr + n0)
        e1 = gl.load(rowptr_ptr + gl.minimum(n0 + BN, N))
        acc = wg_exceptions(acc, x_ptr, m0, M, stride_xm, eidx_ptr, ehi_ptr, lo8_ptr, KP, base_ptr, n0, e0, e1,
                            pid - q0, q1 - q0 + 1, BN, BT, ML, EL, XE, XT, PRE)
    done = q0 == q1
    if not done:
        cnt = cnt_ptr + t * CS
        slot = 2 * pid + (g0 <= ts).to(gl.int32)
        gl.store(work_ptr + slot * (BN * BT) + r * BT + c, acc)
        gl.thread_barrier()  # every thread's partial stores before the releasing count
        old = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        done = old == q1 - q0
        if done:
            gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")  # zero for the next launch
            acc = gl.zeros([BN, BT], gl.float32, ML)
            for q in range(q0, q1 + 1):
                qs = 2 * q + ((q * W) // P <= ts).to(gl.int32)
                acc += gl.load(work_ptr + qs * (BN * BT) + r * BT + c, cache_modifier=".cg")
    if done:
        if CORR:  # the exceptions' corrections, fp32 [M, N] from their own pass before this kernel
            acc += gl.load(corr_ptr + (m0 + c).to(gl.int64) * N + n0 + r, mask=(n0 + r < N) & (m0 + c < M),
                           other=0.0)
        o = gl.convert_layout(acc, OL)
        rr = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, OL))[:, None]
        mm = m0 + gl.arange(0, BT, layout=gl.SliceLayout(0, OL))[None, :]
        if HAS_BIAS:
            o += gl.load(bias_ptr + rr, mask=rr < N, other=0.0).to(gl.float32)
        gl.store(out_ptr + mm * N + rr, o.to(gl.bfloat16), mask=(rr < N) & (mm < M))


@gluon.jit
def _ws_words(lo_s, co_s, ready, b, ph, BN: gl.constexpr, LL: gl.constexpr, CL: gl.constexpr, RO: gl.constexpr = 0):
    # ring slot b's plane words, once its copies landed: lo words of halves 0 and 1, code words
    mbarrier.wait(ready.index(b), ph)
    return _ws_slot_words(lo_s, co_s, b, BN, LL, CL, RO)


@gluon.jit
def _ws_slot_words(lo_s, co_s, b, BN: gl.constexpr, LL: gl.constexpr, CL: gl.constexpr, RO: gl.constexpr = 0):
    # _ws_words of a slot already waited for: its BN rows from RO (a warpgroup's half under WsConfig.wg_parts)
    lw = lo_s.index(b).slice(RO, BN).load(LL)  # [BN, 32]: words 16 g + 8 hh + 4 a + i of the lane's (a, g)
    cw = co_s.index(b).slice(RO, BN).load(CL).to(gl.uint32, bitcast=True)
    lw = gl.reshape(lw.to(gl.uint32, bitcast=True), [BN, 2, 2, 8])  # [row, g, hh, (a i)]
    l0, l1 = gl.split(gl.reshape(gl.permute(lw, (0, 1, 3, 2)), [BN, 16, 2]))
    return l0, l1, gl.convert_layout(cw, l0.type.layout)


@gluon.jit
def _ws_step_mmas(lo_s, co_s, x_s, ready, b, ph, acc, b4, BN: gl.constexpr, LL: gl.constexpr, CL: gl.constexpr,
                  AL: gl.constexpr, RO: gl.constexpr = 0):
    # one K step from ring slot b: wait for it, read and decode its words, issue its two MMAs
    l0, l1, cw = _ws_words(lo_s, co_s, ready, b, ph, BN, LL, CL, RO)
    a0 = _ws_half(l0, cw, b4, BN, AL)
    acc = warpgroup_mma(a0, x_s.index(2 * b).permute((1, 0)), acc, is_async=True)
    a1 = _ws_half(l1, cw >> 4, b4, BN, AL)
    acc = warpgroup_mma(a1, x_s.index(2 * b + 1).permute((1, 0)), acc, is_async=True)
    return acc, a0, a1


@gluon.jit
def _ws_step_halves(lo_s, co_s, x_s, ready, empty, b, ph, acc, b4, BN: gl.constexpr, LL: gl.constexpr,
                    CL: gl.constexpr, AL: gl.constexpr, RO: gl.constexpr = 0):
    # WsConfig.halves: _ws_step_mmas with the slot's halves waited for and freed one at a time (mbarriers
    # 2 b: the words and the first x box, 2 b + 1: the second x box); the words are in registers before
    # the first half is freed, the first half's MMAs done while the second's are still running
    mbarrier.wait(ready.index(2 * b), ph)
    l0, l1, cw = _ws_slot_words(lo_s, co_s, b, BN, LL, CL, RO)
    a0 = _ws_half(l0, cw, b4, BN, AL)
    acc = warpgroup_mma(a0, x_s.index(2 * b).permute((1, 0)), acc, is_async=True)
    a1 = _ws_half(l1, cw >> 4, b4, BN, AL)
    mbarrier.wait(ready.index(2 * b + 1), ph)
    acc = warpgroup_mma(a1, x_s.index(2 * b + 1).permute((1, 0)), acc, is_async=True)
    acc, a0 = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a0))
    fence_async_shared()  # as _ws_consumer's: the half's reads done before the TMA refills it
    mbarrier.arrive(empty.index(2 * b))
    acc, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a1))
    fence_async_shared()
    mbarrier.arrive(empty.index(2 * b + 1))
    return acc


@gluon.jit
def _ws_piped(lo_s, co_s, x_s, ready, b, i, n, acc, a0, b4, BN: gl.constexpr, NS: gl.constexpr, LL: gl.constexpr,
              CL: gl.constexpr, AL: gl.constexpr, HV: gl.constexpr = False, empty=None, RO: gl.constexpr = 0):
    # step i (slot b) with its first half a0 decoded already: its first MMA issued, its second half
    # decoded from the slot's words read again while the first multiplies, then the next step's
    # first half decoded while the second multiplies. Only a0 is carried to the next step (not its
    # second half's words: 32 registers a thread, which spilled the step loop at bm 256); a1 stays
    # alive until the caller's wait
    acc = warpgroup_mma(a0, x_s.index(2 * b).permute((1, 0)), acc, is_async=True)
    _, l1, cw = _ws_slot_words(lo_s, co_s, b, BN, LL, CL, RO)
    a1 = _ws_half(l1, cw >> 4, b4, BN, AL)
    if HV:  # WsConfig.halves: the second x box has its own mbarrier
        mbarrier.wait(ready.index(2 * b + 1), (i // NS) & 1)
    acc = warpgroup_mma(a1, x_s.index(2 * b + 1).permute((1, 0)), acc, is_async=True)
    # the first MMA done (the second still queued: the tensor cores stay busy), a0's registers free
    acc, a0 = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a0))
    if HV:  # ... and the slot's first half (its words were read for the second half above)
        fence_async_shared()
        mbarrier.arrive(empty.index(2 * b))
    if i + 1 < n:
        if HV:  # the next slot's first half
            mbarrier.wait(ready.index(2 * ((i + 1) % NS)), ((i + 1) // NS) & 1)
            l0, _, cw = _ws_slot_words(lo_s, co_s, (i + 1) % NS, BN, LL, CL, RO)
        else:
            l0, _, cw = _ws_words(lo_s, co_s, ready, (i + 1) % NS, ((i + 1) // NS) & 1, BN, LL, CL, RO)
        a0 = _ws_half(l0, cw, b4, BN, AL)
    return acc, a0, a1


@gluon.jit
def _ws_parts_piped(lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4, x_ptr, out_ptr, bias_ptr, work_ptr,
                    cnt_ptr, M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, BN: gl.constexpr,
                    BT: gl.constexpr, NS: gl.constexpr, LL: gl.constexpr, CL: gl.constexpr, ML: gl.constexpr,
                    AL: gl.constexpr, OL: gl.constexpr, HAS_BIAS: gl.constexpr, EXC: gl.constexpr,
                    EL: gl.constexpr, CS: gl.constexpr, XE: gl.constexpr = 16, XT: gl.constexpr = False,
               PRE: gl.constexpr = 0, CORR: gl.constexpr = False, corr_ptr=None, XO: gl.constexpr = False,
                    HV: gl.constexpr = False, TB: gl.constexpr = 0, RO: gl.constexpr = 0):
    # WsConfig.pipe: the program's steps a tile part at a time, each part's steps pipelined
    # (_ws_piped) and its finish after the part's last MMAs, so that nothing decoded ahead is
    # live across a finish (its registers would spill in the step loop)
    pid = gl.program_id(0)
    acc = gl.zeros([BN, BT], gl.float32, ML)
    for t in range(g0 // S, (g1 - 1) // S + 1):
        s0 = gl.maximum(g0, t * S) - g0  # the part's first and last + 1 ring indices
        s1 = gl.minimum(g1, t * S + S) - g0
        if HV:  # WsConfig.halves: the slot's first half
            mbarrier.wait(ready.index(2 * (s0 % NS)), (s0 // NS) & 1)
            l0, _, cw = _ws_slot_words(lo_s, co_s, s0 % NS, BN, LL, CL, RO)
        else:
            l0, _, cw = _ws_words(lo_s, co_s, ready, s0 % NS, (s0 // NS) & 1, BN, LL, CL, RO)
        a0 = _ws_half(l0, cw, b4, BN, AL)
        for i in range(s0, s1):
            b = i % NS
            acc, a0, a1 = _ws_piped(lo_s, co_s, x_s, ready, b, i, s1, acc, a0, b4, BN, NS, LL, CL, AL, HV, empty,
                                    RO)
            acc, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a1))
            fence_async_shared()  # as _ws_consumer: the slot's reads are done, the TMA may refill it
            mbarrier.arrive(empty.index(2 * b + 1 if HV else b))
        _, _, n0, m0 = _ws_tile(t * S, S, MT, TB, BT, XO)
        _ws_finish(acc, t, n0 + RO, m0, g0, P, W, S, pid, x_ptr, out_ptr, bias_ptr, work_ptr, cnt_ptr, M, N, KP,
                   stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, BN, BT, ML, OL, HAS_BIAS, EXC, EL, CS,
                   XE, XT, PRE, CORR, corr_ptr)
        acc = gl.zeros([BN, BT], gl.float32, ML)
    return acc


@gluon.jit
def _ws_consumer(lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4, x_ptr, out_ptr, bias_ptr, work_ptr, cnt_ptr,
                 M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, BN: gl.constexpr,
                 BT: gl.constexpr, NS: gl.constexpr, LL: gl.constexpr, CL: gl.constexpr, ML: gl.constexpr,
                 AL: gl.constexpr, OL: gl.constexpr, HAS_BIAS: gl.constexpr, EXC: gl.constexpr, EL: gl.constexpr,
                 CS: gl.constexpr, PIPE: gl.constexpr, XE: gl.constexpr = 16, XT: gl.constexpr = False,
               PRE: gl.constexpr = 0, CORR: gl.constexpr = False, corr_ptr=None, XO: gl.constexpr = False,
                 HV: gl.constexpr = False, TB: gl.constexpr = 0, RO: gl.constexpr = 0):
    # the warpgroups: words from the ring, decode, MMA, free the slot; at the end of each tile's
    # part, finish it (_ws_finish). Every program has a step at least (the grid is at most one a step).
    # BN: the consumer's rows, RO the first of them in the tile of TB rows (WsConfig.wg_parts: a warpgroup
    # a consumer of half the rows; else one consumer of all of them, BN == TB, RO 0)
    if PIPE:
        acc = _ws_parts_piped(lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4, x_ptr, out_ptr, bias_ptr,
                              work_ptr, cnt_ptr, M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr,
                              BN, BT, NS, LL, CL, ML, AL, OL, HAS_BIAS, EXC, EL, CS, XE, XT, PRE,
                              CORR, corr_ptr, XO, HV, TB, RO)
    else:
        pid = gl.program_id(0)
        acc = gl.zeros([BN, BT], gl.float32, ML)
        for i in range(g1 - g0):
            b = i % NS
            if HV:
                acc = _ws_step_halves(lo_s, co_s, x_s, ready, empty, b, (i // NS) & 1, acc, b4, BN, LL, CL, AL,
                                      RO)
            else:
                acc, a0, a1 = _ws_step_mmas(lo_s, co_s, x_s, ready, b, (i // NS) & 1, acc, b4, BN, LL, CL, AL,
                                            RO)
                acc, a0, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a0, a1))
                # every warp's words of this slot were read before its part of the MMAs was issued, so
                # the MMAs being done means the whole slot is free; the fence orders those generic-proxy
                # reads before the TMA's next writes
                fence_async_shared()
                mbarrier.arrive(empty.index(b))
            g = g0 + i
            t, st, n0, m0 = _ws_tile(g, S, MT, TB, BT, XO)
            if (st == S - 1) | (g == g1 - 1):
                _ws_finish(acc, t, n0 + RO, m0, g0, P, W, S, pid, x_ptr, out_ptr, bias_ptr, work_ptr, cnt_ptr, M, N, KP,
                           stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, BN, BT, ML, OL, HAS_BIAS,
                           EXC, EL, CS, XE, XT, PRE, CORR, corr_ptr)
                acc = gl.zeros([BN, BT], gl.float32, ML)


# MT not specialized: at M = 1 Triton makes both M and MT constexpr 1, and with exceptions that lowering aborts
# (an assertion in Triton 3.6's ConvertTritonGPUToLLVM; either one alone compiles)
@gluon.jit(do_not_specialize=["MT"])
def _ws_kernel(lo_desc, co_desc, x_desc, x_ptr, base_ptr, out_ptr, bias_ptr, work_ptr, cnt_ptr, M, N, KP, stride_xm,
               S, MT, W, BN: gl.constexpr, BT: gl.constexpr, NS: gl.constexpr, LL: gl.constexpr, CL: gl.constexpr,
               ML: gl.constexpr, AL: gl.constexpr, OL: gl.constexpr, HAS_BIAS: gl.constexpr,
               EXC: gl.constexpr = False, EL: gl.constexpr = None, rowptr_ptr=None, eidx_ptr=None, ehi_ptr=None,
               lo8_ptr=None, CS: gl.constexpr = 1, LOADER_REGS: gl.constexpr = 24, NBYTES: gl.constexpr = 0,
               PIPE: gl.constexpr = False, XE: gl.constexpr = 16, XT: gl.constexpr = False,
               PRE: gl.constexpr = 0, CORR: gl.constexpr = False, corr_ptr=None, XO: gl.constexpr = False,
               HV: gl.constexpr = False, NC: gl.constexpr = 1, WG_REGS: gl.constexpr = 232):
    # out (bf16 [M, N], + bias) = x @ W^T, persistent over W = tiles x S K steps (stream-K):
    # program p multiplies global steps p W / P .. (p + 1) W / P (tile-major, x tiles inner, or with XO
    # outer: MT is then the weight tiles, the inner index's count), so
    # every program has the same number of steps; a tile shared by several programs is summed
    # by the last of them through fp32 work slots (_ws_finish). x here is the slot-permuted copy
    # (x_desc); x_ptr the original (XT: transposed, [K, M]), for the exceptions.
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    g0 = (pid * W) // P
    g1 = ((pid + 1) * W) // P
    b4 = gl.load(base_ptr).to(gl.uint32) * 0x01010101
    lo_s = gl.allocate_shared_memory(gl.int32, [NS, BN, 32], lo_desc.layout)
    co_s = gl.allocate_shared_memory(gl.int32, [NS, BN, 16], co_desc.layout)
    x_s = gl.allocate_shared_memory(gl.bfloat16, [2 * NS, BT, 64], x_desc.layout)
    if HV:  # WsConfig.halves: a slot's halves each with its own pair
        ready = gl.allocate_shared_memory(gl.int64, [2 * NS, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [2 * NS, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(2 * NS):
            mbarrier.init(ready.index(j), count=1)
            mbarrier.init(empty.index(j), count=NC)  # NC consumers free it
    else:
        ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(NS):
            mbarrier.init(ready.index(j), count=1)
            mbarrier.init(empty.index(j), count=NC)
    fence_async_shared()
    if NC == 2:  # WsConfig.wg_parts: each warpgroup a partition of its own, the consumer of half the tile's rows
        # (its own barriers, its own work slots and tile counters); the layouts are a warpgroup's of H rows
        H: gl.constexpr = BN // 2
        gl.warp_specialize([
            (_ws_consumer, (lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4,
                            x_ptr, out_ptr, bias_ptr, work_ptr, cnt_ptr, M, N, KP, stride_xm, rowptr_ptr, eidx_ptr,
                            ehi_ptr, lo8_ptr, base_ptr, H, BT, NS, LL, CL, ML, AL, OL, HAS_BIAS, EXC, EL, CS, PIPE,
                            XE, XT, PRE, CORR, corr_ptr, XO, HV, BN, 0)),
            (_ws_consumer, (lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4,
                            x_ptr, out_ptr, bias_ptr, work_ptr + 2 * P * H * BT, cnt_ptr + 1, M, N, KP, stride_xm,
                            rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, H, BT, NS, LL, CL, ML, AL, OL, HAS_BIAS,
                            EXC, EL, CS, PIPE, XE, XT, PRE, CORR, corr_ptr, XO, HV, BN, H)),
            (_ws_loader, (lo_desc, co_desc, x_desc, lo_s, co_s, x_s, ready, empty, g0, g1, S, MT, BN, BT, NS, NBYTES,
                          XO, HV)),
        ], [4, 1], [WG_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_ws_consumer, (lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4, x_ptr, out_ptr, bias_ptr, work_ptr,
                            cnt_ptr, M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, BN, BT, NS,
                            LL, CL, ML, AL, OL, HAS_BIAS, EXC, EL, CS, PIPE, XE, XT, PRE, CORR,
                            corr_ptr, XO, HV, BN, 0)),
            (_ws_loader, (lo_desc, co_desc, x_desc, lo_s, co_s, x_s, ready, empty, g0, g1, S, MT, BN, BT, NS, NBYTES,
                          XO, HV)),
        ], [1], [LOADER_REGS])


@functools.lru_cache(maxsize=None)
def layouts(bn: int, bt: int, warps: int = 4):
    """(lo words, code words, accumulator, A operand, output) register layouts and (lo, code, x)
    shared layouts for bn weight rows and bt x rows. Lo words [bn, 32]: a thread holds words
    16 g + 8 hh + 4 a + i (i = 0-3, hh = 0-1) of two rows 8 apart, (a, g) its lane's two low
    bits, as ``fixed12.wgmma`` loads them; code words [bn, 16]: 8 g + 4 a + i."""
    rb = bn // (16 * warps)  # 16-row blocks a warp in registers past the first
    rows = [[8, 0]] + [[16 * warps << i, 0] for i in range(rb.bit_length() - 1)]
    lanes = [[1, 0], [2, 0], [4, 0]]
    warp_b = [[16 << i, 0] for i in range(warps.bit_length() - 1)]
    lo = gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [0, 8]] + rows, lane_bases=[[0, 4], [0, 16]] + lanes,
                                    warp_bases=warp_b, block_bases=[], shape=[bn, 32])
    code = gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2]] + rows, lane_bases=[[0, 4], [0, 8]] + lanes,
                                      warp_bases=warp_b, block_bases=[], shape=[bn, 16])
    mma = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, bt, 16])
    a_op = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    out = gl.BlockedLayout(size_per_thread=[4, 1], threads_per_warp=[32, 1], warps_per_cta=[1, warps], order=[0, 1])
    shared = (gl.NVMMASharedLayout.get_default_for([bn, 32], gl.int32),
              gl.NVMMASharedLayout.get_default_for([bn, 16], gl.int32),
              gl.NVMMASharedLayout.get_default_for([bt, 64], gl.bfloat16))
    return lo, code, mma, a_op, out, shared


def slot_bytes(bn: int, bt: int) -> int:
    """Bytes the TMA copies of one ring slot bring: [bn, 32] lo and [bn, 16] code words, and two
    [bt, 64] bf16 x boxes."""
    return bn * 32 * 4 + bn * 16 * 4 + 2 * bt * 64 * 2


SHARED_MAX = 227 * 1024  # a Hopper program's most shared memory


def shared_bytes(cfg: WsConfig) -> int:
    """Shared memory a program of ``cfg`` takes at most: its ring of ``stages`` slots, their mbarriers, and
    the exception step's two [bm, exc_chunk] bf16 product tiles (allocated where the matrix has exceptions)."""
    return cfg.stages * (slot_bytes(cfg.bn, cfg.bm) + 16 * (1 + cfg.halves)) + 2 * cfg.bm * cfg.exc_chunk * 2 + 1024  # + alignment


# x: bf16 [M, K]; packed: fixed12 [N, K], K == Kp; bias: [N] or None; out: bf16 [M, N] (written) -> out
def launch(x2: torch.Tensor, p, bias, cfg: WsConfig, out: torch.Tensor) -> torch.Tensor:
    return plan(x2, p, bias, cfg)(x2, bias, out, tuple(p.arrays[a] for a in ARRAYS))


# x: bf16 [M, K]; packed: fixed12 [N, K], K == Kp -> run(x2, bias, out, arrays) (Kernel.plan; it holds the
# TMA descriptors of the lo and code planes over dtype views of them, which share their storage but,
# unlike shape views, do not keep the arrays themselves alive)
def plan(x2: torch.Tensor, p, bias, cfg: WsConfig):
    m, k, n, a, kp = C.gluon_launch_checks(x2, p, "fixed12_wgmma_warpspec", BK)
    prep = prepare(p)
    for name in ("lo", "code"):
        if a[name].data_ptr() % 16 or a[name].stride(0) % 16:
            raise ValueError(f"the ws kernel needs the {name} plane 16-byte aligned for TMA")
    copy = x2.stride(1) != 1 or x2.stride(0) % 8 or x2.data_ptr() % 16
    stride = x2.shape[1] if copy else x2.stride(0)
    steps = kp // BK
    mt = triton.cdiv(m, cfg.bm)
    work = triton.cdiv(n, cfg.bn) * mt * steps  # K steps in all
    # programs: ``split`` if given (tests), else ``waves`` an SM; at most one a step
    progs = min(work, cfg.split or cfg.waves * C.sm_count(x2.device))
    if cfg.x_outer and not cfg.split and progs > mt:  # a multiple of the x tiles: each copy of a weight tile then
        progs -= progs % mt  # starts at the same step of its programs' ranges (132 programs and 16 x tiles would
        # put them a quarter of a range apart, 250 K steps at M = 2048, and the words would leave L2 between them)
    corr = prep.nexc > 0 and cfg.exc_corr  # the exceptions by a pass of their own, added where a tile is finished
    inline = prep.nexc > 0 and not corr  # ... else by the finishing program itself
    xt = inline and cfg.exc_xt  # ... their x columns read from x transposed
    pre = ((4 if cfg.exc_pre else 3) if cfg.exc_rows else 1 if cfg.exc_pre else 2 if cfg.exc_vals else 0) if inline else 0
    # ... their true values from prepare's list, a round ahead (1), in the round (2), or by the rows' threads (3;
    # 4: each round's x columns and values loaded a round ahead)
    tiles = triton.cdiv(n, cfg.bn) * mt
    cnt = C.counters(x2.device, tiles)
    *_, (lsl, csl, xsl) = layouts(cfg.bn, cfg.bm, cfg.warps)
    cw = 4 if cfg.wg_parts else cfg.warps  # a consumer's warps and rows
    ll, cl, mma, a_op, ol, _ = layouts(cfg.bn * cw // cfg.warps, cfg.bm, cw)
    lo_d = TensorDescriptor.from_tensor(a["lo"].view(torch.int32), [cfg.bn, 32], lsl)
    co_d = TensorDescriptor.from_tensor(a["code"].view(torch.int32), [cfg.bn, 16], csl)
    # per call: x2, bias (or out), the ring's fp32 slots, out, then fixed12's arrays, then x's descriptor
    x, b, ring, o = _plan.slots(4)
    lo, _code, base, eidx, ehi = _plan.slots(5, 4, fixed=True)
    x_d = _plan.Slot(9)
    inner = triton.cdiv(n, cfg.bn) if cfg.x_outer else mt  # the tiles of the inner index (_ws_tile)
    tile = _plan.Launch(_ws_kernel, (progs,), (lo_d, co_d, x_d, x, base, o, b, ring, cnt, m, n, kp, stride, steps,
                                               inner, work), dict(
        BN=cfg.bn, BT=cfg.bm, NS=cfg.stages, LL=ll, CL=cl, ML=mma, AL=a_op, OL=ol, HAS_BIAS=bias is not None,
        EXC=inline, EL=exc_layout(cw, xt) if inline else None, rowptr_ptr=prep.rowptr, eidx_ptr=eidx,
        ehi_ptr=ehi, lo8_ptr=prep.vals if pre else lo, CS=C.COUNTER_SLOTS, NBYTES=slot_bytes(cfg.bn, cfg.bm), PIPE=cfg.pipe, XE=cfg.exc_chunk,
        XT=xt, PRE=pre, CORR=corr, corr_ptr=_plan.Slot(10) if corr else None, XO=cfg.x_outer, HV=cfg.halves,
        NC=2 if cfg.wg_parts else 1, WG_REGS=232, num_warps=cw,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {})))
    tx = xt or corr  # the exceptions' x transposed ([K, M]), written by x's permutation from the same load
    permute = _permute_launch(m, k, stride, tx)
    exc = (exceptions_launch(x2, p, prep, add=False, xt=True, bm=min(128, max(16, triton.next_power_of_2(m))))
           if corr else None)
    shape, dev, bt = (2 * progs, cfg.bn * cfg.bm), x2.device, cfg.bm

    def run(x2, bias, out, arrays):
        if copy:
            x2 = x2.contiguous()
        xp = torch.empty(m, k, dtype=x2.dtype, device=dev)
        if tx:  # the exceptions' x: [K, M], a column's rows contiguous
            xtr = torch.empty(k, m, dtype=x2.dtype, device=dev)
            permute(x2, xp, xtr)
            x2 = xtr
        else:
            permute(x2, xp)
        if corr:
            fix = torch.empty((1, m, n), dtype=torch.float32, device=dev)
            exc(fix, x2, *arrays)
            tile(x2, bias if bias is not None else out, torch.empty(shape, dtype=torch.float32, device=dev), out,
                 *arrays, TensorDescriptor.from_tensor(xp, [bt, 64], xsl), fix)
            return out
        ring_slots = torch.empty(shape, dtype=torch.float32, device=dev)
        x_d = TensorDescriptor.from_tensor(xp, [bt, 64], xsl)
        tile(x2, bias if bias is not None else out, ring_slots, out, *arrays, x_d)
        return out

    return run


class WsKernel(Kernel):
    """The warp-specialized wgmma tile: a Hopper GPU with Gluon's TMA and mbarriers, K (no padded
    columns) a multiple of 128."""

    name = "fixed12_wgmma_warpspec"
    layout = "fixed12"
    Config = WsConfig

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if not ok:
            return ok, why
        if not {"wgmma", "tma"} <= device.features:
            return False, "needs Gluon's warpgroup MMA and TMA on a Hopper GPU (sm_90)"
        if problem.k != problem.kp or problem.k % BK:
            return False, f"needs K a multiple of {BK} (no padded columns), got K = {problem.k}"
        need = shared_bytes(config)
        if need > SHARED_MAX:
            return False, f"needs {need} B of shared memory a program (its ring and exception step), over {SHARED_MAX}"
        return True, ""

    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        C.check_launch_shapes(cls.name, x2, tuple(packed.shape), out, bias)  # a direct launch read, wrote past them
        return launch(x2, packed, bias, config, out)

    @classmethod
    def plan(cls, x2, packed, bias, config):
        return plan(x2, packed, bias, config)
