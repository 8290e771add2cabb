"""The Gluon tile's exception step and epilogue (``fixed12.mma_v2``): the exceptions of a tile's rows
loaded before the K loop and added after it by a one-hot MMA, and the stores of the result (fp32
partials, bf16 with bias, or the in-kernel split-K sum)."""

from __future__ import annotations

import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from glyd.kernels._gluon_bits import exc_meta, wait_count


@gluon.jit
def exc_preload(x_ptr, base_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, lo8_ptr, pid_n, pid_k, m0, M, N, KP, K, stride_xm,
                 BN: gl.constexpr, EE: gl.constexpr, EXL: gl.constexpr, MT: gl.constexpr):
    # this split program's first round of the tile's rows' exceptions and their x values for each x
    # tile: rounds of EE, program pid_k of the tile's split programs takes rounds pid_k, pid_k + splits, ...
    n0 = pid_n * BN
    b8 = gl.load(base_ptr).to(gl.uint32)
    e0 = gl.load(rowptr_ptr + n0) + pid_k * EE
    e1 = gl.load(rowptr_ptr + gl.minimum(n0 + BN, N))
    ec, eem, etv, epv, er = exc_meta(eidx_ptr, ehi_ptr, lo8_ptr, KP, b8, K, e0, e1, EE, EXL)
    ed = exc_x(x_ptr, m0, M, stride_xm, ec, eem, etv, epv, EXL)
    ed1 = ed  # (unused below MT 2 and 4)
    ed2 = ed
    ed3 = ed
    if MT > 1:
        ed1 = exc_x(x_ptr, m0 + 16, M, stride_xm, ec, eem, etv, epv, EXL)
    if MT > 2:
        ed2 = exc_x(x_ptr, m0 + 32, M, stride_xm, ec, eem, etv, epv, EXL)
        ed3 = exc_x(x_ptr, m0 + 48, M, stride_xm, ec, eem, etv, epv, EXL)
    return n0, b8, e0, e1, er, ed, ed1, ed2, ed3


@gluon.jit
def exc_tiles(acc, acc1, acc2, acc3, ed, ed1, ed2, ed3, er, x_ptr, m0, M, stride_xm, eidx_ptr, ehi_ptr, lo8_ptr, KP,
               b8, n0, K, es0, e1, step, BN: gl.constexpr, EE: gl.constexpr, EL: gl.constexpr, EXL: gl.constexpr,
               ML: gl.constexpr, MT: gl.constexpr):
    # each x tile's accumulator plus this program's rounds of the tile's exceptions (es0.., step apart)
    acc = exc_total(acc, ed, er, x_ptr, m0, M, stride_xm, eidx_ptr, ehi_ptr, lo8_ptr, KP, b8, n0, K, es0, e1, step,
                     BN, EE, EL, EXL, ML)
    if MT > 1:
        acc1 = exc_total(acc1, ed1, er, x_ptr, m0 + 16, M, stride_xm, eidx_ptr, ehi_ptr, lo8_ptr, KP, b8, n0, K, es0,
                          e1, step, BN, EE, EL, EXL, ML)
    if MT > 2:
        acc2 = exc_total(acc2, ed2, er, x_ptr, m0 + 32, M, stride_xm, eidx_ptr, ehi_ptr, lo8_ptr, KP, b8, n0, K, es0,
                          e1, step, BN, EE, EL, EXL, ML)
        acc3 = exc_total(acc3, ed3, er, x_ptr, m0 + 48, M, stride_xm, eidx_ptr, ehi_ptr, lo8_ptr, KP, b8, n0, K, es0,
                          e1, step, BN, EE, EL, EXL, ML)
    return acc, acc1, acc2, acc3


@gluon.jit
def _imax(a, b):
    # gl.max's combine as a Gluon function (gl.max's own is a Triton one, which the interpreter's compile tests reject)
    return gl.maximum(a, b)


@gluon.jit
def exc_rows_t(acc, x_ptr, m0, M, stride_xm, K, rowptr_ptr, eidx_ptr, vals_ptr, base_ptr, n0, N, part, parts,
               BN: gl.constexpr, ML: gl.constexpr):
    # GluonConfig.exc_rows: acc [16 x rows from m0, BN weight rows from n0] (layout ML) += x[rows, c] * (true -
    # decoded w) for each exception (w, c) of the weight rows, by the threads that hold each weight row: round j
    # takes the j-th exception of every row at once (rows without one masked), rounds part, part + parts, ...;
    # a row's list starts at its row pointer (no division); true values from the prepared list (Prepared.vals)
    rn = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, ML))
    ea = gl.load(rowptr_ptr + gl.minimum(rn, N))  # rows past N: an empty list
    cnt = gl.load(rowptr_ptr + gl.minimum(rn + 1, N)) - ea
    cm = m0 + gl.arange(0, 16, layout=gl.SliceLayout(1, ML))
    mm = (cm < M)[:, None]
    b8 = gl.load(base_ptr).to(gl.uint32)
    for j in range(part, gl.reduce(cnt, 0, _imax), parts):
        ev = j < cnt
        e = ea + j
        idx = gl.load(eidx_ptr + e, mask=ev, other=0)
        c = idx - rn.to(idx.dtype) * K
        v = gl.load(vals_ptr + e, mask=ev, other=0).to(gl.int32).to(gl.uint32) & 0xFFFF
        tv = (v << 16).to(gl.float32, bitcast=True)
        pv = (((v & 0x80FF) | (b8 << 8)) << 16).to(gl.float32, bitcast=True)  # the decoded placeholder
        d = gl.where(ev, tv - pv, 0.0)  # within 2^-24 of true - placeholder (the one-hot MMA's parts: 2^-16)
        xv = gl.load(x_ptr + cm[:, None] * stride_xm + c[None, :], mask=mm & ev[None, :], other=0.0).to(gl.float32)
        acc += xv * d[None, :]
    return acc


@gluon.jit
def epilogue(acc, acc1, acc2, acc3, part_ptr, out_ptr, bias_ptr, cnt_ptr, pid_n, pid_k, pid_m, m0, M, N,
              BN: gl.constexpr, ML: gl.constexpr, MT: gl.constexpr, OUT: gl.constexpr, HAS_BIAS: gl.constexpr,
              CS: gl.constexpr):
    # OUT 0: store the fp32 partial; 1: the bf16 result (+ bias); 2: the last split program of the
    # tile sums the others' partials in the kernel and stores the bf16 result
    om = m0 + gl.arange(0, 16, layout=gl.SliceLayout(1, ML))[:, None]
    on = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, ML))[None, :]
    if OUT == 0:
        store_parts(acc, acc1, acc2, acc3, part_ptr + pid_k * M * N, om, on, M, N, MT)
    elif OUT == 1:
        store_out(acc, acc1, acc2, acc3, out_ptr, bias_ptr, om, on, M, N, MT, HAS_BIAS)
    else:
        nsplit = gl.num_programs(1)
        tile = pid_m * gl.num_programs(0) + pid_n
        if pid_k == nsplit - 1:
            wait_count(cnt_ptr + tile * CS, nsplit - 1)
            gl.atomic_xchg(cnt_ptr + tile * CS, 0, sem="relaxed", scope="gpu")
            acc = sum_parts(acc, part_ptr, om, on, M, N, nsplit)
            if MT > 1:
                acc1 = sum_parts(acc1, part_ptr, om + 16, on, M, N, nsplit)
            if MT > 2:
                acc2 = sum_parts(acc2, part_ptr, om + 32, on, M, N, nsplit)
                acc3 = sum_parts(acc3, part_ptr, om + 48, on, M, N, nsplit)
            store_out(acc, acc1, acc2, acc3, out_ptr, bias_ptr, om, on, M, N, MT, HAS_BIAS)
        else:
            # not the last split: store the partial, count in (the barrier orders every thread's
            # stores before the releasing atomic) and exit without waiting; the last split
            # program has a higher block index, so it is scheduled after this one
            store_parts(acc, acc1, acc2, acc3, part_ptr + pid_k * M * N, om, on, M, N, MT)
            gl.thread_barrier()
            gl.atomic_add(cnt_ptr + tile * CS, 1, sem="release", scope="gpu")


@gluon.jit
def store_out(acc, acc1, acc2, acc3, out_ptr, bias_ptr, om, on, M, N, MT: gl.constexpr, HAS_BIAS: gl.constexpr):
    # the bf16 results (+ bias) of the MT x tiles
    store_bf16(acc, out_ptr, bias_ptr, om, on, M, N, HAS_BIAS)
    if MT > 1:
        store_bf16(acc1, out_ptr, bias_ptr, om + 16, on, M, N, HAS_BIAS)
    if MT > 2:
        store_bf16(acc2, out_ptr, bias_ptr, om + 32, on, M, N, HAS_BIAS)
        store_bf16(acc3, out_ptr, bias_ptr, om + 48, on, M, N, HAS_BIAS)


@gluon.jit
def store_parts(acc, acc1, acc2, acc3, pp, om, on, M, N, MT: gl.constexpr):
    # the fp32 partials of the MT x tiles (rows om.., columns on) at pp (one split's [M, N] slab)
    optr = pp + om * N + on
    gl.store(optr, acc, mask=(om < M) & (on < N))
    if MT > 1:
        gl.store(optr + 16 * N, acc1, mask=(om + 16 < M) & (on < N))
    if MT > 2:
        gl.store(optr + 32 * N, acc2, mask=(om + 32 < M) & (on < N))
        gl.store(optr + 48 * N, acc3, mask=(om + 48 < M) & (on < N))


@gluon.jit
def sum_parts(acc, part_ptr, om, on, M, N, nsplit):
    # the other splits' partials in split order, then this program's (the last split) last:
    # ``finalize``'s order, so the same bits. Read from L2 (.cg), where the other SMs wrote them.
    mask = (om < M) & (on < N)
    pp = part_ptr + om * N + on
    tot = gl.load(pp, mask=mask, other=0.0, cache_modifier=".cg")
    for s in range(1, nsplit - 1):
        tot += gl.load(pp + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
    return tot + acc


@gluon.jit
def store_bf16(acc, out_ptr, bias_ptr, om, on, M, N, HAS_BIAS: gl.constexpr):
    if HAS_BIAS:
        acc += gl.load(bias_ptr + on, mask=on < N, other=0.0).to(gl.float32)
    gl.store(out_ptr + om * N + on, acc.to(gl.bfloat16), mask=(om < M) & (on < N))


@gluon.jit
def exc_x(x_ptr, m0, M, stride_xm, c, em, tv, pv, L2: gl.constexpr):
    # [16, E] (layout L2): x rows m0.. at the exceptions' columns times (true - decoded weight)
    rm = m0 + gl.arange(0, 16, layout=gl.SliceLayout(1, L2))
    xv = gl.load(x_ptr + rm[:, None] * stride_xm + c[None, :], mask=(rm < M)[:, None] & em[None, :],
                 other=0.0).to(gl.float32)
    return xv * tv[None, :] - xv * pv[None, :]


@gluon.jit
def exc_mma(acc, d, r, n0, BN: gl.constexpr, OL: gl.constexpr, ML: gl.constexpr):
    # acc [16, BN] (layout ML) += d [16, E] (x times (true - decoded weight) of E exceptions) summed
    # onto each exception's weight row r - n0: an MMA with a one-hot [E, BN] operand, d split into
    # two bf16 parts (hi + lo keeps 16 of fp32's 24 significand bits: error <= 2^-16 of each term)
    AO: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ML, k_width=2)
    BO: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=ML, k_width=2)
    r = gl.convert_layout(r, gl.SliceLayout(1, OL))
    rn = (n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, OL))).to(gl.int64)
    oh = gl.convert_layout(gl.where(rn[None, :] == r[:, None], 1.0, 0.0).to(gl.bfloat16), BO)
    hi = d.to(gl.bfloat16)
    lo = (d - hi.to(gl.float32)).to(gl.bfloat16)
    acc = mma_v2(gl.convert_layout(hi, AO), oh, acc)
    return mma_v2(gl.convert_layout(lo, AO), oh, acc)


@gluon.jit
def exc_total(acc, d, r, x_ptr, m0, M, stride_xm, eidx_ptr, ehi_ptr, lo8_ptr, stride_lo, base, n0, K, es0, e1, step,
               BN: gl.constexpr, E: gl.constexpr, OL: gl.constexpr, L2: gl.constexpr, ML: gl.constexpr):
    # acc plus the exceptions of weight rows n0..: the round loaded before the K loop (d, r), then
    # this program's rounds past it (es0.., step apart, E each; at real weights' 0.1% a 64 x 3584
    # tile holds ~230, shared among the tile's split programs).
    acc = exc_mma(acc, d, r, n0, BN, OL, ML)
    for es in range(es0, e1, step):
        c, em, tv, pv, rr = exc_meta(eidx_ptr, ehi_ptr, lo8_ptr, stride_lo, base, K, es, e1, E, L2)
        acc = exc_mma(acc, exc_x(x_ptr, m0, M, stride_xm, c, em, tv, pv, L2), rr, n0, BN, OL, ML)
    return acc

EXC_E = 16  # exceptions a step of the in-tile exception sum (the one-hot MMA's K)


@functools.lru_cache(maxsize=None)
def exc_layouts(warps: int):
    """(one-hot, compact) layouts of the in-tile exception step: the [16 exceptions, bn weight rows]
    one-hot operand as built (then converted to the MMA's B operand), and the [16 x rows, 16
    exceptions] layout its loaded values are held in across the K loop (one or two a thread)."""
    onehot = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[4, 8], warps_per_cta=[1, warps],
                              order=[1, 0])
    compact = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[2, 16], warps_per_cta=[warps, 1],
                               order=[1, 0])
    return onehot, compact
