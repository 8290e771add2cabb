"""fixed12 decode-step product on wgmma with a warp-specialized TMA ring (Hopper only).

The wgmma tile of ``fixed12_wg`` loads each K step's plane words into registers and its x tile
through registers into shared memory, in the same warps that decode and multiply: one warpgroup
waits on every load in turn, and measured on the H200 it reads DRAM at 34-40% of peak at M = 64
(benchmarks/history/2026-12-01-kernels-h200.md, run 67), where cuBLAS's warp-specialized kernel
reaches 81%. Here one
extra warp only issues TMA copies (the plane words of ``stages`` K steps and their x tiles) into
a shared-memory ring guarded by mbarriers, and the warpgroup only reads words from shared
memory, decodes them and issues the MMAs, so the loads of the next steps are always in flight.

Same product as ``fixed12_wg``: the decoded tile is wgmma's register A operand in the MMA's
slot order (``fixed12_wg.DECODE_ORDER``), here in two 64-column halves a step (a TMA box of bf16
x is at most 64 columns wide under 128-byte swizzling), and x is B from shared memory in the same
slot order. A TMA copy cannot permute columns, so ``launch`` permutes x once (``permute_x``, a
copy of the [M, K] activations) before the kernel. Rows past M or N are TMA's zero fill.

The grid is persistent and stream-K: each program multiplies an equal range of all tiles' K
steps, across tile boundaries; a tile shared by several programs is summed by the last of them
to finish, in program order (``_ws_finish``), and the exceptions are added where a tile is
finished. Measured on the H200 (benchmarks/history/2026-12-01-kernels-h200.md, runs 73-84): the TMA
stream alone reads
DRAM at 73-79% of peak, the whole kernel at 50-59%; it is the default on lm_heads at M = 3-64
and gate/up at M = 33-64. CUDA only, Hopper only (Gluon has no interpreter; the twin for tests
is ``tc``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from glyd.kernels import _common as C
from glyd.kernels._interp import isolated
from glyd.kernels import fixed12_wg as WG

BK = 128  # columns a K step: 32 lo words and 16 code words a row, two 64-column x boxes
#: A measurement knob (benchmarks/probe_ws.py), never set in use: 1 times the TMA stream alone
#: (the warpgroup frees each slot once filled; the output is garbage), 2 the same without x, 3
#: the warpgroup alone (it decodes and multiplies whatever the ring's slots hold, waiting for no
#: copy; the TMA warp issues none; the output is garbage), 4 both halves at once with no handoff
#: (the TMA warp refills a slot once its own last copy there landed; the warpgroup computes as in
#: 3), 5 the full kernel without the warpgroup's per-step proxy fence (timing only).
PROBE_LOADS = 0
HALF_ORDER = gl.constexpr((0, 3, 4, 6, 1, 2, 5))  # [row, g, a, i1, i0, j, h] -> slots (i1 i0 h g a j)


@gluon.jit
def _ws_tile(g, S, MT, BN: gl.constexpr, BT: gl.constexpr):
    # global K step g -> (tile, step in the tile, first weight row, first x row); x tiles inner
    t = g // S
    return t, g - t * S, (t // MT) * BN, (t % MT) * BT


@gluon.jit
def _ws_loader(lo_desc, co_desc, x_desc, lo_s, co_s, x_s, ready, empty, g0, g1, S, MT, BN: gl.constexpr,
               BT: gl.constexpr, NS: gl.constexpr, LOADS: gl.constexpr, NBYTES: gl.constexpr):
    # the TMA warp: this program's K steps g0..g1 (across tiles) into the ring, each slot once the
    # consumer freed it (LOADS 2, a probe: the plane words only; LOADS 3: nothing); NBYTES: the
    # bytes a slot's copies bring (lo, code and, but for LOADS 2, two x boxes)
    n = g1 - g0
    if LOADS == 3:
        n = 0
    for i in range(n):
        b = i % NS
        if LOADS == 4:
            # no handoff: reuse a slot once this warp's own previous copy into it landed
            if i >= NS:
                mbarrier.wait(ready.index(b), ((i // NS) - 1) & 1)
        else:
            # a fresh mbarrier counts as having completed the phase before its first: the first
            # NS waits (parity 1) pass at once
            mbarrier.wait(empty.index(b), ((i // NS) & 1) ^ 1)
        _, st, n0, m0 = _ws_tile(g0 + i, S, MT, BN, BT)
        bar = ready.index(b)
        mbarrier.expect(bar, NBYTES)
        tma.async_copy_global_to_shared(lo_desc, [n0, st * 32], bar, lo_s.index(b))
        tma.async_copy_global_to_shared(co_desc, [n0, st * 16], bar, co_s.index(b))
        if LOADS != 2:
            tma.async_copy_global_to_shared(x_desc, [m0, st * 128], bar, x_s.index(2 * b))
            tma.async_copy_global_to_shared(x_desc, [m0, st * 128 + 64], bar, x_s.index(2 * b + 1))
    if LOADS == 4:
        # the last copies land before the program's shared memory goes away
        for j in range(gl.maximum(n - NS, 0), n):
            mbarrier.wait(ready.index(j % NS), (j // NS) & 1)


@gluon.jit
def _ws_half(lw, nib, b4, BN: gl.constexpr, AL: gl.constexpr):
    # one 64-column half of a step's decoded tile ([BN, 64] bf16, slot order) as the A operand
    w = WG._wg_pairs(lw, nib, b4)  # [BN, 16 (g a i1 i0), 2 (j), 2 (h)]
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
               CS: gl.constexpr, CI: gl.constexpr = 0, CONS: gl.constexpr = 1):
    # the end of this program's part of tile t (for consumer CI of CONS: its BN rows from n0). A
    # whole tile: exceptions, bias, bf16 out. A part: store the fp32 partial in this program's
    # work slot (2 (CONS pid + CI) if it began at the program's first step, else that + 1),
    # count in; the last of the tile's programs to count in sums every part in program order
    # (the same bits whoever is last), then finishes the tile.
    ts = t * S
    q0 = _ws_first(ts, P, W)
    q1 = _ws_first(ts + S - 1, P, W)
    r = gl.arange(0, BN, layout=gl.SliceLayout(1, ML))[:, None]
    c = gl.arange(0, BT, layout=gl.SliceLayout(0, ML))[None, :]
    done = q0 == q1
    if not done:
        cnt = cnt_ptr + (CONS * t + CI) * CS
        slot = 2 * (CONS * pid + CI) + (g0 <= ts).to(gl.int32)
        gl.store(work_ptr + slot * (BN * BT) + r * BT + c, acc)
        gl.thread_barrier()  # every thread's partial stores before the releasing count
        old = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        done = old == q1 - q0
        if done:
            gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")  # zero for the next launch
            acc = gl.zeros([BN, BT], gl.float32, ML)
            for q in range(q0, q1 + 1):
                qs = 2 * (CONS * q + CI) + ((q * W) // P <= ts).to(gl.int32)
                acc += gl.load(work_ptr + qs * (BN * BT) + r * BT + c, cache_modifier=".cg")
    if done:
        if EXC:
            e0 = gl.load(rowptr_ptr + n0)
            e1 = gl.load(rowptr_ptr + gl.minimum(n0 + BN, N))
            acc = WG._wg_exceptions(acc, x_ptr, m0, M, stride_xm, eidx_ptr, ehi_ptr, lo8_ptr, KP, base_ptr, n0, e0,
                                    e1, BN, BT, ML, EL)
        o = gl.convert_layout(acc, OL)
        rr = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, OL))[:, None]
        mm = m0 + gl.arange(0, BT, layout=gl.SliceLayout(0, OL))[None, :]
        if HAS_BIAS:
            o += gl.load(bias_ptr + rr, mask=rr < N, other=0.0).to(gl.float32)
        gl.store(out_ptr + mm * N + rr, o.to(gl.bfloat16), mask=(rr < N) & (mm < M))


@gluon.jit
def _ws_step_mmas(lo_s, co_s, x_s, ready, b, ph, acc, b4, BN: gl.constexpr, LL: gl.constexpr, CL: gl.constexpr,
                  AL: gl.constexpr, R0: gl.constexpr = 0, SPLIT: gl.constexpr = False, NOWAIT: gl.constexpr = False):
    # one K step from ring slot b: wait for it (not with NOWAIT: the compute-only probe), read and
    # decode its words (rows R0 .. R0 + BN of the slot where SPLIT, two consumers sharing it),
    # issue its two MMAs
    if not NOWAIT:
        mbarrier.wait(ready.index(b), ph)
    ls = lo_s.index(b)
    cs = co_s.index(b)
    if SPLIT:
        ls = ls.slice(R0, BN)
        cs = cs.slice(R0, BN)
    lw = ls.load(LL)  # [BN, 32]: words 16 g + 8 hh + 4 a + i of the lane's (a, g)
    cw = cs.load(CL).to(gl.uint32, bitcast=True)
    lw = gl.reshape(lw.to(gl.uint32, bitcast=True), [BN, 2, 2, 8])  # [row, g, hh, (a i)]
    l0, l1 = gl.split(gl.reshape(gl.permute(lw, (0, 1, 3, 2)), [BN, 16, 2]))
    cw = gl.convert_layout(cw, l0.type.layout)
    a0 = _ws_half(l0, cw, b4, BN, AL)
    acc = warpgroup_mma(a0, x_s.index(2 * b).permute((1, 0)), acc, is_async=True)
    a1 = _ws_half(l1, cw >> 4, b4, BN, AL)
    acc = warpgroup_mma(a1, x_s.index(2 * b + 1).permute((1, 0)), acc, is_async=True)
    return acc, a0, a1


@gluon.jit
def _ws_consumer(lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4, x_ptr, out_ptr, bias_ptr, work_ptr, cnt_ptr,
                 M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, BN: gl.constexpr,
                 BT: gl.constexpr, NS: gl.constexpr, LL: gl.constexpr, CL: gl.constexpr, ML: gl.constexpr,
                 AL: gl.constexpr, OL: gl.constexpr, HAS_BIAS: gl.constexpr, EXC: gl.constexpr, EL: gl.constexpr,
                 CS: gl.constexpr, LOADS: gl.constexpr, CI: gl.constexpr = 0, CONS: gl.constexpr = 1):
    # a warpgroup: words from the ring, decode, MMA, free the slot; at the end of each tile's
    # part, finish it (_ws_finish). With CONS consumer warpgroups (each its own partition), this
    # one (CI) takes rows CI BH .. (CI + 1) BH of every BN-row tile, and a slot is free once all
    # of them arrived. LOADS > 0 (a probe of the TMA stream alone): free each slot as soon as it
    # is filled, compute nothing
    BH: gl.constexpr = BN // CONS
    pid = gl.program_id(0)
    acc = gl.zeros([BH, BT], gl.float32, ML)
    for i in range(g1 - g0):
        b = i % NS
        if (LOADS == 1) | (LOADS == 2):
            mbarrier.wait(ready.index(b), (i // NS) & 1)
            mbarrier.arrive(empty.index(b))
        else:
            acc, a0, a1 = _ws_step_mmas(lo_s, co_s, x_s, ready, b, (i // NS) & 1, acc, b4, BH, LL, CL, AL, CI * BH,
                                        CONS > 1, (LOADS == 3) | (LOADS == 4))
            acc, a0, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a0, a1))
            # every warp's words of this slot were read before its part of the MMAs was issued, so
            # the MMAs being done means the whole slot is free; the fence orders those generic-proxy
            # reads before the TMA's next writes
            if LOADS != 5:
                fence_async_shared()
            if (LOADS != 3) & (LOADS != 4):
                mbarrier.arrive(empty.index(b))
            g = g0 + i
            t, st, n0, m0 = _ws_tile(g, S, MT, BN, BT)
            if (st == S - 1) | (g == g1 - 1):
                _ws_finish(acc, t, n0 + CI * BH, m0, g0, P, W, S, pid, x_ptr, out_ptr, bias_ptr, work_ptr, cnt_ptr, M,
                           N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, BH, BT, ML, OL,
                           HAS_BIAS, EXC, EL, CS, CI, CONS)
                acc = gl.zeros([BH, BT], gl.float32, ML)
    return (acc, )  # warp_specialize takes the default partition's results as a tuple


@gluon.jit
def _ws_consumer_worker(lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4, x_ptr, out_ptr, bias_ptr, work_ptr,
                        cnt_ptr, M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr,
                        BN: gl.constexpr, BT: gl.constexpr, NS: gl.constexpr, LL: gl.constexpr, CL: gl.constexpr,
                        ML: gl.constexpr, AL: gl.constexpr, OL: gl.constexpr, HAS_BIAS: gl.constexpr,
                        EXC: gl.constexpr, EL: gl.constexpr, CS: gl.constexpr, LOADS: gl.constexpr, CI: gl.constexpr,
                        CONS: gl.constexpr):
    # a second consumer warpgroup as a worker partition (Config.consumers 2): a worker returns
    # nothing
    _ws_consumer(lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4, x_ptr, out_ptr, bias_ptr, work_ptr, cnt_ptr,
                 M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, BN, BT, NS, LL, CL, ML, AL,
                 OL, HAS_BIAS, EXC, EL, CS, LOADS, CI, CONS)


@gluon.jit
def _ws_consumer_pipe(lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4, x_ptr, out_ptr, bias_ptr, work_ptr,
                      cnt_ptr, M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr,
                      BN: gl.constexpr, BT: gl.constexpr, NS: gl.constexpr, LL: gl.constexpr, CL: gl.constexpr,
                      ML: gl.constexpr, AL: gl.constexpr, OL: gl.constexpr, HAS_BIAS: gl.constexpr,
                      EXC: gl.constexpr, EL: gl.constexpr, CS: gl.constexpr):
    # _ws_consumer with one step's MMAs in flight while the next step decodes (Config.pipe): a
    # loop over this program's tile parts, each an inner loop over its steps with no branch in it
    # (a wait inside a branch made ptxas wait for every wgmma), then the part's last MMAs and
    # its finish. A slot is freed one step after its MMAs were issued.
    pid = gl.program_id(0)
    i = g0 * 0  # steps done by this program (ring slot and phase)
    g = g0
    while g < g1:
        t = g // S
        ge = gl.minimum((t + 1) * S, g1)  # this part: steps g .. ge of tile t
        acc = gl.zeros([BN, BT], gl.float32, ML)
        b = i % NS
        acc, p0, p1 = _ws_step_mmas(lo_s, co_s, x_s, ready, b, (i // NS) & 1, acc, b4, BN, LL, CL, AL)
        # waits for nothing (two MMAs in flight are allowed): gives the loop its accumulator type
        acc, p0, p1 = warpgroup_mma_wait(num_outstanding=2, deps=(acc, p0, p1))
        for gg in range(g + 1, ge):
            j = i + gg - g
            acc, a0, a1 = _ws_step_mmas(lo_s, co_s, x_s, ready, j % NS, (j // NS) & 1, acc, b4, BN, LL, CL, AL)
            # the previous step's two MMAs are done: its slot is free (see _ws_consumer)
            acc, p0, p1 = warpgroup_mma_wait(num_outstanding=2, deps=(acc, p0, p1))
            fence_async_shared()
            mbarrier.arrive(empty.index((j + NS - 1) % NS))
            p0 = a0
            p1 = a1
        acc, p0, p1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p0, p1))
        i += ge - g
        fence_async_shared()
        mbarrier.arrive(empty.index((i + NS - 1) % NS))
        _ws_finish(acc, t, (t // MT) * BN, (t % MT) * BT, g0, P, W, S, pid, x_ptr, out_ptr, bias_ptr, work_ptr,
                   cnt_ptr, M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, BN, BT, ML, OL,
                   HAS_BIAS, EXC, EL, CS)
        g = ge
    return (gl.zeros([BN, BT], gl.float32, ML), )


@gluon.jit
def _ws_kernel(lo_desc, co_desc, x_desc, x_ptr, base_ptr, out_ptr, bias_ptr, work_ptr, cnt_ptr, M, N, KP, stride_xm,
               S, MT, W, BN: gl.constexpr, BT: gl.constexpr, NS: gl.constexpr, LL: gl.constexpr, CL: gl.constexpr,
               ML: gl.constexpr, AL: gl.constexpr, OL: gl.constexpr, HAS_BIAS: gl.constexpr,
               EXC: gl.constexpr = False, EL: gl.constexpr = None, rowptr_ptr=None, eidx_ptr=None, ehi_ptr=None,
               lo8_ptr=None, CS: gl.constexpr = 1, LOADER_REGS: gl.constexpr = 24, LOADS: gl.constexpr = 0,
               PIPE: gl.constexpr = 0, NBYTES: gl.constexpr = 0, CONS: gl.constexpr = 1,
               CONS_REGS: gl.constexpr = 0):
    # out (bf16 [M, N], + bias) = x @ W^T, persistent over W = tiles x S K steps (stream-K):
    # program p multiplies global steps p W / P .. (p + 1) W / P (tile-major, x tiles inner), so
    # every program has the same number of steps; a tile shared by several programs is summed
    # by the last of them through fp32 work slots (_ws_finish). x here is the slot-permuted copy
    # (x_desc); x_ptr the original, for the exceptions.
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    g0 = (pid * W) // P
    g1 = ((pid + 1) * W) // P
    b4 = gl.load(base_ptr).to(gl.uint32) * 0x01010101
    lo_s = gl.allocate_shared_memory(gl.int32, [NS, BN, 32], lo_desc.layout)
    co_s = gl.allocate_shared_memory(gl.int32, [NS, BN, 16], co_desc.layout)
    x_s = gl.allocate_shared_memory(gl.bfloat16, [2 * NS, BT, 64], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NS):
        mbarrier.init(ready.index(j), count=1)
        mbarrier.init(empty.index(j), count=CONS)  # every consumer warpgroup frees the slot
    fence_async_shared()
    if CONS == 2:
        # two consumer warpgroups, each its own partition (so neither waits on the other's step),
        # 64 rows each of every 128-row tile, sharing the ring's x boxes
        gl.warp_specialize([
            (_ws_consumer, (lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4, x_ptr, out_ptr, bias_ptr, work_ptr,
                            cnt_ptr, M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, BN, BT, NS,
                            LL, CL, ML, AL, OL, HAS_BIAS, EXC, EL, CS, LOADS, 0, CONS)),
            (_ws_loader, (lo_desc, co_desc, x_desc, lo_s, co_s, x_s, ready, empty, g0, g1, S, MT, BN, BT, NS, LOADS,
                          NBYTES)),
            (_ws_consumer_worker, (lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4, x_ptr, out_ptr, bias_ptr,
                                   work_ptr, cnt_ptr, M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr,
                                   base_ptr, BN, BT, NS, LL, CL, ML, AL, OL, HAS_BIAS, EXC, EL, CS, LOADS, 1, CONS)),
        ], [1, 4], [LOADER_REGS, CONS_REGS])
    elif PIPE:
        gl.warp_specialize([
            (_ws_consumer_pipe, (lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4, x_ptr, out_ptr, bias_ptr,
                                 work_ptr, cnt_ptr, M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr,
                                 base_ptr, BN, BT, NS, LL, CL, ML, AL, OL, HAS_BIAS, EXC, EL, CS)),
            (_ws_loader, (lo_desc, co_desc, x_desc, lo_s, co_s, x_s, ready, empty, g0, g1, S, MT, BN, BT, NS, LOADS,
                          NBYTES)),
        ], [1], [LOADER_REGS])
    else:
        gl.warp_specialize([
            (_ws_consumer, (lo_s, co_s, x_s, ready, empty, g0, g1, P, W, S, MT, b4, x_ptr, out_ptr, bias_ptr, work_ptr,
                            cnt_ptr, M, N, KP, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, BN, BT, NS,
                            LL, CL, ML, AL, OL, HAS_BIAS, EXC, EL, CS, LOADS)),
            (_ws_loader, (lo_desc, co_desc, x_desc, lo_s, co_s, x_s, ready, empty, g0, g1, S, MT, BN, BT, NS, LOADS,
                          NBYTES)),
        ], [1], [LOADER_REGS])


@functools.lru_cache(maxsize=None)
def layouts(bn: int, bt: int, warps: int = 4):
    """(lo words, code words, accumulator, A operand, output) register layouts and (lo, code, x)
    shared layouts for bn weight rows and bt x rows. Lo words [bn, 32]: a thread holds words
    16 g + 8 hh + 4 a + i (i = 0-3, hh = 0-1) of two rows 8 apart, (a, g) its lane's two low
    bits, as ``fixed12_wg`` loads them; code words [bn, 16]: 8 g + 4 a + i."""
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


@isolated
@triton.jit
def _permute_x_kernel(x_ptr, out_ptr, M, stride_xm, K: tl.constexpr, BM: tl.constexpr):
    # out[m, 128 s + slot] = x[m, 128 s + col(slot)]: slot bits (hh i1 i0 h g a j), high to low,
    # are column bits (g hh a i1 i0 h j); a program does BM rows of one 128-column step
    rows = tl.program_id(0) * BM + tl.arange(0, BM)[:, None]
    slot = tl.arange(0, 128)[None, :]
    col = (((slot >> 2) & 1) << 6 | ((slot >> 6) & 1) << 5 | ((slot >> 1) & 1) << 4 | ((slot >> 5) & 1) << 3
           | ((slot >> 4) & 1) << 2 | ((slot >> 3) & 1) << 1 | (slot & 1))
    c0 = tl.program_id(1) * 128
    v = tl.load(x_ptr + rows.to(tl.int64) * stride_xm + c0 + col, mask=rows < M)
    tl.store(out_ptr + rows.to(tl.int64) * K + c0 + slot, v, mask=rows < M)


# x: bf16 [M, K] -> bf16 [M, K], each 128-column step's columns in wgmma slot order
def permute_x_torch(x2: torch.Tensor) -> torch.Tensor:
    """x with each 128-column K step in the MMA's slot order (``fixed12_wg.X_ORDER``), contiguous
    (the torch twin of ``permute_x``)."""
    m, k = x2.shape
    if k % BK:
        raise ValueError(f"permute_x needs K a multiple of {BK}, got {k}")
    order = [0, 1] + [d + 1 for d in WG.X_ORDER.value[1:]]
    return x2.reshape(m, k // BK, 2, 2, 2, 2, 2, 2, 2).permute(order).reshape(m, k)


# x: bf16 [M, K] (unit column stride), K a multiple of 128 -> bf16 [M, K], contiguous
def permute_x(x2: torch.Tensor) -> torch.Tensor:
    """``permute_x_torch`` as one small Triton kernel (CUDA; the torch twin elsewhere): the torch
    permutation takes 3.9-5.4 us at M = 16-64 on the H200
    (benchmarks/history/2026-12-01-kernels-h200.md, run 75)."""
    m, k = x2.shape
    if k % BK:
        raise ValueError(f"permute_x needs K a multiple of {BK}, got {k}")
    if x2.device.type != "cuda" or C.interpreting() or x2.stride(1) != 1:
        return permute_x_torch(x2)
    out = torch.empty(m, k, dtype=x2.dtype, device=x2.device)
    # 16 rows a program at every M: 64 took 6.0 us at M = 64 against 2.0 at M = 16 (run 100)
    _permute_x_kernel[(triton.cdiv(m, 16), k // BK)](x2, out, m, x2.stride(0), K=k, BM=16, num_warps=4)
    return out


def _descs(p, bn: int, bt: int, warps: int, xp: torch.Tensor):
    a = p.arrays
    *_, (lsl, csl, xsl) = layouts(bn, bt, warps)
    lo = a["lo"].view(torch.int32)
    co = a["code"].view(torch.int32)
    return (TensorDescriptor.from_tensor(lo, [bn, 32], lsl), TensorDescriptor.from_tensor(co, [bn, 16], csl),
            TensorDescriptor.from_tensor(xp, [bt, 64], xsl))


def consumer_regs(maxnreg: int) -> int:
    """Registers a thread of the second consumer warpgroup (``Config.consumers`` 2) under a kernel
    cap of ``maxnreg``: the kernel's 12 warps (consumer, loader padded to a warpgroup, consumer)
    get ``maxnreg`` each, the loader's warpgroup gives back all but 24, and the two consumers share
    the rest (a multiple of 8, at most 256)."""
    return min(256, (maxnreg * 12 * 32 - 24 * 128) // 256 // 8 * 8)


def slot_bytes(bn: int, bt: int, loads: int = 0) -> int:
    """Bytes the TMA copies of one ring slot bring: [bn, 32] lo and [bn, 16] code words, and two
    [bt, 64] bf16 x boxes (none for the words-only probe, ``loads`` 2)."""
    return bn * 32 * 4 + bn * 16 * 4 + (0 if loads == 2 else 2 * bt * 64 * 2)


# x: bf16 [M, K]; packed: fixed12 [N, K], K == Kp; bias: [N] or None; out: bf16 [M, N] (written) -> out
def launch(x2: torch.Tensor, p, bias, cfg: C.Config, prep, out: torch.Tensor) -> torch.Tensor:
    m, k, n, a, kp = C.gluon_launch_checks(x2, p, "ws", BK, hopper="wgmma and TMA")
    for name in ("lo", "code"):
        if a[name].data_ptr() % 16 or a[name].stride(0) % 16:
            raise ValueError(f"Config(ws=True) needs the {name} plane 16-byte aligned for TMA")
    if x2.stride(1) != 1 or x2.stride(0) % 8 or x2.data_ptr() % 16:
        x2 = x2.contiguous()
    xp = permute_x(x2)
    steps = kp // BK
    mt = triton.cdiv(m, cfg.bm)
    work = triton.cdiv(n, cfg.bn) * mt * steps  # K steps in all
    # programs: ``split`` if given (tests), else ``waves`` an SM; at most one a step
    progs = min(work, cfg.split or cfg.waves * C.sm_count(x2.device))
    inline = prep.nexc > 0  # Config checks exc_tile: the exceptions are added where a tile is finished
    tiles = triton.cdiv(n, cfg.bn) * mt
    cons = cfg.consumers
    bh = cfg.bn // cons  # each consumer warpgroup's rows of a tile
    slots = torch.empty(2 * progs * cons, bh * cfg.bm, dtype=torch.float32, device=x2.device)
    cnt = C.counters(x2.device, tiles * cons)
    lo_d, co_d, x_d = _descs(p, cfg.bn, cfg.bm, cfg.warps, xp)
    ll, cl, mma, a_op, ol, _ = layouts(bh, cfg.bm, cfg.warps)
    _ws_kernel[(progs,)](lo_d, co_d, x_d, x2, a["base"], out, bias if bias is not None else out, slots, cnt, m, n, kp,
                         x2.stride(0), steps, mt, work, BN=cfg.bn, BT=cfg.bm, NS=cfg.stages, LL=ll, CL=cl, ML=mma,
                         AL=a_op, OL=ol, HAS_BIAS=bias is not None, EXC=inline,
                         EL=WG.exc_layout(cfg.warps) if inline else None, rowptr_ptr=prep.rowptr,
                         eidx_ptr=a["exc_idx"], ehi_ptr=a["exc_hi"], lo8_ptr=a["lo"], CS=C.COUNTER_SLOTS,
                         LOADS=PROBE_LOADS, PIPE=int(cfg.pipe), NBYTES=slot_bytes(cfg.bn, cfg.bm, PROBE_LOADS),
                         CONS=cons, CONS_REGS=consumer_regs(cfg.maxnreg) if cons > 1 else 0,
                         num_warps=cfg.warps, **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}))
    return out
