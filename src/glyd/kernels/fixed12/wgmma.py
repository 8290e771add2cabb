"""fixed12 decode-step product on Hopper's warpgroup MMA (wgmma), weights as the register operand.

The Gluon tile of ``fixed12.mma_v2`` multiplies with ``mma.sync``: x is the A operand, so a program
of bm x rows holds bm / 16 x tiles in registers (or reads them from shared memory for every MMA)
and issues bm / 16 MMAs a decoded tile. Here the roles are swapped: the decoded weight tile is
wgmma's A operand, straight from registers (64 weight rows a warpgroup), and x is its B operand,
read by the tensor cores from shared memory; the x rows of a program are wgmma's N (16-64), so
the per-weight cost does not grow with them.

The A operand (``k_width`` 2) gives each thread, in each 16-wide k chunk, the k pairs 2c, 2c+1 and
2c+8, 2c+9 of two rows (c = lane % 4). The plane words are loaded so that each thread reads 16
contiguous bytes: the MMA's k order ("slots") is a fixed permutation of a K step's 128 columns
(``DECODE_ORDER``), and x is stored in shared memory in the same order (``X_ORDER``), which
leaves the product unchanged. A thread's words for one row and step: lo words 16g + 8hh + 4a + i
(i = 0-3, hh = 0-1) and code words 8g + 4a + i (both nibble halves used), with (a, g) the lane's
two low bits. x goes to shared memory through registers (16-byte loads, 4-byte stores): the slot
order keeps only pairs of columns together, too fine for 16-byte async copies.

The K loop is unrolled by two over two x buffers (two allocations, so that one step's MMA and the
next step's x stores need no barrier between them); programs take whole pairs of steps, so K must
be a multiple of 256. ``WgConfig.pipe`` keeps one MMA in flight across steps. ``WgConfig.exc_tile``
adds the tile's exceptions after the K loop by a one-hot wgmma; without it the separate pass
(``fixed12.exceptions.add_exceptions``) adds them to fp32 partials. With the exceptions in the tile it
is the H200 table's choice on gate/up (M = 4-32), lm_heads (M = 3-64), down (M = 3-64) and q/o
(M = 33-64). CUDA only, Hopper only (Gluon has no interpreter; the twin for tests is ``tc``).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

from glyd.codec.fixed12 import ARRAYS
from glyd.kernels import _common as C
from glyd.kernels._fields import flags, ints
from glyd.kernels import _plan
from glyd.kernels._gluon_bits import exc_meta, exc_meta_vals, prmt, split16, wait_count
from glyd.kernels.fixed12.exceptions import SidePass, exceptions_launch, prepare
from glyd.kernels.fixed12.mma_v2_parts import sum_parts
from glyd.kernels.registry import Kernel

BK = 128  # columns a K step (16 code words and 32 lo words a row)


@dataclasses.dataclass(frozen=True)
class WgConfig(C.KernelConfig):
    """``bm`` (8-64) x rows (wgmma's N) and ``bn`` weight rows a program (16 or 32 a warp), 4 or 8
    warps, K steps of 128. ``pipe``: one MMA in flight across K steps instead of waiting for each
    at its step's end. ``exc_tile``: the exceptions added in the tile (else a pass of their own,
    beside it on a second stream or after it with ``exc_after``). ``maxnreg``: a register cap.
    With ``exc_tile``, as ``WsConfig``'s: ``exc_chunk`` exceptions a one-hot MMA (16, 32, 64), ``exc_xt`` their x
    columns from a transposed copy of x, ``exc_pre`` their values from the prepared list, a round ahead,
    ``exc_vals`` from the prepared list in the round itself (no load into the lo plane behind the index's),
    ``exc_rows`` by the accumulator's own threads with fp32 FMAs, no one-hot MMA, x's columns from x itself or,
    with ``exc_xt``, from its transposed copy (``WsConfig.exc_rows``; with ``exc_pre`` each round's x columns and
    values loaded during the round before). ``fixup``: split-K summed in the kernel
    by each tile's last split program (no finalize kernel; with the exceptions in the tile or none)."""

    bm: int = 16
    bn: int = 64
    warps: int = 4
    exc_tile: bool = False
    exc_after: bool = False
    pipe: bool = False
    maxnreg: int = 0
    exc_chunk: int = 16
    exc_xt: bool = False
    exc_pre: bool = False
    exc_vals: bool = False
    exc_rows: bool = False
    fixup: bool = False

    def validate(self) -> None:
        C.pow2(self, "bm", "bn")
        flags(self, "exc_tile", "exc_after", "pipe", "exc_xt", "exc_pre", "exc_vals", "exc_rows", "fixup")
        if self.exc_pre and self.exc_vals:
            raise ValueError("WgConfig.exc_pre (the values a round ahead) and exc_vals (in the round) exclude each other")
        ints(self, 0, 255, "maxnreg")
        ints(self, 16, 64, "exc_chunk")
        if self.exc_chunk not in (16, 32, 64):
            raise ValueError(f"WgConfig.exc_chunk must be 16, 32 or 64, got {self.exc_chunk}")
        if self.bm not in (8, 16, 32, 64) or self.warps not in (4, 8) or self.bn not in (16 * self.warps,
                                                                                         32 * self.warps):
            raise ValueError(f"WgConfig: bm 8-64, 4 or 8 warps, bn 16 or 32 rows a warp; got {self}")
        if self.exc_tile and self.exc_after:
            raise ValueError("exc_tile (exceptions inside the tile kernel) and exc_after exclude each other")
        if self.maxnreg and not 32 <= self.maxnreg <= 255:
            raise ValueError(f"WgConfig.maxnreg must be 32-255 (0: none), got {self.maxnreg}")
# The decoded [rows, 16 words, j, h, hh] tile, split as [row, g, a, i1, i0, j, h, hh] (column
# 4 (16 g + 8 hh + 4 a + 2 i1 + i0) + 2 h + j), and the x tile, [x row, g, hh, a, i1, i0, h, j] (the
# column's bits, high to low), are both permuted to slot order (hh i1 i0 h g a j): slot
# 16 i + 2 c + j + 8 h of lane c = a + 2 g holds that column in both operands.
DECODE_ORDER = gl.constexpr((0, 7, 3, 4, 6, 1, 2, 5))
X_ORDER = gl.constexpr((0, 2, 4, 5, 6, 1, 3, 7))


@gluon.jit
def _wg_words(lo_ptr, code_ptr, lo_off, co_off, st):
    # a K step's plane words: lo words of nibble half 0 and 1, code words ([BN, 16] each, uint32)
    l0 = gl.load(lo_ptr + lo_off + st * 32).to(gl.uint32, bitcast=True)
    l1 = gl.load(lo_ptr + lo_off + (st * 32 + 8)).to(gl.uint32, bitcast=True)
    cw = gl.load(code_ptr + co_off + st * 16).to(gl.uint32, bitcast=True)
    return l0, l1, cw


@gluon.jit
def wg_pairs(lw, nib, b4):
    # [BN, 16, 2 (j), 2 (h)] bf16: a lo word's four weights, decoded with their code nibbles
    h = ((nib << 4) & 0x80808080) | ((nib & 0x07070707) + b4)
    e0, e1 = split16(prmt(lw, h, 0x5140))
    e2, e3 = split16(prmt(lw, h, 0x7362))
    return gl.join(gl.join(e0, e1), gl.join(e2, e3))


@gluon.jit
def _wg_decode(l0, l1, cw, b4, BN: gl.constexpr, AL: gl.constexpr):
    # the [BN, 128] decoded tile in MMA slot order, as wgmma's register A operand
    w = gl.join(wg_pairs(l0, cw, b4), wg_pairs(l1, cw >> 4, b4))  # [BN, 16 (g a i1 i0), j, h, hh]
    w = gl.reshape(w, [BN, 2, 2, 2, 2, 2, 2, 2])  # [row, g, a, i1, i0, j, h, hh]
    w = gl.reshape(gl.permute(w, DECODE_ORDER.value), [BN, 128])  # slot = (hh i1 i0 h g a j)
    return gl.convert_layout(w, AL)


@gluon.jit
def _wg_x(x_ptr, xoff, st):
    # a K step's [BT, 128] x tile in column order (16-byte loads)
    return gl.load(x_ptr + xoff + st * 128)


@gluon.jit
def _wg_x_store(xs, xr, BT: gl.constexpr):
    # the x tile into shared memory in MMA slot order: column bits (g hh a i1 i0 h j), high to
    # low, become slot bits (hh i1 i0 h g a j)
    xr = gl.reshape(xr, [BT, 2, 2, 2, 2, 2, 2, 2])
    xs.store(gl.reshape(gl.permute(xr, X_ORDER.value), [BT, 128]))


@gluon.jit
def _wg_step(acc, ap, xr, l0, l1, cw, x_cur, x_next, st, s1, x_ptr, xoff, lo_ptr, code_ptr, lo_off, co_off, b4,
             BN: gl.constexpr, BT: gl.constexpr, AL: gl.constexpr, PIPE: gl.constexpr):
    # one K step: its plane words are (l0, l1, cw), its x tile is in x_cur; loads the next step's
    # words, stores the next step's x (held in xr) into x_next and loads the one after. PIPE 0:
    # this step's MMA is waited for at its end; 1: the previous step's (one MMA in flight, whose
    # A operand ap is kept alive until then)
    nx = gl.minimum(st + 1, s1 - 1)
    l0n, l1n, cwn = _wg_words(lo_ptr, code_ptr, lo_off, co_off, nx)
    a = _wg_decode(l0, l1, cw, b4, BN, AL)
    acc = warpgroup_mma(a, x_cur.permute((1, 0)), acc, is_async=True)
    if PIPE:
        # the previous step's MMA (which read x_next) is done once at most this one is in flight
        acc, ap = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ap))
        gl.thread_barrier()  # ... in every warpgroup, before any warp overwrites x_next
    _wg_x_store(x_next, xr, BT)
    fence_async_shared()
    xr = _wg_x(x_ptr, xoff, gl.minimum(st + 2, s1 - 1))
    if not PIPE:
        # the A registers must stay untouched until the MMA has read them: keep them alive
        acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))
    gl.thread_barrier()  # every warp's x stores are in before the next MMA reads them
    return acc, a, xr, l0n, l1n, cwn


EXC_E = 16  # exceptions a step of the in-tile exception sum (the one-hot MMA's K)


@gluon.jit
def wg_exceptions(acc, x_ptr, m0, M, stride_xm, eidx_ptr, ehi_ptr, lo8_ptr, KP, base_ptr, n0, e0, e1, part, parts,
                   BN: gl.constexpr, BT: gl.constexpr, ML: gl.constexpr, EL: gl.constexpr, XE: gl.constexpr = 16,
                   XT: gl.constexpr = False, PRE: gl.constexpr = 0):
    # acc [BN weight rows, BT x rows] plus, for each exception (w, c) of rows n0.. (e0..e1),
    # (true - decoded w) * x[:, c] on its row: E (16-64) at a time as a wgmma of a one-hot [BN, E]
    # register operand and the [E, BT] products in shared memory (E = XE), those split into two bf16
    # parts (hi + lo keeps 16 of fp32's 24 significand bits: error <= 2^-16 of each term). XT: x_ptr
    # is x transposed ([K, M], contiguous), so a column's rows are one contiguous read. PRE 1 or 2: lo8_ptr is
    # the prepared list of true values (exc_meta_vals); 1: a round's entries load during the round before.
    # Program `part` of `parts` (those that share the tile) takes rounds part, part + parts, ... (no division).
    E: gl.constexpr = XE
    AO: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ML, k_width=2)
    DL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, E], gl.bfloat16)
    dh_s = gl.allocate_shared_memory(gl.bfloat16, [BT, E], DL)
    dl_s = gl.allocate_shared_memory(gl.bfloat16, [BT, E], DL)
    b8 = gl.load(base_ptr).to(gl.uint32)
    rm = m0 + gl.arange(0, BT, layout=gl.SliceLayout(1, EL))
    rn = (n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, AO))).to(gl.int64)
    if PRE == 1:
        c, em, tv, pv, r = exc_meta_vals(eidx_ptr, lo8_ptr, b8, KP, e0 + part * E, e1, E, EL)
    for es in range(e0 + part * E, e1, parts * E):
        if PRE == 1:  # the next round's entries, in flight while this round gathers and multiplies
            c2, em2, tv2, pv2, r2 = exc_meta_vals(eidx_ptr, lo8_ptr, b8, KP, es + parts * E, e1, E, EL)
        elif PRE == 2:
            c, em, tv, pv, r = exc_meta_vals(eidx_ptr, lo8_ptr, b8, KP, es, e1, E, EL)
        else:
            c, em, tv, pv, r = exc_meta(eidx_ptr, ehi_ptr, lo8_ptr, KP, b8, KP, es, e1, E, EL)
        if XT:
            xp = x_ptr + c[None, :] * M + rm[:, None]
        else:
            xp = x_ptr + rm[:, None] * stride_xm + c[None, :]
        xv = gl.load(xp, mask=(rm < M)[:, None] & em[None, :], other=0.0).to(gl.float32)
        d = xv * tv[None, :] - xv * pv[None, :]  # [BT, E]
        hi = d.to(gl.bfloat16)
        dh_s.store(hi)
        dl_s.store((d - hi.to(gl.float32)).to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()
        re = gl.convert_layout(r, gl.SliceLayout(0, AO))
        oh = gl.where(rn[:, None] == re[None, :], 1.0, 0.0).to(gl.bfloat16)  # [BN, E] one-hot rows
        acc = warpgroup_mma(oh, dh_s.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(oh, dl_s.permute((1, 0)), acc, is_async=True)
        acc, oh = warpgroup_mma_wait(num_outstanding=0, deps=(acc, oh))
        gl.thread_barrier()  # both MMAs have read the products before the next chunk's stores
        if PRE == 1:
            c, em, tv, pv, r = c2, em2, tv2, pv2, r2
    return acc


@gluon.jit
def _imax(a, b):
    # gl.max's combine as a Gluon function (gl.max's own is a Triton one, which the interpreter's compile tests reject)
    return gl.maximum(a, b)


@gluon.jit
def _row_rounds(acc, xe_ptr, sxk, sxm, cm, rn, ea, cnt, K, eidx_ptr, vals_ptr, b8, part, parts,
                AHEAD: gl.constexpr = False, PH: gl.constexpr = 0):
    # wg_row_exceptions' rounds with x's rows at cm (columns of acc). Each round loads the next round's indices
    # before its own x columns: x's load waits on its round's index no longer (loaded a round before), the value's
    # load runs beside x's. AHEAD: the next round's x columns and values too (its indices two rounds ahead), so a
    # round's loads are in flight while the round before adds (the rounds' L2 latency one after another at long M)
    ev = part < cnt
    idx = gl.load(eidx_ptr + ea + part, mask=ev, other=0)
    if AHEAD:
        evn = part + parts < cnt
        idx_n = gl.load(eidx_ptr + ea + part + parts, mask=evn, other=0)
        xv, v = _row_loads(xe_ptr, sxk, sxm, cm, rn, ea, part, idx, ev, K, vals_ptr)
        for j in range(part, gl.reduce(cnt, 0, _imax), parts):
            evnn = j + 2 * parts < cnt
            idx_nn = gl.load(eidx_ptr + ea + j + 2 * parts, mask=evnn, other=0)
            xv_n, v_n = _row_loads(xe_ptr, sxk, sxm, cm, rn, ea, j + parts, idx_n, evn, K, vals_ptr)
            acc = _row_add(acc, xv, v, ev, b8, PH)
            ev, evn, idx_n, xv, v = evn, evnn, idx_nn, xv_n, v_n
    else:
        for j in range(part, gl.reduce(cnt, 0, _imax), parts):
            evn = j + parts < cnt
            idx_n = gl.load(eidx_ptr + ea + j + parts, mask=evn, other=0)
            c = idx - rn.to(idx.dtype) * K
            v = gl.load(vals_ptr + ea + j, mask=ev, other=0).to(gl.int32).to(gl.uint32) & 0xFFFF
            xv = gl.load(xe_ptr + c[:, None] * sxk + cm[None, :] * sxm, mask=ev[:, None], other=0.0).to(gl.float32)
            tv = (v << 16).to(gl.float32, bitcast=True)
            pv = _placeholder(v, b8, PH)
            # true - placeholder in fp32 (within 2^-24 of it: the one-hot MMA's bf16 hi and lo parts keep 2^-16),
            # then one FMA an element; rows without a j-th exception load nothing (a warp whose rows have none skips
            # the round's loads) and add 0 x 0
            d = gl.where(ev, tv - pv, 0.0)
            acc += xv * d[:, None]
            ev, idx = evn, idx_n
    return acc


@gluon.jit
def _row_loads(xe_ptr, sxk, sxm, cm, rn, ea, j, idx, ev, K, vals_ptr):
    # round j's x columns (bf16, acc's layout) and true values (the prepared list's bf16 bits) of the rows with one
    c = idx - rn.to(idx.dtype) * K
    v = gl.load(vals_ptr + ea + j, mask=ev, other=0)
    xv = gl.load(xe_ptr + c[:, None] * sxk + cm[None, :] * sxm, mask=ev[:, None], other=0.0)
    return xv, v


@gluon.jit
def _placeholder(v, b8, PH: gl.constexpr):
    # the decoded placeholder of an exception whose true bf16 bits are v, as fp32: fixed12's (PH 0: the window's
    # base b8 for the exponent's top 7 bits, the lo byte kept) or dense11's (PH 1: exponent 0, sign and mantissa kept)
    if PH == 1:
        r = ((v & 0x807F) << 16).to(gl.float32, bitcast=True)
    else:
        r = (((v & 0x80FF) | (b8 << 8)) << 16).to(gl.float32, bitcast=True)
    return r


@gluon.jit
def _row_add(acc, xv, v, ev, b8, PH: gl.constexpr = 0):
    # as _row_rounds' own round (without AHEAD): true - placeholder in fp32, one FMA an element
    v = v.to(gl.int32).to(gl.uint32) & 0xFFFF
    tv = (v << 16).to(gl.float32, bitcast=True)
    pv = _placeholder(v, b8, PH)
    d = gl.where(ev, tv - pv, 0.0)
    return acc + xv.to(gl.float32) * d[:, None]


@gluon.jit
def wg_row_exceptions(acc, xe_ptr, sxk, sxm, m0, M, K, rowptr_ptr, eidx_ptr, vals_ptr, base_ptr, n0, N, part, parts,
                      BN: gl.constexpr, BT: gl.constexpr, ML: gl.constexpr, AHEAD: gl.constexpr = False,
                      PH: gl.constexpr = 0):
    # acc [BN weight rows, BT x rows] += (true - decoded w) * x[rows, c] for each exception (w, c) of rows n0..,
    # in acc's own layout: round j takes the j-th exception of every row at once (rows without one masked),
    # rounds j = part, part + parts, ... (the tile's programs share them). A row's list starts at its row
    # pointer, so its column needs no division; the true value from the prepared list (Prepared.vals);
    # x[m, c] at xe_ptr + c sxk + m sxm: x itself (1, its row stride) or a transposed copy ([K, M]: M, 1).
    # No one-hot MMA, shared memory or barrier. The mask is a row's alone (a predicate an element spilled the
    # 128-row tile with x itself): a whole tile's columns m0 + i as such (addresses a constant apart), the last
    # tile's past M at row M - 1 (never stored). With h135's select in place of the mask the tiles at M = 32-128 took
    # 7-15% longer than a session before (history/2026-12-06-h100-23.md; call.sh exc_ab times the two loops).
    # PH: the layout's placeholder (_placeholder: 0 fixed12's, 1 dense11's)
    b8 = gl.load(base_ptr).to(gl.uint32)
    if BN * BT >= 4096 * gl.num_warps():  # 128 accumulator registers a thread (the ws tile's bm 256 or bn 256 on 8
        # warps, or 64 rows of bm 256 in a warpgroup's own partition): the rounds on each half of the x rows in turn
        # (a round's x values for all of them beside the accumulator spilled 147 + 76 local loads and stores a round
        # on sm_90a); a half is register-only (the columns' top bit is a register's)
        a0, a1 = gl.split(gl.permute(gl.reshape(acc, [BN, 2, BT // 2]), (0, 2, 1)))
        a0 = _row_half(a0, xe_ptr, sxk, sxm, m0, M, K, rowptr_ptr, eidx_ptr, vals_ptr, b8, n0, N, part, parts, BN,
                       BT // 2, AHEAD, PH)
        a1 = _row_half(a1, xe_ptr, sxk, sxm, m0 + BT // 2, M, K, rowptr_ptr, eidx_ptr, vals_ptr, b8, n0, N, part,
                       parts, BN, BT // 2, AHEAD, PH)
        return gl.convert_layout(gl.reshape(gl.permute(gl.join(a0, a1), (0, 2, 1)), [BN, BT]), ML)
    return _row_half(acc, xe_ptr, sxk, sxm, m0, M, K, rowptr_ptr, eidx_ptr, vals_ptr, b8, n0, N, part, parts, BN, BT,
                     AHEAD, PH)


@gluon.jit
def _row_half(acc, xe_ptr, sxk, sxm, m0, M, K, rowptr_ptr, eidx_ptr, vals_ptr, b8, n0, N, part, parts,
              BN: gl.constexpr, BT: gl.constexpr, AHEAD: gl.constexpr = False, PH: gl.constexpr = 0):
    # wg_row_exceptions on acc [BN, BT] (x rows m0..) in acc's own layout, whatever it is
    L: gl.constexpr = acc.type.layout
    rn = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, L))
    ea = gl.load(rowptr_ptr + gl.minimum(rn, N))  # rows past N: an empty list
    cnt = gl.load(rowptr_ptr + gl.minimum(rn + 1, N)) - ea
    cm = m0 + gl.arange(0, BT, layout=gl.SliceLayout(0, L))
    if m0 + BT <= M:
        acc = _row_rounds(acc, xe_ptr, sxk, sxm, cm, rn, ea, cnt, K, eidx_ptr, vals_ptr, b8, part, parts, AHEAD, PH)
    else:
        acc = _row_rounds(acc, xe_ptr, sxk, sxm, gl.minimum(cm, M - 1), rn, ea, cnt, K, eidx_ptr, vals_ptr, b8,
                          part, parts, AHEAD, PH)
    return acc


@gluon.jit
def wg_store(acc, part_ptr, out_ptr, bias_ptr, cnt_ptr, r, m, M, N, pid_n, pid_k, pid_m, OUT: gl.constexpr,
              HAS_BIAS: gl.constexpr, CS: gl.constexpr):
    # a finished tile (acc [BN weight rows r, BT x rows m], layout OL): the fp32 partial (OUT 0), the bf16 result
    # (OUT 1), or (OUT 2) the partial of a split program that is not the tile's last, and the sum by the last
    mask = (r < N) & (m < M)
    if OUT == 2:
        nsplit = gl.num_programs(1)
        tile = pid_m * gl.num_programs(0) + pid_n
        if pid_k == nsplit - 1:  # the others' partials in split order, then this one's: finalize's bits
            wait_count(cnt_ptr + tile * CS, nsplit - 1)
            gl.atomic_xchg(cnt_ptr + tile * CS, 0, sem="relaxed", scope="gpu")
            acc = sum_parts(acc, part_ptr, m, r, M, N, nsplit)
        else:  # store, count in (the barrier orders every thread's stores before the releasing atomic), exit;
            # the last split program has a higher block index, so it is scheduled after this one
            gl.store(part_ptr + pid_k * M * N + m * N + r, acc, mask=mask)
            gl.thread_barrier()
            gl.atomic_add(cnt_ptr + tile * CS, 1, sem="release", scope="gpu")
    if OUT == 0:
        gl.store(part_ptr + pid_k * M * N + m * N + r, acc, mask=mask)
    elif OUT == 1 or pid_k == gl.num_programs(1) - 1:
        if HAS_BIAS:
            acc += gl.load(bias_ptr + r, mask=r < N, other=0.0).to(gl.float32)
        gl.store(out_ptr + m * N + r, acc.to(gl.bfloat16), mask=mask)


@gluon.jit
def _wg_kernel(x_ptr, code_ptr, lo_ptr, base_ptr, part_ptr, out_ptr, bias_ptr, M, N, KP, stride_xm, K_SPLIT,
               stride_code, stride_lo, BN: gl.constexpr, BT: gl.constexpr, WL: gl.constexpr, XL: gl.constexpr,
               ML: gl.constexpr, AL: gl.constexpr, XSL: gl.constexpr, OL: gl.constexpr, OUT: gl.constexpr,
               HAS_BIAS: gl.constexpr, PIPE: gl.constexpr = 0, EXC: gl.constexpr = False, EL: gl.constexpr = None,
               rowptr_ptr=None, eidx_ptr=None, ehi_ptr=None, lo8_ptr=None, XE: gl.constexpr = 16,
               XT: gl.constexpr = False, PRE: gl.constexpr = 0, xt_ptr=None, cnt_ptr=None, CS: gl.constexpr = 1):
    # part[pid_k, BT x rows, BN weight rows] (fp32, OUT 0) or out (bf16 + bias, OUT 1: one split; OUT 2: the
    # tile's last split program sums the others' partials, counted in at cnt_ptr, CS int32 a tile)
    # = x rows @ W^T over this program's K range; acc is [BN weight rows, BT x rows]. Whole shapes
    # only (K == KP, K_SPLIT and KP multiples of 256); rows past M or N read row M-1 / N-1 again.
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    pid_m = gl.program_id(2)
    cq = gl.arange(0, 16, layout=gl.SliceLayout(0, WL))[None, :]
    n = gl.minimum(pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, WL)), N - 1)[:, None]
    lo_off = n * stride_lo + (cq // 8) * 16 + (cq % 8)
    co_off = n * stride_code + cq
    b4 = gl.load(base_ptr).to(gl.uint32) * 0x01010101
    m0 = pid_m * BT
    t = gl.minimum(m0 + gl.arange(0, BT, layout=gl.SliceLayout(1, XL)), M - 1)
    xoff = t[:, None] * stride_xm + gl.arange(0, 128, layout=gl.SliceLayout(0, XL))[None, :]
    # two x buffers as two allocations, the loop unrolled by two: the MMA of one step and the x
    # stores of the next touch different allocations, so no barrier is needed between them
    xs0 = gl.allocate_shared_memory(gl.bfloat16, [BT, 128], XSL)
    xs1 = gl.allocate_shared_memory(gl.bfloat16, [BT, 128], XSL)
    s0 = (pid_k * K_SPLIT) // 128
    s1 = gl.minimum(pid_k * K_SPLIT + K_SPLIT, KP) // 128
    l0, l1, cw = _wg_words(lo_ptr, code_ptr, lo_off, co_off, s0)
    _wg_x_store(xs0, _wg_x(x_ptr, xoff, s0), BT)
    xr = _wg_x(x_ptr, xoff, gl.minimum(s0 + 1, s1 - 1))
    fence_async_shared()
    gl.thread_barrier()
    acc = gl.zeros([BN, BT], gl.float32, ML)
    ap = gl.zeros([BN, 128], gl.bfloat16, AL)  # the in-flight MMA's A operand (PIPE 1)
    for st in range(s0, s1 - 1, 2):
        acc, ap, xr, l0, l1, cw = _wg_step(acc, ap, xr, l0, l1, cw, xs0, xs1, st, s1, x_ptr, xoff, lo_ptr, code_ptr,
                                           lo_off, co_off, b4, BN, BT, AL, PIPE)
        acc, ap, xr, l0, l1, cw = _wg_step(acc, ap, xr, l0, l1, cw, xs1, xs0, st + 1, s1, x_ptr, xoff, lo_ptr,
                                           code_ptr, lo_off, co_off, b4, BN, BT, AL, PIPE)
    if PIPE:
        acc, ap = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ap))
    if EXC and PRE >= 3:  # WgConfig.exc_rows: by the accumulator's own threads, a row's list from its pointers
        if XT:  # x's columns from x transposed (xt_ptr, [K, M])
            acc = wg_row_exceptions(acc, xt_ptr, M, 1, m0, M, KP, rowptr_ptr, eidx_ptr, lo8_ptr, base_ptr, pid_n * BN,
                                    N, pid_k, gl.num_programs(1), BN, BT, ML, PRE == 4)
        else:
            acc = wg_row_exceptions(acc, x_ptr, 1, stride_xm, m0, M, KP, rowptr_ptr, eidx_ptr, lo8_ptr, base_ptr,
                                    pid_n * BN, N, pid_k, gl.num_programs(1), BN, BT, ML, PRE == 4)
    elif EXC:  # the exceptions of this tile's weight rows, their rounds shared among its split programs
        n0 = pid_n * BN
        e0 = gl.load(rowptr_ptr + n0)
        e1 = gl.load(rowptr_ptr + gl.minimum(n0 + BN, N))
        if XT:  # x's columns from x transposed (xt_ptr, [K, M])
            acc = wg_exceptions(acc, xt_ptr, m0, M, stride_xm, eidx_ptr, ehi_ptr, lo8_ptr, KP, base_ptr, n0, e0, e1,
                                pid_k, gl.num_programs(1), BN, BT, ML, EL, XE, XT, PRE)
        else:
            acc = wg_exceptions(acc, x_ptr, m0, M, stride_xm, eidx_ptr, ehi_ptr, lo8_ptr, KP, base_ptr, n0, e0, e1,
                                pid_k, gl.num_programs(1), BN, BT, ML, EL, XE, XT, PRE)
    acc = gl.convert_layout(acc, OL)
    r = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, OL))[:, None]
    m = m0 + gl.arange(0, BT, layout=gl.SliceLayout(0, OL))[None, :]
    wg_store(acc, part_ptr, out_ptr, bias_ptr, cnt_ptr, r, m, M, N, pid_n, pid_k, pid_m, OUT, HAS_BIAS, CS)


@functools.lru_cache(maxsize=None)
def layouts(bn: int, bt: int, warps: int = 4):
    """(word, x pairs, accumulator, A operand, x shared, output) layouts for bn weight rows and bt
    x rows: words [bn, 16] (a thread: 4 contiguous words of two rows 8 apart, its lane's (a, g)),
    x pairs [bt, 64] int32 (4 contiguous slot pairs a thread: 16-byte shared stores)."""
    rb = bn // (16 * warps)  # 16-row blocks a warp in registers past the first
    wreg = [[0, 1], [0, 2], [8, 0]] + [[16 * warps << i, 0] for i in range(rb.bit_length() - 1)]
    words = gl.DistributedLinearLayout(reg_bases=wreg, lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
                                       warp_bases=[[16 << i, 0] for i in range(warps.bit_length() - 1)],
                                       block_bases=[], shape=[bn, 16])
    xl = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[warps, 1], order=[1, 0])
    mma = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, bt, 16])
    a_op = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    xs = gl.NVMMASharedLayout.get_default_for([bt, BK], gl.bfloat16)
    out = gl.BlockedLayout(size_per_thread=[4, 1], threads_per_warp=[32, 1], warps_per_cta=[1, warps], order=[0, 1])
    return words, xl, mma, a_op, xs, out


@functools.lru_cache(maxsize=None)
def exc_layout(warps: int = 4, xt: bool = False):
    """Layout of the in-tile exception step's [bt x rows, E exceptions] products: ``xt`` (x's columns read
    from x transposed) puts a warp's lanes along the x rows, where a column is contiguous."""
    if xt:
        return gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[32, 1], warps_per_cta=[1, warps],
                                order=[0, 1])
    return gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[2, 16], warps_per_cta=[warps, 1], order=[1, 0])


# x: bf16 [M, K]; packed: fixed12 [N, K], K == Kp; bias: [N] or None; out: bf16 [M, N] (written) -> out
def launch(x2: torch.Tensor, p, bias, cfg: WgConfig, out: torch.Tensor) -> torch.Tensor:
    return plan(x2, p, bias, cfg)(x2, bias, out, tuple(p.arrays[a] for a in ARRAYS))


# x: bf16 [M, K]; packed: fixed12 [N, K], K == Kp -> run(x2, bias, out, arrays) (Kernel.plan)
def plan(x2: torch.Tensor, p, bias, cfg: WgConfig):
    m, k, n, a, kp = C.gluon_launch_checks(x2, p, "fixed12_wgmma", 2 * BK)
    prep = prepare(p)
    copy = x2.stride(1) != 1 or x2.stride(0) % 8 or x2.data_ptr() % 16  # x is read in 16-byte pieces
    stride = x2.shape[1] if copy else x2.stride(0)
    tiles = triton.cdiv(n, cfg.bn) * triton.cdiv(m, cfg.bm)
    # K ranges of whole pairs of steps: the kernel's loop is unrolled by two (its x buffers)
    split, per = C.choose_split(tiles, kp, 2 * BK, x2.device, cfg.split, cfg.waves)
    inline = cfg.exc_tile and prep.nexc > 0
    xt = inline and cfg.exc_xt  # the in-tile step's x transposed; values from the prepared
    # list a round ahead (1), in the round (2) or by the accumulator's threads (3)
    pre = ((4 if cfg.exc_pre else 3) if cfg.exc_rows else 1 if cfg.exc_pre else 2 if cfg.exc_vals else 0) if inline else 0
    side = not cfg.exc_after and prep.nexc > 0 and not inline
    direct = prep.nexc == 0 or inline  # no exception pass adds to the partials
    out_mode = 1 if direct and split == 1 else 2 if direct and cfg.fixup else 0
    # per call: x2, bias (or out), part (the partials, or out), out, then fixed12's arrays
    x, b, part, o = _plan.slots(4)
    lo, code, base, eidx, ehi = _plan.slots(5, 4, fixed=True)
    part = o if out_mode == 1 else part
    cnt = C.counters(x2.device, tiles) if out_mode == 2 else None
    words, xl, mma, a_op, xsl, ol = layouts(cfg.bn, cfg.bm, cfg.warps)
    grid = (triton.cdiv(n, cfg.bn), split, triton.cdiv(m, cfg.bm))
    tile = _plan.Launch(_wg_kernel, grid, (x, code.view(torch.int32), lo.view(torch.int32), base, part, o, b,
                                           m, n, kp, stride, per, kp // 8, kp // 4), dict(
        BN=cfg.bn, BT=cfg.bm, WL=words, XL=xl, ML=mma, AL=a_op, XSL=xsl, OL=ol, OUT=out_mode,
        HAS_BIAS=bias is not None, PIPE=int(cfg.pipe), EXC=inline, EL=exc_layout(cfg.warps, xt) if inline else None,
        rowptr_ptr=prep.rowptr, eidx_ptr=eidx, ehi_ptr=ehi, lo8_ptr=prep.vals if pre else lo, XE=cfg.exc_chunk,
        XT=xt, PRE=pre, xt_ptr=_plan.Slot(9) if xt else None, cnt_ptr=cnt, CS=C.COUNTER_SLOTS, num_warps=cfg.warps,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {})))
    xc = x2.contiguous() if copy else x2
    pass_ = SidePass(xc, p, prep) if side else None
    after = exceptions_launch(xc, p, prep) if out_mode == 0 and prep.nexc > 0 and not inline and not side else None
    fin = C.finalize_launch(split + side, m, n, bias is not None, x2.device, cfg.pdl) if out_mode == 0 else None
    shape, dev = (split + side, m, n), x2.device

    def run(x2, bias, out, arrays):
        if copy:
            x2 = x2.contiguous()
        pt = torch.empty(shape, dtype=torch.float32, device=dev) if out_mode != 1 else out
        if pass_ is not None:
            cur = pass_.begin(pt[split:], x2, *arrays)
        tile(x2, bias if bias is not None else out, pt, out, *arrays, *((x2.t().contiguous(),) if xt else ()))
        if pass_ is not None:
            pass_.join(cur)
        elif after is not None:
            after(pt, x2, *arrays)
        if fin is not None:
            fin(pt, bias if bias is not None else pt, out)
        return out

    return run


class WgKernel(Kernel):
    """The wgmma tile: a Hopper GPU (sm_90) with Gluon's Hopper MMA, K (no padded columns) a
    multiple of 256 (two steps of 128)."""

    name = "fixed12_wgmma"
    layout = "fixed12"
    Config = WgConfig

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if not ok:
            return ok, why
        if "wgmma" not in device.features:
            return False, "needs Gluon's warpgroup MMA on a Hopper GPU (sm_90)"
        if problem.k != problem.kp or problem.k % (2 * BK):
            return False, f"needs K a multiple of {2 * BK} (no padded columns), got K = {problem.k}"
        return True, ""

    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        C.check_launch_shapes(cls.name, x2, tuple(packed.shape), out, bias)  # a direct launch read, wrote past them
        return launch(x2, packed, bias, config, out)

    @classmethod
    def plan(cls, x2, packed, bias, config):
        return plan(x2, packed, bias, config)
