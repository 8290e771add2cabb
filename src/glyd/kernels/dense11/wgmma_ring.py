"""``dense11_wgmma`` with a ring of shared-memory stages (``Dense11WgConfig.stages``): each step's code and sm words
and its x tile copied by cp.async ``stages`` steps ahead, so the words wait in shared memory, not in registers,
and several steps' loads are in flight while a step decodes (issue 35: on an H100 the register-prefetch tile's warps
waited on global loads 42% of the time at M = 16, history/2026-12-07-h100-32.md).

x arrives in slot order (``wgmma_decode``'s module docstring): slot pair p = 32 h + 8 q + 4 T + c of a step holds
column pair 16 c + 8 h + 2 q + T, copied 4 bytes at a time into an int32 view of wgmma's swizzled B tile (the same
bytes as the bf16 [BT, 128] tile: 128-byte lines, 16-byte chunks swizzled by row), so x never passes through
registers. Each thread copies the code and sm words it decodes (the run and lane-word layouts): cp.async's own
wait orders them; x, read by the MMA from every thread's copies, waits for a barrier a step. A step's escape windows
are loaded right after the step before's MMA, from the next step's code words (landed: the ring's wait leaves
``stages - 2`` steps in flight). A step's copies are issued once the MMA ``stages`` steps before it has read its
stage (with ``pipe``, a step's MMA left in flight beside the next step's decode, ``stages - 1`` steps ahead).
Exceptions, the fixup and the store are the register tile's (``wgmma.py``).

``XP`` (``Dense11WgConfig.xperm``): x permuted into slot order once a call (``permute_x``: one gather of the
[M, K] activations), so the ring copies it 16 bytes at a time (at 64 x rows 8 copies a thread a step, not 32), and
the tile may hold 128 or 256 x rows (wgmma's N): each weight decoded once for that many rows (prompts, issue 35).
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from glyd.kernels.dense11.wgmma_decode import BK, BN, _block_start, _finish, _lanes, _step_window, _tile, _u

RING = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))  # the word rings: each thread reads its own copies
XRING = gl.constexpr(gl.NVMMASharedLayout(128, 32))  # x's ring as int32 pairs: bf16 [BT, 128]'s bytes, 128-byte swizzle


@gluon.jit
def _issue(r0, r1, r2, ra, rb_, rx, code_ptr, sm_ptr, xb_ptr, c_off, s_off, xpo, st, RUNS, S: gl.constexpr,
           XP: gl.constexpr):
    # step st's code words (3 planes of [BN, 4] runs), sm words (halves a and b, [BN, 16] lane words) and x tile
    # ([BT, 64] slot pairs from x as int32, or XP [BT, 128] bf16 from x in slot order) copied into stage st % S of
    # their rings (one allocation each: the barrier pass sees no write after write between them)
    i = st % S
    b = st // 8
    rb = gl.minimum(RUNS - 32 * b, 32)  # runs of block b (the last may be short)
    cw = code_ptr + c_off + 96 * b + (st % 8) * 4
    async_copy.async_copy_global_to_shared(r0.index(i), cw)
    async_copy.async_copy_global_to_shared(r1.index(i), cw + rb)
    async_copy.async_copy_global_to_shared(r2.index(i), cw + 2 * rb)
    sp = sm_ptr + s_off + 256 * b + 16 * (st % 8)
    async_copy.async_copy_global_to_shared(ra.index(i), sp)
    async_copy.async_copy_global_to_shared(rb_.index(i), sp + 4 * rb)
    async_copy.async_copy_global_to_shared(rx.index(i), xb_ptr + xpo + st * (BK if XP else BK // 2))


@gluon.jit
def _pair_column(p):
    # the column pair held by slot pair p = 32 h + 8 q + 4 T + c of a step: 16 c + 8 h + 2 q + T
    return 16 * (p % 4) + 8 * (p // 32) + 2 * ((p // 8) % 4) + (p // 4) % 2


@gluon.jit
def _next_window(r0, r1, r2, st, run, cc, esc_ptr, NESCW, S: gl.constexpr, RL: gl.constexpr):
    # step st's code words (landed; each thread reads the words it copied), its escape ranks (run: the rows' index
    # before it) and window words: (c0, c1, c2, rank, run past the step, w0, w1)
    i = st % S
    c0 = _u(r0.index(i).load(RL))
    c1 = _u(r1.index(i).load(RL))
    c2 = _u(r2.index(i).load(RL))
    rank, run, w0, w1 = _step_window(c0, c1, c2, run, cc, esc_ptr, NESCW)
    return c0, c1, c2, rank, run, w0, w1


@gluon.jit(do_not_specialize=["NESCW", "TH0", "TH1", "TL0", "TL1", "HA0", "HA1", "HB0", "HB1", "LA0", "LA1", "LB0",
                              "LB1"])
def _d11_wg_ring_kernel(x_ptr, xp_ptr, code_ptr, sm_ptr, esc_ptr, ebase_ptr, eoff_ptr, rowptr_ptr, eidx_ptr, vals_ptr,
                        part_ptr, out_ptr, bias_ptr, cnt_ptr, M, N, KP, NBR, NESCW, K_SPLIT, stride_xm, TH0, TH1, TL0,
                        TL1, HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1, BT: gl.constexpr, WL: gl.constexpr,
                        RL: gl.constexpr, XL: gl.constexpr, ML: gl.constexpr, AL: gl.constexpr, XSL: gl.constexpr,
                        OL: gl.constexpr, OUT: gl.constexpr, HAS_BIAS: gl.constexpr, EXC: gl.constexpr,
                        S: gl.constexpr, LEAD: gl.constexpr, PIPE: gl.constexpr = False, CS: gl.constexpr = 1,
                        XP: gl.constexpr = False):
    # as wgmma._d11_wg_kernel (OUT, the split, rows past M or N), its words and x through a ring of S stages, each
    # step's copies issued LEAD steps ahead (S; PIPE: S - 1, a step's MMA left in flight beside the next step's decode
    # holds its stage a step longer). XL: the [BT, 64] slot pairs' copy layout, stride_xm even (x read as int32
    # pairs); XP: xp_ptr is x in slot order ([M, KP] contiguous), XL the [BT, 128] tile's 16-byte copy layout
    pid_k = gl.program_id(1)
    c_off, s_off, nr, cc, q, th0, th1, tl0, tl1 = _tile(gl.program_id(0), N, KP, TH0, TH1, TL0, TL1, BN, WL, RL)
    runs = KP // 32
    m0 = gl.program_id(2) * BT
    t = gl.minimum(m0 + gl.arange(0, BT, layout=gl.SliceLayout(1, XL)), M - 1)
    if XP:  # x already in slot order
        xpo = t[:, None] * KP + gl.arange(0, BK, layout=gl.SliceLayout(0, XL))[None, :]
        xb_ptr = xp_ptr
        rx = gl.allocate_shared_memory(gl.bfloat16, [S, BT, BK], XSL)
    else:
        p = gl.arange(0, BK // 2, layout=gl.SliceLayout(0, XL))  # slot pair 32 h + 8 q + 4 T + c
        xpo = t[:, None] * (stride_xm // 2) + _pair_column(p)[None, :]
        xb_ptr = x_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
        rx = gl.allocate_shared_memory(gl.int32, [S, BT, BK // 2], XRING)
    r0 = gl.allocate_shared_memory(gl.int32, [S, BN, 4], RING)
    r1 = gl.allocate_shared_memory(gl.int32, [S, BN, 4], RING)
    r2 = gl.allocate_shared_memory(gl.int32, [S, BN, 4], RING)
    ra = gl.allocate_shared_memory(gl.int32, [S, BN, 16], RING)
    rb = gl.allocate_shared_memory(gl.int32, [S, BN, 16], RING)
    acc = gl.zeros([BN, BT], gl.float32, ML)
    s0 = (pid_k * K_SPLIT) // BK
    s1 = gl.minimum(pid_k * K_SPLIT + K_SPLIT, KP) // BK
    for j in gl.static_range(LEAD):  # the first LEAD steps in flight (a group a step, empty past the split)
        if s0 + j < s1:
            _issue(r0, r1, r2, ra, rb, rx, code_ptr, sm_ptr, xb_ptr, c_off, s_off, xpo, s0 + j, runs, S, XP)
        async_copy.commit_group()
    async_copy.wait_group(LEAD - 1)  # step s0 landed
    run = _block_start(ebase_ptr, eoff_ptr, nr * NBR + s0 // 8) + cc * 0  # s0 starts a block
    ap = gl.zeros([BN, BK], gl.bfloat16, AL)  # the A operand of the MMA in flight (PIPE)
    c0, c1, c2, rank, run, w0, w1 = _next_window(r0, r1, r2, s0, run, cc, esc_ptr, NESCW, S, RL)
    for st in range(s0, s1):
        i = st % S
        s4a = _u(ra.index(i).load(WL))
        s4b = _u(rb.index(i).load(WL))
        a = _lanes(c0, c1, c2, s4a, s4b, q, w0, w1, rank, th0, th1, tl0, tl1, HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1,
                   BN, WL, AL)
        fence_async_shared()
        gl.thread_barrier()  # x of step st from every thread's copies
        if XP:
            xs = rx.index(i)
        else:
            xs = rx.index(i)._reinterpret(gl.bfloat16, [BT, BK], XSL)
        acc = warpgroup_mma(a, xs.permute((1, 0)), acc, is_async=True)
        if PIPE:  # the MMA before done, this one in flight (its A registers kept until the next wait)
            acc, ap = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a))
        else:
            acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))
        async_copy.wait_group(LEAD - 2)  # steps up to st + 1 landed
        gl.thread_barrier()  # every warp's MMA of step st + LEAD - S done: its stage free
        if st + LEAD < s1:
            _issue(r0, r1, r2, ra, rb, rx, code_ptr, sm_ptr, xb_ptr, c_off, s_off, xpo, st + LEAD, runs, S, XP)
        async_copy.commit_group()
        nx = gl.minimum(st + 1, s1 - 1)
        if nx % 8 == 0:  # a block's first step: its rows' ranks from the block offsets
            run = _block_start(ebase_ptr, eoff_ptr, nr * NBR + nx // 8) + cc * 0
        c0, c1, c2, rank, run, w0, w1 = _next_window(r0, r1, r2, nx, run, cc, esc_ptr, NESCW, S, RL)
    if PIPE:
        acc, ap = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ap))
    async_copy.wait_group(0)
    _finish(acc, x_ptr, rowptr_ptr, eidx_ptr, vals_ptr, part_ptr, out_ptr, bias_ptr, cnt_ptr, stride_xm, m0, M, N, KP,
            BT, ML, OL, OUT, HAS_BIAS, EXC, CS)


def pair_layout(bt: int, warps: int = 4):
    """The [bt, 64] slot pairs' copy layout: a warp's 32 lanes copy one row's 32 consecutive pairs (4 sectors of x,
    one 128-byte line of the swizzled tile)."""
    return gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[1, 32], warps_per_cta=[warps, 1], order=[1, 0])


def slot_columns() -> list[int]:
    """The column of a 128-column step held by each of its slots (slot 64 h + 16 q + 8 T + 2 c + j: column
    32 c + 16 h + 4 q + 2 T + j), the order ``permute_x`` puts x in.

    >>> slot_columns()[:10]
    [0, 1, 32, 33, 64, 65, 96, 97, 2, 3]
    """
    return [32 * ((s >> 1) & 3) + 16 * (s >> 6) + 4 * ((s >> 4) & 3) + 2 * ((s >> 3) & 1) + (s & 1) for s in range(128)]


@functools.lru_cache(maxsize=64)
def _slot_index(k: int, device: torch.device) -> torch.Tensor:
    # slot_columns for every step of K, made on the device (no host copy: a first call may come inside a CUDA graph's
    # capture)
    i = torch.arange(k, dtype=torch.int64, device=device)
    s = i % BK.value
    return i - s + 32 * ((s >> 1) & 3) + 16 * (s >> 6) + 4 * ((s >> 4) & 3) + 2 * ((s >> 3) & 1) + (s & 1)


# x: bf16 [M, K], K a multiple of 128 -> bf16 [M, K] contiguous, each step's columns in slot order
def permute_x(x: torch.Tensor) -> torch.Tensor:
    """x with each 128-column step's columns in the MMA's slot order (``slot_columns``): the ring's x with
    ``xperm``, one gather a call."""
    if x.dim() != 2 or x.shape[1] % BK.value:
        raise ValueError(f"permute_x needs x of shape [M, K] with K a multiple of {BK.value}, got {tuple(x.shape)}")
    return torch.index_select(x, 1, _slot_index(x.shape[1], x.device))
