"""Issue 38 probe kernel: a warp-specialized fixed12 GEMM for long M that decodes into shared memory.

Unpack + cuBLAS (today's long-M path) writes 16 bits a weight to HBM and reads them back; the wgmma
tiles of ``src/glyd/kernels/fixed12`` decode the weights into registers, in the warps that issue
the MMAs, and lost at long M (notes-kernels items 22-24: the tensor cores idle while a warpgroup
decodes). Here the work is split by partition, so decode and MMA overlap by construction:

- a loader warp: TMA copies of each K step's x boxes ([128, 64] bf16, one a MMA warpgroup) and
  packed words (lo [BN, 16] and code [BN, 8] int32: one 64-column code group) into two rings;
- ``DW`` decoder warps: packed words from shared memory -> the bf16 [BN, 64] weight tile in natural
  column order (``wg_pairs``' byte permutes), stored into a swizzled ring for wgmma's B operand;
- one or two MMA warpgroups (``XB``): x as wgmma's A and the decoded tile as B, both from shared
  memory, one MMA in flight; each owns 128 x rows of the program's ``128 XB`` and the same BN
  weight rows, so every weight decoded in the program feeds ``128 XB`` rows.

Exceptions (about 0.01% of real weights) are added after the K loop by each MMA warpgroup: 16 at a
time as a wgmma of their (true - decoded) x x products (registers, split into two bf16 parts)
and a one-hot [16, BN] operand in shared memory. ``DEC=False`` is the same kernel multiplying a
bf16 W loaded by TMA (no decoder work): the pipeline's own speed against cuBLAS.

Research code (benchmarks/probes): ``probe_long_fused.py`` checks and times it.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from glyd.kernels._gluon_bits import exc_meta
from glyd.kernels.fixed12.exceptions import prepare
from glyd.kernels.fixed12.wgmma import wg_pairs

BK = gl.constexpr(64)  # columns a K step: one code group (16 lo words, 8 code words a row)
BMW = gl.constexpr(128)  # x rows a MMA warpgroup
EXC_E = gl.constexpr(16)  # exceptions a one-hot MMA


@gluon.jit
def _lf_loader(x_desc, lo_desc, co_desc, w_desc, x_s, lo_s, co_s, w_s, x_ready, x_empty, p_ready, p_empty,
               w_ready, w_empty, n0, m0, steps, XB: gl.constexpr, NS: gl.constexpr, NP: gl.constexpr,
               DEC: gl.constexpr, SPLIT: gl.constexpr, BN: gl.constexpr, TILED: gl.constexpr, PROBE: gl.constexpr):
    # one warp: a step's x boxes (and the bf16 W tile without DEC; the packed words too unless SPLIT
    # gives them a warp of their own), each slot once freed. A fresh mbarrier counts as having
    # completed the phase before its first, so the first waits pass.
    for i in range(steps):
        if DEC and not SPLIT:
            _lf_load_words(lo_desc, co_desc, lo_s, co_s, p_ready, p_empty, n0, i, steps, NP, BN, TILED, PROBE)
        b = i % NS
        ph = ((i // NS) & 1) ^ 1
        if not DEC:
            mbarrier.wait(w_empty.index(b), ph)
            bar = w_ready.index(b)
            mbarrier.expect(bar, w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(w_desc, [n0, i * BK], bar, w_s.index(b))
        mbarrier.wait(x_empty.index(b), ph)
        bar = x_ready.index(b)
        if (PROBE & 8) != 0:  # timing probe: the handoff without the copy
            mbarrier.arrive(bar, count=1)
        else:
            mbarrier.expect(bar, XB * x_desc.block_type.nbytes)
            for h in gl.static_range(XB):
                tma.async_copy_global_to_shared(x_desc, [m0 + h * BMW, i * BK], bar, x_s.index(b * XB + h))


@gluon.jit
def _lf_load_words(lo_desc, co_desc, lo_s, co_s, p_ready, p_empty, n0, i, steps, NP: gl.constexpr,
                   BN: gl.constexpr, TILED: gl.constexpr, PROBE: gl.constexpr):
    # step i's lo and code words into packed slot i % NP, once the decoder freed it; TILED: the
    # words of a (BN rows, step) tile lie contiguous (tiled_words): boxes of 512-byte rows
    bp = i % NP
    mbarrier.wait(p_empty.index(bp), ((i // NP) & 1) ^ 1)
    bar = p_ready.index(bp)
    if (PROBE & 4) != 0:  # timing probe: the handoff without the copy
        mbarrier.arrive(bar, count=1)
    elif TILED:  # three boxes (a plane each: box rows must be a power of two)
        mbarrier.expect(bar, 3 * lo_desc.block_type.nbytes)
        r0 = ((n0 // BN) * steps + i) * (3 * BN // 16)
        for j in gl.static_range(3):
            tma.async_copy_global_to_shared(lo_desc, [r0 + j * (BN // 16), 0], bar, lo_s.index(3 * bp + j))
    else:
        mbarrier.expect(bar, lo_desc.block_type.nbytes + co_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(lo_desc, [n0, i * 16], bar, lo_s.index(bp))
        tma.async_copy_global_to_shared(co_desc, [n0, i * 8], bar, co_s.index(bp))


@gluon.jit
def _lf_word_loader(x_desc, lo_desc, co_desc, w_desc, x_s, lo_s, co_s, w_s, x_ready, x_empty, p_ready, p_empty,
                    w_ready, w_empty, n0, m0, steps, XB: gl.constexpr, NS: gl.constexpr, NP: gl.constexpr,
                    DEC: gl.constexpr, SPLIT: gl.constexpr, BN: gl.constexpr, TILED: gl.constexpr,
                    PROBE: gl.constexpr):
    # SPLIT: one warp for the packed words alone, so they run NP steps ahead of the decoder whatever
    # the MMAs wait on (with one loader, step i's words waited for step i - 1's x slot)
    if DEC:
        for i in range(steps):
            _lf_load_words(lo_desc, co_desc, lo_s, co_s, p_ready, p_empty, n0, i, steps, NP, BN, TILED, PROBE)


@gluon.jit
def _lf_words(lo_s, co_s, p_ready, p_empty, i, NP: gl.constexpr, L8: gl.constexpr, BN: gl.constexpr,
              TILED: gl.constexpr, LEAN: gl.constexpr = False):
    # step i's lo words (halves t = 0, 1) and code words into registers; the slot is freed at once
    # (LEAN: by the caller after the step's tile is handed on: no proxy fence, one partition barrier
    # fewer; a TMA write after generic reads needs only the mbarrier's order)
    bp = i % NP
    mbarrier.wait(p_ready.index(bp), (i // NP) & 1)
    if TILED:  # the slot: planes [lo words 0-7, lo words 8-15, code words] of [BN, 8] each, row-major
        rm: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        l0 = lo_s.index(3 * bp)._reinterpret(gl.int32, [BN, 8], rm).load(L8).to(gl.uint32, bitcast=True)
        l1 = lo_s.index(3 * bp + 1)._reinterpret(gl.int32, [BN, 8], rm).load(L8).to(gl.uint32, bitcast=True)
        cw = lo_s.index(3 * bp + 2)._reinterpret(gl.int32, [BN, 8], rm).load(L8).to(gl.uint32, bitcast=True)
    else:
        ls = lo_s.index(bp)
        l0 = ls.slice(0, 8, dim=1).load(L8).to(gl.uint32, bitcast=True)
        l1 = ls.slice(8, 8, dim=1).load(L8).to(gl.uint32, bitcast=True)
        cw = co_s.index(bp).load(L8).to(gl.uint32, bitcast=True)
    if not LEAN:
        fence_async_shared()  # these reads before the TMA's next writes into the slot
        mbarrier.arrive(p_empty.index(bp), count=1)
    return l0, l1, cw


@gluon.jit
def _lf_tile(l0, l1, cw, b4, BN: gl.constexpr):
    # the [BN, 64] bf16 tile: column 32 t + 4 w + 2 h + j from lo word 8 t + w, code nibble t of word w
    d0 = wg_pairs(l0, cw, b4)  # [BN, 8 (w), 2 (j), 2 (h)]
    d1 = wg_pairs(l1, cw >> 4, b4)
    return gl.reshape(gl.permute(gl.join(d0, d1), (0, 4, 1, 3, 2)), [BN, BK])  # [row, t, w, h, j]


@gluon.jit
def _lf_put(w, w_s, w_ready, w_empty, i, NS: gl.constexpr):
    # the decoded tile of step i into weight slot i % NS once the MMAs freed it
    b = i % NS
    mbarrier.wait(w_empty.index(b), ((i // NS) & 1) ^ 1)
    w_s.index(b).store(w)
    fence_async_shared()  # the generic stores before wgmma (async proxy) reads them
    mbarrier.arrive(w_ready.index(b), count=1)


@gluon.jit
def _lf_patch(w, e_lo, e_hi, epos_ptr, ev_ptr, BN: gl.constexpr, DW: gl.constexpr):
    # the step's exceptions e_lo..e_hi (position r * 64 + c in the [BN, 64] tile, true bf16) written
    # over their placeholders in the decoded tile, in registers (rare: 0.8 a step at 0.01%)
    if e_hi > e_lo:
        rows = gl.arange(0, BN, layout=gl.SliceLayout(1, w.type.layout))
        cols = gl.arange(0, BK, layout=gl.SliceLayout(0, w.type.layout))
        for e in range(e_lo, e_hi):
            q = gl.load(epos_ptr + e)
            w = gl.where((rows[:, None] == q // BK) & (cols[None, :] == q % BK), gl.load(ev_ptr + e), w)
    return w


@gluon.jit
def _lf_put_patch(w, w_s, w_ready, w_empty, i, e_lo, e_hi, q0, v0, epos_ptr, ev_ptr, NS: gl.constexpr,
                  DW: gl.constexpr):
    # _lf_put, then the step's exceptions written over their placeholders in shared memory: the slot's
    # 16-byte chunk of each (128B swizzle: chunk c // 8 of row r sits at r * 8 + (c // 8 ^ r % 8)) read,
    # one lane of it replaced, written back; a barrier of the decoder warps around each. q0, v0: the
    # first exception's entry, loaded at the step's start (its latency behind the words' wait)
    b = i % NS
    mbarrier.wait(w_empty.index(b), ((i // NS) & 1) ^ 1)
    w_s.index(b).store(w)
    if e_hi > e_lo:
        LV8: gl.constexpr = gl.BlockedLayout([8], [32], [DW], [0])
        j8 = gl.arange(0, 8, layout=LV8)
        # 16-byte chunks, indexed at run time (a layout of the inner rank: the leading dim is the index)
        flat = w_s.index(b)._reinterpret(gl.bfloat16, [w_s.shape[1] * 8, 8], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        for e in range(e_lo, e_hi):
            q = q0
            v = v0
            if e > e_lo:
                q = gl.load(epos_ptr + e)
                v = gl.load(ev_ptr + e)
            r = q // BK
            c = q % BK
            chunk = flat.index(r * 8 + ((c // 8) ^ (r % 8)))
            gl.thread_barrier()  # the tile's (or the last patch's) stores before this read
            vals = gl.where(j8 == c % 8, v, chunk.load(LV8))
            gl.thread_barrier()  # every warp's read before any write
            chunk.store(vals)
        gl.thread_barrier()
    fence_async_shared()  # the generic stores before wgmma (async proxy) reads them
    mbarrier.arrive(w_ready.index(b), count=1)


@gluon.jit
def _lf_patch_v(w, vp, vb, jv, n_e, e_lo, epos_ptr, ev_ptr, BN: gl.constexpr, EV: gl.constexpr):
    # as _lf_patch, the step's first EV exceptions from registers loaded a step ahead (vp: positions,
    # vb: true bf16 bits as int32; every thread holds all EV), any further ones by scalar loads
    if n_e > 0:
        rows = gl.arange(0, BN, layout=gl.SliceLayout(1, w.type.layout))
        cols = gl.arange(0, BK, layout=gl.SliceLayout(0, w.type.layout))
        for j in gl.static_range(EV):
            if j < n_e:
                q = gl.sum(gl.where(jv == j, vp, 0), axis=0)
                v = gl.sum(gl.where(jv == j, vb, 0), axis=0).to(gl.int16).to(gl.bfloat16, bitcast=True)
                w = gl.where((rows[:, None] == q // BK) & (cols[None, :] == q % BK), v, w)
        for e in range(e_lo + EV, e_lo + n_e):
            q = gl.load(epos_ptr + e)
            w = gl.where((rows[:, None] == q // BK) & (cols[None, :] == q % BK), gl.load(ev_ptr + e), w)
    return w


@gluon.jit
def _lf_decoder(lo_s, co_s, w_s, p_ready, p_empty, w_ready, w_empty, base_ptr, eoff_ptr, epos_ptr, ev_ptr, n0,
                steps, BN: gl.constexpr, NS: gl.constexpr, NP: gl.constexpr, DW: gl.constexpr, DEC: gl.constexpr,
                DU: gl.constexpr, PROBE: gl.constexpr, TILED: gl.constexpr, PATCH: gl.constexpr,
                LEAN: gl.constexpr):
    # DW warps: a slot's words -> the bf16 tile -> the weight ring; DU 2: two steps at a time (both
    # steps' words loaded before either is decoded: more independent work in flight; steps even)
    if DEC and (PROBE & 2) != 0:  # timing probe: the handoffs alone, no loads, decode or stores
        for i in range(steps):
            mbarrier.wait(p_ready.index(i % NP), (i // NP) & 1)
            mbarrier.arrive(p_empty.index(i % NP), count=1)
            mbarrier.wait(w_empty.index(i % NS), ((i // NS) & 1) ^ 1)
            mbarrier.arrive(w_ready.index(i % NS), count=1)
    elif DEC:
        L8: gl.constexpr = gl.BlockedLayout([1, 2], [8, 4], [DW, 1], [1, 0])
        b4 = gl.load(base_ptr).to(gl.uint32) * 0x01010101
        tb = (n0 // BN) * steps  # PATCH: this tile's exception list of step i is eoff[tb + i] .. eoff[tb + i + 1]
        e_lo = 0
        if PATCH:
            e_lo = gl.load(eoff_ptr + tb)
        if PATCH == 2:  # the step's exception entries loaded a step ahead, EV at a time
            EV: gl.constexpr = 8
            LV: gl.constexpr = gl.BlockedLayout([EV], [32], [DW], [0])
            jv = gl.arange(0, EV, layout=LV)
            e_hi = gl.load(eoff_ptr + tb + 1)
            n_e = e_hi - e_lo
            vp = gl.load(epos_ptr + e_lo + jv, mask=jv < n_e, other=0)
            vb = gl.load(ev_ptr.to(gl.pointer_type(gl.int16)) + e_lo + jv, mask=jv < n_e, other=0).to(gl.int32)
            for i in range(steps):
                e_nx = gl.load(eoff_ptr + tb + gl.minimum(i + 2, steps))
                n_nx = e_nx - e_hi
                vp_nx = gl.load(epos_ptr + e_hi + jv, mask=jv < n_nx, other=0)
                vb_nx = gl.load(ev_ptr.to(gl.pointer_type(gl.int16)) + e_hi + jv, mask=jv < n_nx, other=0).to(gl.int32)
                l0, l1, cw = _lf_words(lo_s, co_s, p_ready, p_empty, i, NP, L8, BN, TILED)
                w = _lf_patch_v(_lf_tile(l0, l1, cw, b4, BN), vp, vb, jv, n_e, e_lo, epos_ptr, ev_ptr, BN, EV)
                _lf_put(w, w_s, w_ready, w_empty, i, NS)
                e_lo = e_hi
                e_hi = e_nx
                n_e = n_nx
                vp = vp_nx
                vb = vb_nx
        elif DU == 2:
            for i in range(0, steps, 2):
                e_mid = e_lo
                e_hi = e_lo
                if PATCH:  # issued before the words' waits: their latency hides behind them
                    e_mid = gl.load(eoff_ptr + tb + i + 1)
                    e_hi = gl.load(eoff_ptr + tb + i + 2)
                a0, a1, ac = _lf_words(lo_s, co_s, p_ready, p_empty, i, NP, L8, BN, TILED)
                c0, c1, cc = _lf_words(lo_s, co_s, p_ready, p_empty, i + 1, NP, L8, BN, TILED)
                wa = _lf_tile(a0, a1, ac, b4, BN)
                wc = _lf_tile(c0, c1, cc, b4, BN)
                if PATCH:
                    wa = _lf_patch(wa, e_lo, e_mid, epos_ptr, ev_ptr, BN, DW)
                    wc = _lf_patch(wc, e_mid, e_hi, epos_ptr, ev_ptr, BN, DW)
                _lf_put(wa, w_s, w_ready, w_empty, i, NS)
                _lf_put(wc, w_s, w_ready, w_empty, i + 1, NS)
                e_lo = e_hi
        else:
            for i in range(steps):
                e_hi = e_lo
                q0 = 0
                v0 = gl.zeros((), gl.bfloat16)
                if PATCH:
                    e_hi = gl.load(eoff_ptr + tb + i + 1)
                if PATCH == 3:  # the lists end with one spare entry: e_lo may be their length
                    q0 = gl.load(epos_ptr + e_lo)
                    v0 = gl.load(ev_ptr + e_lo)
                l0, l1, cw = _lf_words(lo_s, co_s, p_ready, p_empty, i, NP, L8, BN, TILED, LEAN)
                w = _lf_tile(l0, l1, cw, b4, BN)
                if PATCH == 3:
                    _lf_put_patch(w, w_s, w_ready, w_empty, i, e_lo, e_hi, q0, v0, epos_ptr, ev_ptr, NS, DW)
                else:
                    if PATCH == 1:
                        w = _lf_patch(w, e_lo, e_hi, epos_ptr, ev_ptr, BN, DW)
                    _lf_put(w, w_s, w_ready, w_empty, i, NS)
                if LEAN:
                    mbarrier.arrive(p_empty.index(i % NP), count=1)
                e_lo = e_hi


@gluon.jit
def _lf_exceptions(acc, oh_s, x_ptr, m0, M, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, n0, N, K,
                   KP, BN: gl.constexpr, ML: gl.constexpr, EL: gl.constexpr, OHL: gl.constexpr):
    # acc [128 x rows, BN weight rows] plus (true - decoded) * x for each exception of rows n0..:
    # 16 a step as [128, 16] products (A, registers, hi + lo bf16 parts) times a one-hot [16, BN]
    AO: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ML, k_width=2)
    e0 = gl.load(rowptr_ptr + n0)
    e1 = gl.load(rowptr_ptr + gl.minimum(n0 + BN, N))
    b8 = gl.load(base_ptr).to(gl.uint32)
    rm = m0 + gl.arange(0, BMW, layout=gl.SliceLayout(1, EL))
    rn = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, OHL))
    for es in range(e0, e1, EXC_E):
        c, em, tv, pv, r = exc_meta(eidx_ptr, ehi_ptr, lo8_ptr, KP, b8, K, es, e1, EXC_E, EL)
        xv = gl.load(x_ptr + rm[:, None].to(gl.int64) * stride_xm + c[None, :],
                     mask=(rm < M)[:, None] & em[None, :], other=0.0).to(gl.float32)
        d = xv * tv[None, :] - xv * pv[None, :]  # [128, 16]
        hi = d.to(gl.bfloat16)
        lo = (d - hi.to(gl.float32)).to(gl.bfloat16)
        re = gl.convert_layout(r, gl.SliceLayout(0, OHL))
        oh = gl.where(rn[:, None] == re[None, :], 1.0, 0.0).to(gl.bfloat16)  # [BN, 16]
        gl.thread_barrier()  # the previous step's MMAs were waited for by every warp
        oh_s.store(oh)
        fence_async_shared()
        gl.thread_barrier()
        acc = warpgroup_mma(gl.convert_layout(hi, AO), oh_s.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(gl.convert_layout(lo, AO), oh_s.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return acc


@gluon.jit
def _lf_mma(x_s, w_s, oh_s, x_ready, x_empty, w_ready, w_empty, x_ptr, out_ptr, bias_ptr, rowptr_ptr, eidx_ptr,
            ehi_ptr, lo8_ptr, base_ptr, n0, m0, M, N, K, KP, stride_xm, steps, H: gl.constexpr, XB: gl.constexpr,
            BN: gl.constexpr, NS: gl.constexpr, ML: gl.constexpr, EL: gl.constexpr, OHL: gl.constexpr,
            EXC: gl.constexpr, HAS_BIAS: gl.constexpr, PROBE: gl.constexpr):
    # MMA warpgroup H: x rows m0 + 128 H .. of the program, one MMA in flight; a slot is freed
    # once the MMA after it was issued and the one reading it is done (PROBE bit 0: no MMAs)
    acc = gl.zeros([BMW, BN], gl.float32, ML)
    for i in range(steps):
        b = i % NS
        ph = (i // NS) & 1
        mbarrier.wait(x_ready.index(b), ph)
        mbarrier.wait(w_ready.index(b), ph)
        if (PROBE & 1) == 0:
            acc = warpgroup_mma(x_s.index(b * XB + H), w_s.index(b).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        bp = (i + NS - 1) % NS
        mbarrier.arrive(x_empty.index(bp), count=1, pred=i > 0)
        mbarrier.arrive(w_empty.index(bp), count=1, pred=i > 0)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mr = m0 + H * BMW
    if EXC and (PROBE & 16) == 0:
        acc = _lf_exceptions(acc, oh_s.index(H), x_ptr, mr, M, stride_xm, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr,
                             base_ptr, n0, N, K, KP, BN, ML, EL, OHL)
    rows = mr + gl.arange(0, BMW, layout=gl.SliceLayout(1, ML))
    cols = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, ML))
    if HAS_BIAS:
        acc += gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
    keep = rows < M
    if (PROBE & 16) != 0:  # timing probe: no exceptions, and a store mask false at run time (the MMAs stay live)
        keep = rows == -1 - stride_xm
    gl.store(out_ptr + rows[:, None].to(gl.int64) * N + cols[None, :], acc.to(gl.bfloat16),
             mask=keep[:, None] & (cols < N)[None, :])


@gluon.jit
def _lf_kernel(x_desc, lo_desc, co_desc, w_desc, x_ptr, out_ptr, bias_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr,
               base_ptr, eoff_ptr, epos_ptr, ev_ptr, M, N, K, KP, stride_xm, MT, BN: gl.constexpr, XB: gl.constexpr,
               NS: gl.constexpr,
               NP: gl.constexpr, DW: gl.constexpr, ML: gl.constexpr, WSL: gl.constexpr, OHSL: gl.constexpr,
               EL: gl.constexpr, OHL: gl.constexpr, EXC: gl.constexpr, HAS_BIAS: gl.constexpr, DEC: gl.constexpr,
               REGS: gl.constexpr, SPLIT: gl.constexpr = True, DU: gl.constexpr = 1,
               PROBE: gl.constexpr = 0, TILED: gl.constexpr = False, PATCH: gl.constexpr = 0,
               LEAN: gl.constexpr = False):
    # out [M, N] bf16 (+ bias) = x @ W^T; a program: BN weight rows x 128 XB x rows (x tiles inner,
    # so the programs that share a packed tile run together and find it in L2)
    pid = gl.program_id(0)
    n0 = (pid // MT) * BN
    m0 = (pid % MT) * (BMW * XB)
    steps = KP // BK
    x_s = gl.allocate_shared_memory(gl.bfloat16, [NS * XB, BMW, BK], x_desc.layout)
    w_s = gl.allocate_shared_memory(gl.bfloat16, [NS, BN, BK], WSL)
    if TILED:  # one box a step holds every word (co_s unused)
        lo_s = gl.allocate_shared_memory(gl.int32, [3 * NP, BN // 16, 128], lo_desc.layout)
        co_s = gl.allocate_shared_memory(gl.int32, [1, 8, 8], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    else:
        lo_s = gl.allocate_shared_memory(gl.int32, [NP, BN, 16], lo_desc.layout)
        co_s = gl.allocate_shared_memory(gl.int32, [NP, BN, 8], co_desc.layout)
    oh_s = gl.allocate_shared_memory(gl.bfloat16, [XB, BN, EXC_E], OHSL)
    x_ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    x_empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    w_ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    w_empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [NP, 1], mbarrier.MBarrierLayout())
    p_empty = gl.allocate_shared_memory(gl.int64, [NP, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NS):
        mbarrier.init(x_ready.index(j), count=1)
        mbarrier.init(x_empty.index(j), count=XB)
        mbarrier.init(w_ready.index(j), count=1)
        mbarrier.init(w_empty.index(j), count=XB)
    for j in gl.static_range(NP):
        mbarrier.init(p_ready.index(j), count=1)
        mbarrier.init(p_empty.index(j), count=1)
    fence_async_shared()
    if XB == 2:
        gl.warp_specialize([
            (_lf_mma, (x_s, w_s, oh_s, x_ready, x_empty, w_ready, w_empty, x_ptr, out_ptr, bias_ptr, rowptr_ptr,
                       eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, n0, m0, M, N, K, KP, stride_xm, steps, 0, XB, BN, NS, ML,
                       EL, OHL, EXC, HAS_BIAS, PROBE)),
            (_lf_mma, (x_s, w_s, oh_s, x_ready, x_empty, w_ready, w_empty, x_ptr, out_ptr, bias_ptr, rowptr_ptr,
                       eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, n0, m0, M, N, K, KP, stride_xm, steps, 1, XB, BN, NS, ML,
                       EL, OHL, EXC, HAS_BIAS, PROBE)),
            (_lf_decoder, (lo_s, co_s, w_s, p_ready, p_empty, w_ready, w_empty, base_ptr, eoff_ptr, epos_ptr, ev_ptr,
                            n0, steps, BN, NS, NP, DW, DEC, DU, PROBE, TILED, PATCH, LEAN)),
            (_lf_loader, (x_desc, lo_desc, co_desc, w_desc, x_s, lo_s, co_s, w_s, x_ready, x_empty, p_ready, p_empty,
                          w_ready, w_empty, n0, m0, steps, XB, NS, NP, DEC, SPLIT, BN, TILED, PROBE)),
            (_lf_word_loader, (x_desc, lo_desc, co_desc, w_desc, x_s, lo_s, co_s, w_s, x_ready, x_empty, p_ready,
                               p_empty, w_ready, w_empty, n0, m0, steps, XB, NS, NP, DEC, SPLIT, BN, TILED, PROBE)),
        ], [4, DW, 1, 1], [REGS[0], REGS[1], REGS[2], REGS[2]])
    else:
        gl.warp_specialize([
            (_lf_mma, (x_s, w_s, oh_s, x_ready, x_empty, w_ready, w_empty, x_ptr, out_ptr, bias_ptr, rowptr_ptr,
                       eidx_ptr, ehi_ptr, lo8_ptr, base_ptr, n0, m0, M, N, K, KP, stride_xm, steps, 0, XB, BN, NS, ML,
                       EL, OHL, EXC, HAS_BIAS, PROBE)),
            (_lf_decoder, (lo_s, co_s, w_s, p_ready, p_empty, w_ready, w_empty, base_ptr, eoff_ptr, epos_ptr, ev_ptr,
                            n0, steps, BN, NS, NP, DW, DEC, DU, PROBE, TILED, PATCH, LEAN)),
            (_lf_loader, (x_desc, lo_desc, co_desc, w_desc, x_s, lo_s, co_s, w_s, x_ready, x_empty, p_ready, p_empty,
                          w_ready, w_empty, n0, m0, steps, XB, NS, NP, DEC, SPLIT, BN, TILED, PROBE)),
            (_lf_word_loader, (x_desc, lo_desc, co_desc, w_desc, x_s, lo_s, co_s, w_s, x_ready, x_empty, p_ready,
                               p_empty, w_ready, w_empty, n0, m0, steps, XB, NS, NP, DEC, SPLIT, BN, TILED, PROBE)),
        ], [DW, 1, 1], [REGS[1], REGS[2], REGS[2]])


@functools.lru_cache(maxsize=None)
def layouts(bn: int):
    """(accumulator, weight ring, one-hot, exception products, one-hot registers) layouts, and the
    (x, lo, code, bf16 W) TMA shared layouts, for BN weight rows and 4-warp MMA warpgroups."""
    ml = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, bn, 16])
    wsl = gl.NVMMASharedLayout.get_default_for([bn, BK.value], gl.bfloat16)
    ohsl = gl.NVMMASharedLayout.get_default_for([bn, EXC_E.value], gl.bfloat16)
    el = gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0])  # [128, 16] products, and their column slices
    ohl = gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0])  # [BN, 16] one-hot
    shared = (gl.NVMMASharedLayout.get_default_for([BMW.value, BK.value], gl.bfloat16),
              gl.NVMMASharedLayout.get_default_for([bn, 16], gl.int32),
              gl.NVMMASharedLayout.get_default_for([bn, 8], gl.int32), wsl)
    return ml, wsl, ohsl, el, ohl, shared


TILED_SL = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)  # row-major, as TMA writes
_TILED: dict = {}


# lo [N, KP] uint8, code [N, KP / 2] uint8 -> int32 [N / bn * KP / 64 * 3 * bn / 16, 128]
def tiled_words(p, bn: int) -> torch.Tensor:
    """The packed words re-laid so a (bn weight rows, 64-column step) tile is 3 * bn * 8 contiguous int32:
    planes [lo words 0-7, lo words 8-15, code words], each [bn, 8] row-major (one TMA box of
    512-byte rows a step, and bank-conflict-free reads of 8 words a row). Cached by the lo array."""
    lo, co = p.arrays["lo"], p.arrays["code"]
    key = (lo.data_ptr(), bn)
    if key not in _TILED:
        n, kp = lo.shape
        if n % bn or kp % 64:
            raise ValueError(f"tiled words need N % {bn} == 0 and KP % 64 == 0, got {n} x {kp}")
        nt, st = n // bn, kp // 64
        lo_t = lo.view(torch.int32).view(nt, bn, st, 2, 8).permute(0, 2, 3, 1, 4)
        co_t = co.view(torch.int32).view(nt, bn, st, 1, 8).permute(0, 2, 3, 1, 4)
        _TILED[key] = torch.cat([lo_t, co_t], 2).contiguous().view(-1, 128)
    return _TILED[key]


_PATCH: dict = {}


# -> (eoff int32 [N / bn * KP / 64 + 1], epos int32 [E], ev bf16 [E])
def patch_lists(p, bn: int):
    """Each (bn-row tile, 64-column step)'s exceptions for the decoder's in-tile patch: CSR offsets over
    tile * steps + step, the position r * 64 + c inside the [bn, 64] tile, and the true bf16 value (one
    spare entry at the end: the decoder loads a step's first entry before it knows the step has one)."""
    key = (p.arrays["lo"].data_ptr(), bn)
    if key not in _PATCH:
        n, k = p.shape
        kp = p.arrays["lo"].shape[1]
        st = kp // 64
        prep = prepare(p)
        dev = p.arrays["lo"].device
        if prep.nexc:
            r, c = prep.pos // k, prep.pos % k
            cell = (r // bn) * st + c // 64
            order = torch.argsort(cell, stable=True)
            zero = torch.zeros(1, dtype=torch.int32, device=dev)
            epos = torch.cat([((r % bn) * 64 + c % 64)[order].to(torch.int32), zero])  # + a spare entry
            ev = torch.cat([prep.vals[order], zero.to(torch.int16)]).view(torch.bfloat16)
            eoff = torch.searchsorted(cell[order], torch.arange(n // bn * st + 1, device=dev)).to(torch.int32)
        else:
            epos = torch.zeros(1, dtype=torch.int32, device=dev)
            ev = torch.zeros(1, dtype=torch.bfloat16, device=dev)
            eoff = torch.zeros(n // bn * st + 1, dtype=torch.int32, device=dev)
        _PATCH[key] = (eoff, epos, ev)
    return _PATCH[key]


def regs(xb: int, dw: int) -> tuple:
    """(kernel maxnreg, [MMA warpgroup 1, decoder, loader] registers): 16 warps (4 warpgroups) share
    the 64 K registers an SM; the default partition (MMA warpgroup 0) gets what the workers leave."""
    if xb == 2:
        return 128, (200, 88, 24)  # default: 4 x 128 - 200 - 88 - 24 = 200 (192 for both spilled)
    return 168, (192, 152, 24)


# x [M, K] bf16 (K % 8 == 0, rows 16-byte aligned), packed fixed12 W [N, K] -> out [M, N] bf16
def launch(x: torch.Tensor, p, bias=None, bn: int = 128, xb: int = 2, ns: int = 3, np_: int = 4, dw: int = 4,
           split: bool = True, du: int = 1, probe: int = 0, w_bf16: torch.Tensor | None = None, out: torch.Tensor | None = None,
           tiled: bool = False, patch: int = 0, lean: bool = False) -> torch.Tensor:
    """``x @ W.T (+ bias)`` by the fused kernel; ``w_bf16`` (the unpacked W) runs its DEC=False twin."""
    n, k = p.shape
    kp = p.arrays["lo"].shape[1]
    m = x.shape[0]
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be bf16 [M, {k}], got {tuple(x.shape)} {x.dtype}")
    if k % 8 or x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        raise ValueError("x rows must be 16-byte aligned and K a multiple of 8 (TMA)")
    if bias is not None and (bias.dtype != torch.bfloat16 or bias.shape != (n, )):
        raise ValueError(f"bias must be bf16 [{n}], got {tuple(bias.shape)} {bias.dtype}")
    dec = w_bf16 is None
    ml, wsl, ohsl, el, ohl, (xsl, lsl, csl, wtl) = layouts(bn)
    lo_i, co_i = p.arrays["lo"].view(torch.int32), p.arrays["code"].view(torch.int32)
    x_d = TensorDescriptor.from_tensor(x, [BMW.value, BK.value], xsl)
    tiled = tiled and dec
    if tiled:
        lo_d = TensorDescriptor.from_tensor(tiled_words(p, bn), [bn // 16, 128], TILED_SL)
        co_d = lo_d
    else:
        lo_d = TensorDescriptor.from_tensor(lo_i, [bn, 16], lsl)
        co_d = TensorDescriptor.from_tensor(co_i, [bn, 8], csl)
    w_d = TensorDescriptor.from_tensor(w_bf16 if not dec else x, [bn, BK.value] if not dec else [BMW.value, BK.value],
                                       wtl if not dec else xsl)
    prep = prepare(p)
    patch = int(patch) if dec else 0  # 1: in registers; 2: entries loaded a step ahead; 3: in shared memory
    if patch and n % bn:
        raise ValueError(f"the in-tile patch needs N % {bn} == 0, got {n}")
    exc = dec and prep.nexc > 0 and not patch
    eoff, epos, ev = patch_lists(p, bn) if patch else (prep.rowptr, prep.rowptr, x)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x.device) if out is None else out
    mt = triton.cdiv(m, BMW.value * xb)
    maxnreg, rr = regs(xb, dw)
    a = p.arrays
    _lf_kernel[(triton.cdiv(n, bn) * mt, )](
        x_d, lo_d, co_d, w_d, x, out, bias if bias is not None else out, prep.rowptr if exc else a["exc_idx"],
        a["exc_idx"], a["exc_hi"], a["lo"], a["base"], eoff, epos, ev, m, n, k, kp, x.stride(0), mt,
        BN=bn, XB=xb, NS=ns, NP=np_, DW=dw, ML=ml, WSL=wsl, OHSL=ohsl, EL=el, OHL=ohl, EXC=exc,
        HAS_BIAS=bias is not None, DEC=dec, REGS=rr, SPLIT=split, DU=du if (kp // BK.value) % du == 0 else 1, PROBE=probe,
        TILED=tiled, PATCH=patch, LEAN=lean and du == 1, num_warps=4, maxnreg=maxnreg)
    return out


def compile_sm90(bn: int = 128, xb: int = 2, ns: int = 3, np_: int = 4, dw: int = 4, exc: bool = True,
                 dec: bool = True, bias: bool = False, split: bool = True, du: int = 1, probe: int = 0,
                 tiled: bool = False, patch: int = 0, lean: bool = False):
    """The kernel compiled for sm_90 on any machine (Triton's ptxas; no GPU): its CompiledKernel."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ml, wsl, ohsl, el, ohl, (xsl, lsl, csl, wtl) = layouts(bn)
    maxnreg, rr = regs(xb, dw)
    const = dict(BN=bn, XB=xb, NS=ns, NP=np_, DW=dw, ML=ml, WSL=wsl, OHSL=ohsl, EL=el, OHL=ohl, EXC=exc,
                 HAS_BIAS=bias, DEC=dec, REGS=rr, SPLIT=split, DU=du, PROBE=probe, TILED=tiled,
                 PATCH=patch, LEAN=lean)
    lo_t = f"tensordesc<i32[{bn // 16}, 128],{TILED_SL!r}>"
    descs = {"x_desc": f"tensordesc<bf16[{BMW.value}, {BK.value}],{xsl!r}>",
             "lo_desc": lo_t if tiled else f"tensordesc<i32[{bn}, 16],{lsl!r}>",
             "co_desc": lo_t if tiled else f"tensordesc<i32[{bn}, 8],{csl!r}>",
             "w_desc": f"tensordesc<bf16[{bn}, {BK.value}],{wtl!r}>" if not dec else f"tensordesc<bf16[{BMW.value}, {BK.value}],{xsl!r}>"}
    ptrs = {"x_ptr": "*bf16", "out_ptr": "*bf16", "bias_ptr": "*bf16", "rowptr_ptr": "*i32", "eidx_ptr": "*i32",
            "ehi_ptr": "*u8", "lo8_ptr": "*u8", "base_ptr": "*u8", "eoff_ptr": "*i32", "epos_ptr": "*i32",
            "ev_ptr": "*bf16"}
    kern = _lf_kernel
    names = kern.arg_names
    sig = {a: "constexpr" if a in const else descs.get(a) or ptrs.get(a, "i32") for a in names}
    attrs = {(names.index(a), ): [["tt.divisibility", 16]] for a in names if a in ptrs or a in ("KP", "stride_xm")}
    return triton.compile(GluonASTSource(kern, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=4, maxnreg=maxnreg))


def resources(k) -> dict:
    """Registers, stack, shared and local bytes of a compiled kernel (cuobjdump -res-usage), and the
    SASS counts that say whether the design holds: spill stores, wgmma, TMA copies, byte permutes."""
    import os
    import re
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    res = {key: int(v) for key, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage)}
    res.update(STL=sass.count("STL"), HGMMA=sass.count("HGMMA"), UTMALDG=sass.count("UTMALDG"),
               PRMT=sass.count("PRMT"), SETMAXNREG=sass.count("USETMAXREG"))
    return res
