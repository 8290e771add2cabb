"""The M = 2-64 product of ``dense11_v2_gemv`` / ``dense11_v3_gemv`` with ``dot="mma"``: the decoded lane
words multiplied where they are, as the A operand of ``mma.sync.m16n8k16`` (bf16, fp32 accumulate), with no
trip through shared memory (``dot="tile"``'s ``tl.dot`` stores the decoded tile to shared memory and reads
it back in the MMA's layout: 24-48 LDS, 6-12 STS and about 46 register moves a step).

A step is bk 128: W = 4 runs of 32 columns a row. A program's bn = 16 x warps rows are two half tiles of
[bn / 2, 4] runs, a (rows 16 w + g of warp w) and b (rows 16 w + 8 + g), each decoded as ``decode_words``
does: a thread decodes run c of rows g and g + 8 (lane 4 g + c). The MMA's A fragment gives lane (g, c) the
k pairs (2c, 2c+1) and (2c+8, 2c+9) of rows g and g + 8; its 16 k are mapped to columns so that lane c's
k are 4 consecutive columns of its own run: k-slice (h, q) (half h, lane word q) has k 2c + i <-> column
32 c + 16 h + 4 q + i and k 2c + 8 + i <-> column 32 c + 16 h + 4 q + 2 + i. A lane word gives its A
registers with two ``prmt`` (bf16 pairs); x, read with the same map as int32 bf16 pairs, is the B operand
(column g = x row 8 t + g of x tile t: 2 consecutive words as loaded). 8 MMAs a step an x tile of 8 rows;
the product is the tile's (the fp32 sums in the MMA's order: within rounding of ``tl.dot``'s, as any two
dot orders; M = 1 keeps the FMA path and its bits).

The lane map is an assumption on Triton's layout of a [bn / 2, 4] tensor loaded along its rows (the code
words): rows over 8 lanes and the warps, the 4 runs over 4 lanes (``#blocked<sizePerThread = [1, 1],
threadsPerWarp = [8, 4], warpsPerCTA = [warps, 1], order = [1, 0]>``); ``tests/kernels/test_dense11_mma.py``
checks the compiled kernel's MMA operands have it (for version 3's loads, whole and ragged tiles, with and without
16-divisible K and x stride). Version 2's loads (code words at stride 3) do not hold it: Triton 3.6 gives them
``threadsPerWarp = [32, 1], warpsPerCTA = [1, warps]`` where K and x's row stride are not multiples of 16 (garbage
products on the H100 at K 1100), so ``gemv_v2`` launches this kernel for version 3 only. The interpreter's twin (``_mma``, ``HW=False``) computes
each warp's 16 x 8 product from the fragments with that map (PTX ISA's m16n8k16 fragments), so the CPU tests
check the k map, the fragments and the result's order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glyd.codec import dense11 as _codec
from glyd.kernels._interp import isolated
from glyd.kernels.dense11.decode_v2 import block_start, decode_words, hw, load_words
from glyd.kernels.dense11.exceptions_v2 import BLOCK_C
from glyd.kernels.dense11.exceptions_v2 import exceptions as _exceptions


@triton.jit
def _pairs16(v, BN: tl.constexpr, W: tl.constexpr):
    # lanes q = 0..3 of a [BN, W, 4] tensor as 4 [BN, W] tensors (the lane words are a thread's own)
    e, o = tl.split(tl.reshape(v, [BN, W, 2, 2]))
    q0, q2 = tl.split(e)
    q1, q3 = tl.split(o)
    return q0, q1, q2, q3


@triton.jit
def _by2(q):
    # (q0, q1, q2, q3) -> ((q0, q1), (q2, q3)): indexable by static_range variables
    return (q[0], q[1]), (q[2], q[3])


@triton.jit
def _frag(w, BN: tl.constexpr, W: tl.constexpr):
    # [BN, W] b32 pairs (lane (g, c): k 2c, 2c + 1 low half first) -> [BN // 8, 8, 8]: warp, g, k 0-7
    lo = (w & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True).to(tl.float32)
    hi = (w >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True).to(tl.float32)
    return tl.reshape(tl.join(lo, hi), [BN // 8, 8, 2 * W])


@triton.jit
def _rows16(r0, r1, BN: tl.constexpr, W: tl.constexpr):
    # fragments of k 0-7 (r0) and 8-15 (r1) -> [BN // 8, 8, 16]: warp, g, k
    return tl.reshape(tl.permute(tl.join(_frag(r0, BN, W), _frag(r1, BN, W)), (0, 1, 3, 2)), [BN // 8, 8, 16])


@triton.jit
def _mma(a0, a1, a2, a3, b0, b1, d0, d1, d2, d3, BN: tl.constexpr, W: tl.constexpr, HW: tl.constexpr):
    # (d0, d1, d2, d3) += A (16 x 16) @ B (16 x 8) of each warp, mma.sync.m16n8k16 bf16 -> fp32, fragments
    # [BN, W] with lane (g, c) = element (8 warp + g, c); the twin computes the same product in fp32 sums
    if HW:
        r = tl.inline_asm_elementwise(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, "
            "{$10, $11, $12, $13};", "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3",
            [a0, a1, a2, a3, b0, b1, d0, d1, d2, d3], dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True, pack=1)
    else:
        a = tl.reshape(tl.permute(tl.join(_rows16(a0, a2, BN, W), _rows16(a1, a3, BN, W)), (0, 3, 1, 2)),
                       [BN // 8, 16, 16])  # warp, m = 8 s + g, k
        b = _rows16(b0, b1, BN, W)  # warp, n, k
        p = tl.sum(a[:, :, None, :] * b[:, None, :, :], axis=3)  # warp, m, n
        p = tl.reshape(p, [BN // 8, 2, 8, W, 2])  # warp, s, g, c, j: d(s, j) of lane (g, c) is D[8 s + g][2 c + j]
        p = tl.reshape(tl.permute(p, (0, 2, 3, 1, 4)), [BN, W, 2, 2])
        e, o = tl.split(p)  # j = 0, 1: [BN, W, 2] along s
        p00, p10 = tl.split(e)
        p01, p11 = tl.split(o)
        r = (d0 + p00, d1 + p01, d2 + p10, d3 + p11)
    return r


@triton.jit
def _bpair(lo, hi, T: tl.constexpr, HW: tl.constexpr):
    # the bf16 pair of a lane word's weights 2T and 2T + 1 (low half first): bytes lo[2T], hi[2T], lo[2T+1], hi[2T+1]
    if HW:
        r = tl.inline_asm_elementwise(f"prmt.b32 $0, $1, $2, {0x5140 + 0x2222 * T};", "=r,r,r", [lo, hi],
                                      dtype=tl.uint32, is_pure=True, pack=1)
    else:
        s = 16 * T
        r = ((lo >> s) & 0xFF) | (((hi >> s) & 0xFF) << 8) | (((lo >> (s + 8)) & 0xFF) << 16) | \
            (((hi >> (s + 8)) & 0xFF) << 24)
    return r


@triton.jit
def _x_quarter(x32_ptr, rx, stride_xm, kb, K, OFF: tl.constexpr, BH: tl.constexpr, W: tl.constexpr,
               FULL: tl.constexpr):
    # x row rx [BH, 1], words OFF .. OFF + 3 (8 columns) of each element's own run as 4 [BH, W] tensors. Loaded
    # as [BH, 4 W], 4 contiguous words a run: the compiler gives it the code words' layout (lanes along W)
    v = tl.arange(0, 4 * W)[None, :]
    c = kb // 2 + 16 * (v // 4) + OFF + (v % 4)
    p = x32_ptr + rx * (stride_xm // 2) + c
    if FULL:
        w = tl.load(p)
    else:
        w = tl.load(p, mask=(2 * c < K) & (rx >= 0), other=0)  # K even here (x read as pairs)
    return _pairs16(tl.reshape(w.to(tl.uint32, bitcast=True), [BH, W, 4]), BH, W)


@triton.jit
def _mma_half(acc, hia, loa, hib, lob, x32_ptr, rxs, stride_xm, kb, K, HALF: tl.constexpr, BH: tl.constexpr,
              W: tl.constexpr, NT: tl.constexpr, HW: tl.constexpr, FULL: tl.constexpr):
    # 4 k-slices (lane words q) of a half, each an MMA a tile of 8 x rows: A = the weights of rows g (tile a) and
    # g + 8 (tile b) as bf16 pairs, B = x row 8 t + g's words at the same columns (2 consecutive words: b0, b1).
    # rxs[t]: tile t's x rows [BH, 1], each clamped to M - 1 (never an address past x)
    a0 = _by2(_pairs16(_bpair(loa, hia, 0, HW), BH, W))
    a1 = _by2(_pairs16(_bpair(lob, hib, 0, HW), BH, W))
    a2 = _by2(_pairs16(_bpair(loa, hia, 1, HW), BH, W))
    a3 = _by2(_pairs16(_bpair(lob, hib, 1, HW), BH, W))
    for e in tl.static_range(2):  # lane words 2e, 2e + 1: x words 8 HALF + 4 e .. + 3 (a word is 2 columns)
        r = ()
        for t in tl.static_range(NT):
            d0, d1, d2, d3 = acc[t]
            x0, x1, x2, x3 = _x_quarter(x32_ptr, rxs[t], stride_xm, kb, K, 8 * HALF + 4 * e, BH, W, FULL)
            for u in tl.static_range(2):
                d0, d1, d2, d3 = _mma(a0[e][u], a1[e][u], a2[e][u], a3[e][u], (x0, x2)[u], (x1, x3)[u], d0, d1, d2,
                                      d3, BH, W, HW)
            r = r + ((d0, d1, d2, d3),)
        acc = r
    return acc


@triton.jit
def _tile8(d, BH: tl.constexpr, W: tl.constexpr):
    # an x tile's fragments as [8, 2 BH]: d(s, j) of element (8 warp + g, c) is x row 2 c + j of the tile,
    # weight row 16 warp + 8 s + g of the program
    d0, d1, d2, d3 = d
    u = tl.join(tl.join(d0, d2), tl.join(d1, d3))  # [BH, W, 2 (s), 2 (j)]
    u = tl.permute(tl.reshape(u, [BH // 8, 8, W, 2, 2]), (2, 4, 0, 3, 1))  # c, j, warp, s, g
    return tl.reshape(u, [8, 2 * BH])


@triton.jit
def _tiles(acc, BH: tl.constexpr, W: tl.constexpr, NT: tl.constexpr):
    # the NT x tiles' fragments as acc [8 NT, 2 BH] (x rows, weight rows of the program)
    if NT == 1:
        r = _tile8(acc[0], BH, W)
    elif NT == 2:
        r = tl.reshape(tl.permute(tl.join(_tile8(acc[0], BH, W), _tile8(acc[1], BH, W)), (2, 0, 1)), [16, 2 * BH])
    else:
        r = ()
        for t in tl.static_range(NT // 2):
            r = r + (tl.permute(tl.join(_tile8(acc[2 * t], BH, W), _tile8(acc[2 * t + 1], BH, W)), (2, 0, 1)),)
        if NT == 4:
            r = tl.permute(tl.join(r[0], r[1]), (3, 0, 1, 2))
        else:
            # [u, g, row, v, w]: x tile 4 v + 2 w + u
            r = tl.permute(tl.join(tl.join(r[0], r[2]), tl.join(r[1], r[3])), (3, 4, 0, 1, 2))
        r = tl.reshape(r, [8 * NT, 2 * BH])
    return r


@triton.jit
def _zeros(BH: tl.constexpr, W: tl.constexpr, NT: tl.constexpr):
    # the NT x tiles' MMA accumulators (d0, d1, d2, d3), each [BH, W] fp32
    acc = ()
    for t in tl.static_range(NT):
        acc = acc + ((tl.zeros([BH, W], dtype=tl.float32), tl.zeros([BH, W], dtype=tl.float32),
                      tl.zeros([BH, W], dtype=tl.float32), tl.zeros([BH, W], dtype=tl.float32)),)
    return acc


@triton.jit
def _x_rows(pid_m, i, M, MB: tl.constexpr, NT: tl.constexpr):
    # x row 8 t + g of the program for MMA tile t ([BH, 1] each), clamped to the last row (rows past M only feed
    # outputs that are not stored: no masked loads, whose zeroing costs a register move each). Each tile's rows are
    # clamped, not tile 0's plus 8 t: that read up to 8 (NT - 1) rows past x's end when M is not a multiple of MB
    # (an illegal address on the GPU at the 7B's down shape, K 18944; the interpreter reads host memory past x)
    rxs = ()
    for t in tl.static_range(NT):
        rxs = rxs + (tl.minimum(pid_m * MB + 8 * t + (i % 8)[:, None], M - 1),)
    return rxs


@triton.jit
def _starts(ebase_ptr, eoff_ptr, ra, rb, ma, mb, NBR, blk):
    # the digit-stream index of block blk's first escape in rows ra (half tile a) and rb (b)
    return (block_start(ebase_ptr, eoff_ptr, ra * NBR + blk, ma), block_start(ebase_ptr, eoff_ptr, rb * NBR + blk, mb))


@triton.jit
def _x_ahead(x_ptr, pid_m, M, K, stride_xm, kc, MB: tl.constexpr, XPF: tl.constexpr, HW: tl.constexpr):
    # XPF > 0: x's lines of the step at column kc (MB rows, 2 of 128 bytes a row) prefetched into L1 (no register
    # held: the HMMAs waited on x's loads from L2, 20% of stall samples); the interpreter has no cache: nothing
    if HW and XPF > 0:
        r = tl.minimum(pid_m * MB + tl.arange(0, MB), M - 1)[:, None]
        c = tl.minimum(kc + 64 * tl.arange(0, 2), K - 1)[None, :]
        tl.inline_asm_elementwise("prefetch.global.L1 [$1];", "=r,l", [x_ptr + r * stride_xm + c], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _words(code_ptr, sm_ptr, ra, rb, ma, mb, kb, KP, BH: tl.constexpr, W: tl.constexpr, FULL: tl.constexpr,
           V3: tl.constexpr):
    # a step's raw words of half tiles a (rows ra) and b (rows rb)
    return (load_words(code_ptr, sm_ptr, ra, ma, kb, KP, BH, W, FULL, V3),
            load_words(code_ptr, sm_ptr, rb, mb, kb, KP, BH, W, FULL, V3))


@triton.jit
def _decode2(wa, wb, run_a, run_b, esc_ptr, NESCW, tab, lut, HW: tl.constexpr, BH: tl.constexpr, W: tl.constexpr,
             V3: tl.constexpr):
    # the lane words of half tiles a and b (decode_words) and their runs moved past the step's escapes
    hia, loa, hib, lob, run_a = decode_words(*wa, esc_ptr, NESCW, run_a, tab, lut, HW, BH, W, V3)
    hja, lja, hjb, ljb, run_b = decode_words(*wb, esc_ptr, NESCW, run_b, tab, lut, HW, BH, W, V3)
    return (hia, loa, hib, lob, hja, lja, hjb, ljb), run_a, run_b


@triton.jit
def _mma2(acc, lanes, x32_ptr, rxs, stride_xm, kb, K, BH: tl.constexpr, W: tl.constexpr, NT: tl.constexpr,
          HW: tl.constexpr, FULL: tl.constexpr):
    # the step's products: halves 0 and 1 of both half tiles (lanes: _decode2's)
    hia, loa, hib, lob, hja, lja, hjb, ljb = lanes
    acc = _mma_half(acc, hia, loa, hja, lja, x32_ptr, rxs, stride_xm, kb, K, 0, BH, W, NT, HW, FULL)
    return _mma_half(acc, hib, lob, hjb, ljb, x32_ptr, rxs, stride_xm, kb, K, 1, BH, W, NT, HW, FULL)


@isolated
@triton.jit(do_not_specialize=["NESCW", "TH0", "TH1", "TL0", "TL1", "HA0", "HA1", "HB0", "HB1", "LA0", "LA1", "LB0",
                               "LB1"])
def _gemv_mma_kernel(x_ptr, x32_ptr, sm_ptr, sm8_ptr, code_ptr, esc_ptr, ebase_ptr, eoff_ptr, rowptr_ptr, eidx_ptr,
                     eexp_ptr, bias_ptr, out_ptr, M, N, K, KP, NBR, NESCW, BLOCKS_SPLIT, stride_xm, TH0, TH1, TL0, TL1,
                     HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1, BN: tl.constexpr, MB: tl.constexpr, HW: tl.constexpr,
                     HAS_BIAS: tl.constexpr, HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr, FULL: tl.constexpr = False,
                     PREFETCH: tl.constexpr = 0, V3: tl.constexpr = False, XPF: tl.constexpr = 0):
    # rows [pid_n * BN, +BN) x blocks [pid_k * BLOCKS_SPLIT, +BLOCKS_SPLIT) for x rows [pid_m * MB, +MB), bk 128:
    # two half tiles a (rows 16 warp + g) and b (16 warp + 8 + g) of BN / 2 rows, decoded as version 2's GEMV does.
    # PREFETCH: a step's words loaded 0, 1 or 2 steps before it decodes (True counts as 1). ptxas issues a prefetch
    # late in the step (~85 of its ~530 instructions before the use at 1: the loop's top waits on it); at 2 each
    # of two word sets is reloaded right after its decode, a step and a half ahead. XPF: x's lines XPF steps on
    # prefetched into L1 each step (0: none)
    W: tl.constexpr = 4
    BK: tl.constexpr = 128
    BH: tl.constexpr = BN // 2
    NT: tl.constexpr = MB // 8
    TRIP: tl.constexpr = BK * (1 + PREFETCH // 2)  # PREFETCH 2: two steps a trip, an even and an odd one
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    i = tl.arange(0, BH)
    ra = pid_n * BN + 16 * (i // 8) + i % 8
    rb = ra + 8
    ma = ra < N
    mb = rb < N
    rxs = _x_rows(pid_m, i, M, MB, NT)
    tab = (HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1)
    lut = (TH0, TH1, TL0, TL1)
    acc = _zeros(BH, W, NT)
    k0 = pid_k * BLOCKS_SPLIT * BLOCK_C
    k1 = tl.minimum(k0 + BLOCKS_SPLIT * BLOCK_C, KP)
    last = k0 + ((k1 - k0 - 1) // BK) * BK
    if PREFETCH:
        wa, wb = _words(code_ptr, sm_ptr, ra, rb, ma, mb, k0, KP, BH, W, FULL, V3)
    if PREFETCH == 2:  # the odd steps' words
        va, vb = _words(code_ptr, sm_ptr, ra, rb, ma, mb, tl.minimum(k0 + BK, last), KP, BH, W, FULL, V3)
    run_a, run_b = _starts(ebase_ptr, eoff_ptr, ra, rb, ma, mb, NBR, pid_k * BLOCKS_SPLIT)
    for kb in range(k0, k1, TRIP):
        if kb == (kb // BLOCK_C) * BLOCK_C:  # (constexpr has no __rmod__ under the interpreter)
            run_a, run_b = _starts(ebase_ptr, eoff_ptr, ra, rb, ma, mb, NBR, kb // BLOCK_C)
        _x_ahead(x_ptr, pid_m, M, K, stride_xm, tl.minimum(kb + XPF * BK, last), MB, XPF, HW)
        if PREFETCH == 1:  # the next step's words loaded before this step decodes (as gemv_v2)
            na, nb = _words(code_ptr, sm_ptr, ra, rb, ma, mb, tl.minimum(kb + BK, last), KP, BH, W, FULL, V3)
        elif not PREFETCH:
            wa, wb = _words(code_ptr, sm_ptr, ra, rb, ma, mb, kb, KP, BH, W, FULL, V3)
        lanes, run_a, run_b = _decode2(wa, wb, run_a, run_b, esc_ptr, NESCW, tab, lut, HW, BH, W, V3)
        if PREFETCH == 2:  # reloaded once decoded, for 2 steps on: no register moves at the trip's end
            wa, wb = _words(code_ptr, sm_ptr, ra, rb, ma, mb, tl.minimum(kb + 2 * BK, last), KP, BH, W, FULL, V3)
        acc = _mma2(acc, lanes, x32_ptr, rxs, stride_xm, kb, K, BH, W, NT, HW, FULL)
        if PREFETCH == 2:
            if kb + BK < k1:  # the trip's odd step (never a block's first: 8 steps a block)
                _x_ahead(x_ptr, pid_m, M, K, stride_xm, tl.minimum(kb + (XPF + 1) * BK, last), MB, XPF, HW)
                lanes, run_a, run_b = _decode2(va, vb, run_a, run_b, esc_ptr, NESCW, tab, lut, HW, BH, W, V3)
                va, vb = _words(code_ptr, sm_ptr, ra, rb, ma, mb, tl.minimum(kb + 3 * BK, last), KP, BH, W, FULL, V3)
                acc = _mma2(acc, lanes, x32_ptr, rxs, stride_xm, kb + BK, K, BH, W, NT, HW, FULL)
        elif PREFETCH:
            wa, wb = na, nb
    acc = _tiles(acc, BH, W, NT)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    rm = pid_m * MB + tl.arange(0, MB)
    mmask = rm < M
    if HAS_EXC:  # the tile's exceptions, rounds shared among its split programs
        acc = _exceptions(acc, rn, rm, mmask, pid_n, N, K, KP, x_ptr, stride_xm, sm8_ptr, rowptr_ptr, eidx_ptr,
                          eexp_ptr, pid_k, tl.num_programs(1), BN, MB, V3)
    optr = rm[:, None] * N + rn[None, :]
    omask = mmask[:, None] & nmask[None, :]
    if PARTIAL:
        tl.store(out_ptr + pid_k * M * N + optr, acc, mask=omask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + optr, acc.to(tl.bfloat16), mask=omask)


def mma_rows(m: int, mb: int) -> int:
    """The x rows a program of ``dot="mma"`` multiplies (its MB): the smallest of 8, 16, 32, 64 that holds
    ``m``, at most ``max(mb, 8)`` (an MMA's N is 8 rows); more rows: more programs.

    >>> mma_rows(2, 64), mma_rows(9, 64), mma_rows(40, 32), mma_rows(100, 64)
    (8, 16, 32, 64)
    """
    return min(max(8, triton.next_power_of_2(m)), max(8, mb), 64)


# x2: bf16 [M, K] (x32: its int32 pairs); p: dense11 v2/v3 [N, K]; dst: bf16 [M, N] or fp32 [split, M, N] partials
def launch_mma(x2, x32, p, prep, bias, dst, grid, per, mb, config, v3) -> None:
    """One launch of ``_gemv_mma_kernel`` (the launcher ``gemv_v2.Dense11V2GemvKernel.launch`` checked the
    shapes, chose the grid, the K splits and ``mb``)."""
    m, k = x2.shape
    n = p.shape[0]
    kp = p.arrays["sm"].shape[1]
    a = p.arrays
    _gemv_mma_kernel[grid](
        x2, x32, a["sm"].view(torch.int32), a["sm"], a["code"], a["esc"], a["esc_base"], a["esc_off"], prep.rowptr,
        a["exc_idx"], a["exc_exp"], bias if bias is not None else x2, dst, m, n, k, kp, _codec.blocks_per_row(k),
        prep.nescw, per, x2.stride(0), *prep.lut, *prep.tab, BN=config.bn, MB=mb, HW=hw(), HAS_BIAS=bias is not None,
        HAS_EXC=prep.nexc > 0, PARTIAL=grid[1] > 1, FULL=n % config.bn == 0 and k == kp and kp % 128 == 0,
        PREFETCH=config.prefetch_depth if config.prefetch else 0, V3=v3, XPF=2 * config.x_prefetch, num_warps=config.warps)
