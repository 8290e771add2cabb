"""The decode of dense11 format version 3 for Hopper's warpgroup MMA (``dense11_wgmma``: ``wgmma.py``, its ring
of stages ``wgmma_ring.py``): a step's words as wgmma's register A operand in slot order, and the x tile in the same
order.

Lane (g, c) of a warp holds run c (32 columns) of rows g and g + 8 of a 128-column step, 4 lane words a row (word q:
columns 16 h + 4 q .. + 3 of the run's half h; ``fixed12.wgmma.layouts``), so a thread's 4 weights of a lane word are
wgmma's k pairs (2c, 2c + 1) and (2c + 8, 2c + 9) of the 16-wide k chunk (h, q): slot k = 64 h + 16 q + 8 T + 2 c + j
holds column 32 c + 16 h + 4 q + 2 T + j. A run's values (codes, escape flags, ranks, the escape window) are computed
once a run on a [64, 4] layout (``run_layout``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from glyd.codec import dense11 as _codec
from glyd.kernels._gluon_bits import funnel, popc, prmt, prmt_r, shfl_last4, shfl_up4, split16
from glyd.kernels.fixed12.wgmma import wg_row_exceptions, wg_store

BK = gl.constexpr(128)  # columns a K step: 4 runs of 32 a row
BLOCK = _codec.BLOCK  # columns a block (its escape ranks start from its offsets): K splits are whole blocks
BN = gl.constexpr(64)  # weight rows a program: one warpgroup's wgmma M
# the decoded [row, c1, c0, q1, q0, j, T, h] words and the x tile's [row, c1, c0, h, q1, q0, T, j] columns, both
# permuted to slot order (h q1 q0 T c1 c0 j)
DECODE_ORDER = gl.constexpr((0, 7, 3, 4, 6, 1, 2, 5))
X_ORDER = gl.constexpr((0, 3, 4, 5, 6, 1, 2, 7))


@gluon.jit
def _u(v):
    return v.to(gl.uint32, bitcast=True)


@gluon.jit
def _codes(code_ptr, c_off, st, RUNS):
    # step st's code words c0, c1, c2 of each run ([BN, 4] runs)
    b = st // 8
    rb = gl.minimum(RUNS - 32 * b, 32)  # runs of block b (the last may be short)
    cw = code_ptr + c_off + 96 * b + (st % 8) * 4
    return _u(gl.load(cw)), _u(gl.load(cw + rb)), _u(gl.load(cw + 2 * rb))


@gluon.jit
def _rest(sm_ptr, x_ptr, s_off, xoff, st, RUNS):
    # step st's sm words of halves a and b ([BN, 16] lane words, version 3's block-wise places) and the [BT, 128] x
    # tile in column order (16-byte loads)
    b = st // 8
    rb = gl.minimum(RUNS - 32 * b, 32)
    sp = sm_ptr + s_off + 256 * b + 16 * (st % 8)
    return _u(gl.load(sp)), _u(gl.load(sp + 4 * rb)), gl.load(x_ptr + xoff + st * BK)


@gluon.jit
def _loads(code_ptr, sm_ptr, x_ptr, c_off, s_off, xoff, st, RUNS):
    # step st's plane words and x tile: (c0, c1, c2, s4a, s4b, x)
    c0, c1, c2 = _codes(code_ptr, c_off, st, RUNS)
    s4a, s4b, xv = _rest(sm_ptr, x_ptr, s_off, xoff, st, RUNS)
    return c0, c1, c2, s4a, s4b, xv


@gluon.jit
def _wide(v, BN: gl.constexpr, WL: gl.constexpr):
    # a run's value [BN, 4] for each of its 4 lane words [BN, 16] (the lane's own registers: no data moves)
    return gl.convert_layout(gl.reshape(gl.join(gl.join(v, v), gl.join(v, v)), [BN, 16]), WL)


@gluon.jit
def _nib_esc(x):
    # bit 4i set where nibble i's low 3 bits are all ones (code 7: an escape)
    return x & (x >> 1) & (x >> 2) & 0x11111111


@gluon.jit
def _window_words(rank, tot, esc_ptr, NESCW):
    # the two digit-stream words holding a run's first 8 escapes from its rank (none loaded where it has none)
    wi = rank >> 3
    w0 = _u(gl.load(esc_ptr + wi, mask=(tot > 0) & (wi < NESCW), other=0))
    w1 = _u(gl.load(esc_ptr + wi + 1, mask=(tot + (rank & 7) > 8) & (wi + 1 < NESCW), other=0))
    return w0, w1


@gluon.jit
def _window(w0, w1, rank, HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1):
    # exponent hi bytes and low bits (as 0x01) of a run's first 8 escapes from its window words, 4 a word: (eh0,
    # eh1, el0, el1), as decode_v2._window
    win = funnel(w0, w1, (4 * (rank & 7)).to(gl.uint32))  # digit i (i < 8) in nibble i
    d0 = win & 0xFFFF
    d1 = win >> 16
    # digits 0-7 from the A tables, 8-15 from the B ones: the other table's lookup has bit 3 set, reads 0
    eh0 = prmt_r(HA0, HA1, d0) | prmt_r(HB0, HB1, d0 ^ 0x8888)
    eh1 = prmt_r(HA0, HA1, d1) | prmt_r(HB0, HB1, d1 ^ 0x8888)
    el0 = prmt_r(LA0, LA1, d0) | prmt_r(LB0, LB1, d0 ^ 0x8888)
    el1 = prmt_r(LA0, LA1, d1) | prmt_r(LB0, LB1, d1 ^ 0x8888)
    return eh0, eh1, el0, el1


@gluon.jit
def _half(xa, xb, s4, q, fa, fb, pa, pb, eh0, eh1, el0, el1, th0, th1, tl0, tl1):
    # one half of each run ([BN, 16] lane words, word q: (xa, nibble half 0), (xa, 1), (xb, 0), (xb, 1)) as bf16
    # [BN, 16, j, T] (join's minor dimensions: element [j, T] is the word's weight 2 T + j), decode_v2._half's
    # bytes: the codes looked up, escapes patched in from the window. Each input is a run word whose nibble half h
    # is the lane word's selector as is (prmt reads a selector's low 16 bits): xa, xb the codes (bit 3 cleared);
    # fa, fb 0x3210 plus 4 at an escape's nibble; pa, pb the escapes' ranks in the run, clamped at 8 (_run_words)
    lo2 = q < 2
    h = ((q & 1) * 16).to(gl.uint32)
    sel = gl.where(lo2, xa, xb) >> h
    hot_hi = prmt_r(th0, th1, sel)
    hot_lo = prmt_r(tl0, tl1, sel)
    k = gl.where(lo2, pa, pb) >> h
    sel2 = gl.where(lo2, fa, fb) >> h  # an escape's byte t from the escapes' word (byte 4 + t)
    hot_hi = prmt_r(hot_hi, prmt_r(eh0, eh1, k), sel2) | (s4 & 0x80808080)
    hot_lo = prmt_r(hot_lo, prmt_r(el0, el1, k) << 7, sel2) | (s4 & 0x7F7F7F7F)
    e0, e1 = split16(prmt(hot_lo, hot_hi, 0x5140))
    e2, e3 = split16(prmt(hot_lo, hot_hi, 0x7362))
    return gl.join(gl.join(e0, e1), gl.join(e2, e3))


@gluon.jit
def _run_words(f, before):
    # a code word's selectors for _half: 0x3210 plus 4 at each escape's nibble, and each nibble's escape rank in the
    # run (the word's escapes before it plus ``before``, clamped at 8: 15 at most, no carry between nibbles)
    return f * 4 + 0x32103210, f * 0x11111110 + gl.minimum(before, 8).to(gl.uint32) * 0x11111111


@gluon.jit
def _flags(c0, c1, c2):
    # a run's codes of columns 24-31 (d), escape flags of its 4 code words (bit 4i: nibble i is code 7), and its
    # escapes before words 1, 2, 3 and in all (n0, b2, b3, tot)
    d = ((c0 >> 3) & 0x11111111) | ((c1 >> 2) & 0x22222222) | ((c2 >> 1) & 0x44444444)  # codes of columns 24-31
    f0 = _nib_esc(c0)
    f1 = _nib_esc(c1)
    f2 = _nib_esc(c2)
    f3 = _nib_esc(d)
    n0 = popc(f0)
    b2 = n0 + popc(f1)
    b3 = b2 + popc(f2)
    return d, f0, f1, f2, f3, n0, b2, b3, b3 + popc(f3)


@gluon.jit
def _ranks(tot, run, cc):
    # each run's first escape's index in the digit stream (run: the row's at the step's first column, alike along
    # the row; cc: the run's lane in 4) and the row's index past the step
    inc = tot + gl.where(cc >= 1, shfl_up4(tot, 1), 0)  # the row's escapes up to this run's
    inc = inc + gl.where(cc >= 2, shfl_up4(inc, 2), 0)
    return run + inc - tot, run + shfl_last4(inc)


@gluon.jit
def _lanes(c0, c1, c2, s4a, s4b, q, w0, w1, rank, th0, th1, tl0, tl1, HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1,
           BN: gl.constexpr, WL: gl.constexpr, AL: gl.constexpr):
    # a step's words as the [BN, 128] A operand in slot order from its runs' codes and window words (w0, w1 at
    # rank)
    w = _lane_words(c0, c1, c2, s4a, s4b, q, w0, w1, rank, th0, th1, tl0, tl1, HA0, HA1, HB0, HB1, LA0, LA1, LB0,
                    LB1, BN, WL)
    return gl.convert_layout(gl.reshape(gl.permute(w, DECODE_ORDER.value), [BN, BK]), AL)


@gluon.jit
def _lane_words(c0, c1, c2, s4a, s4b, q, w0, w1, rank, th0, th1, tl0, tl1, HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1,
                BN: gl.constexpr, WL: gl.constexpr):
    # a step's decoded weights as bf16 [row, c1, c0, q1, q0, j, T, h] (column 32 c + 16 h + 4 q + 2 T + j) in the
    # lane words' registers. The run values (codes, escape flags, ranks, the escape window) are computed once a run
    # ([BN, 4])
    d, f0, f1, f2, f3, n0, b2, b3, tot = _flags(c0, c1, c2)
    eh0, eh1, el0, el1 = _window(w0, w1, rank, HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1)
    eh0 = _wide(eh0, BN, WL)
    eh1 = _wide(eh1, BN, WL)
    el0 = _wide(el0, BN, WL)
    el1 = _wide(el1, BN, WL)
    s0, r0 = _run_words(f0, n0 * 0)
    s1, r1 = _run_words(f1, n0)
    s2, r2 = _run_words(f2, b2)
    s3, r3 = _run_words(f3, b3)
    wa = _half(_wide(c0 & 0x77777777, BN, WL), _wide(c1 & 0x77777777, BN, WL), s4a, q, _wide(s0, BN, WL),
               _wide(s1, BN, WL), _wide(r0, BN, WL), _wide(r1, BN, WL), eh0, eh1, el0, el1, th0, th1, tl0, tl1)
    wb = _half(_wide(c2 & 0x77777777, BN, WL), _wide(d, BN, WL), s4b, q, _wide(s2, BN, WL), _wide(s3, BN, WL),
               _wide(r2, BN, WL), _wide(r3, BN, WL), eh0, eh1, el0, el1, th0, th1, tl0, tl1)
    return gl.reshape(gl.join(wa, wb), [BN, 2, 2, 2, 2, 2, 2, 2])  # [row, c1, c0, q1, q0, j, T, h]


@gluon.jit
def _decode(c0, c1, c2, s4a, s4b, run, q, cc, esc_ptr, NESCW, th0, th1, tl0, tl1, HA0, HA1, HB0, HB1, LA0, LA1,
            LB0, LB1, BN: gl.constexpr, WL: gl.constexpr, AL: gl.constexpr):
    # a step's A operand and run ([BN, 4]: each row's first escape's index at the step's first column) moved past
    # the step's escapes, its escape window loaded in the step
    tot = _flags(c0, c1, c2)[8]
    rank, run = _ranks(tot, run, cc)
    w0, w1 = _window_words(rank, tot, esc_ptr, NESCW)
    a = _lanes(c0, c1, c2, s4a, s4b, q, w0, w1, rank, th0, th1, tl0, tl1, HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1,
               BN, WL, AL)
    return a, run


@gluon.jit
def _block_start(ebase_ptr, eoff_ptr, nb):
    # the digit-stream index of the first escape of block nb (row * blocks a row + block), as decode_v2.block_start
    return gl.load(ebase_ptr + nb // 16) + gl.load(eoff_ptr + nb).to(gl.int32)


@gluon.jit
def _step_window(c0, c1, c2, run, cc, esc_ptr, NESCW):
    # a step's escape ranks from its code words (run: the rows' index before the step; the block offsets' at a block's
    # first step) and its window words: (rank, run past the step, w0, w1)
    tot = _flags(c0, c1, c2)[8]
    rank, run = _ranks(tot, run, cc)
    w0, w1 = _window_words(rank, tot, esc_ptr, NESCW)
    return rank, run, w0, w1


@gluon.jit
def _tile(pid_n, N, KP, TH0, TH1, TL0, TL1, BN: gl.constexpr, WL: gl.constexpr, RL: gl.constexpr):
    # a program's offsets of its runs' code words (c_off, [BN, 4]) and lane words' sm words (s_off, [BN, 16]), its
    # rows and runs in the run layout (nr, cc), each lane word's q and the code tables as [BN, 16] words (rows past N
    # read row N - 1 again)
    col = gl.arange(0, 16, layout=gl.SliceLayout(0, WL))[None, :]  # lane word 4 c + q
    n = gl.minimum(pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, WL)), N - 1)[:, None]
    cr = gl.arange(0, 4, layout=gl.SliceLayout(0, RL))[None, :]  # run c
    nr = gl.minimum(pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, RL)), N - 1)[:, None]
    z = gl.zeros([BN, 16], gl.uint32, WL)
    cc = cr + gl.zeros([BN, 4], gl.int32, RL)
    q = (col % 4).to(gl.uint32) + z
    return nr * (3 * (KP // 32)) + cr, n * (KP // 4) + col, nr, cc, q, z + TH0, z + TH1, z + TL0, z + TL1


@gluon.jit
def _finish(acc, x_ptr, rowptr_ptr, eidx_ptr, vals_ptr, part_ptr, out_ptr, bias_ptr, cnt_ptr, stride_xm, m0, M, N,
            KP, BT: gl.constexpr, ML: gl.constexpr, OL: gl.constexpr, OUT: gl.constexpr, HAS_BIAS: gl.constexpr,
            EXC: gl.constexpr, CS: gl.constexpr):
    # the tile's exceptions by the accumulator's own threads (rounds shared among its split programs), then its
    # partials or output (fixed12.wgmma.wg_store)
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    if EXC:
        acc = wg_row_exceptions(acc, x_ptr, 1, stride_xm, m0, M, KP, rowptr_ptr, eidx_ptr, vals_ptr, rowptr_ptr,
                                pid_n * BN, N, pid_k, gl.num_programs(1), BN, BT, ML, False, 1)
    acc = gl.convert_layout(acc, OL)
    r = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, OL))[:, None]
    m = m0 + gl.arange(0, BT, layout=gl.SliceLayout(0, OL))[None, :]
    wg_store(acc, part_ptr, out_ptr, bias_ptr, cnt_ptr, r, m, M, N, pid_n, pid_k, gl.program_id(2), OUT, HAS_BIAS, CS)


@gluon.jit
def _x_store(xs, xr, BT: gl.constexpr):
    # the x tile into shared memory in slot order: column bits (c1 c0 h q1 q0 T j) become (h q1 q0 T c1 c0 j)
    xr = gl.reshape(xr, [BT, 2, 2, 2, 2, 2, 2, 2])
    xs.store(gl.reshape(gl.permute(xr, X_ORDER.value), [BT, BK]))


@gluon.jit
def _mma(acc, a, ap, xs, xv, BT: gl.constexpr, PIPE: gl.constexpr):
    # x into shared memory and the step's MMA; PIPE: left in flight beside the next step's decode (ap: the A
    # operand of the one in flight, kept until it is done)
    if PIPE:  # the step before's MMA ran beside this decode: done (its A registers kept until now), x free
        acc, ap = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ap))
        gl.thread_barrier()
    _x_store(xs, xv, BT)
    fence_async_shared()
    gl.thread_barrier()
    acc = warpgroup_mma(a, xs.permute((1, 0)), acc, is_async=True)
    if PIPE:  # left in flight (the wait for none but the last one only hands back the accumulator)
        acc, ap = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a))
    else:
        acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))
        gl.thread_barrier()  # every warp's MMA has read x before the next step's stores
    return acc, ap


def run_layout(warps: int = 4):
    """The [64, 4] runs of a step in fixed12's word layout less its 4 words a run (``layouts``' words): lane (g, c)
    holds run c of rows g and g + 8 of its warp's 16."""
    return gl.DistributedLinearLayout(reg_bases=[[8, 0]], lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[16 << i, 0] for i in range(warps.bit_length() - 1)],
                                      block_bases=[], shape=[16 * warps, 4])
