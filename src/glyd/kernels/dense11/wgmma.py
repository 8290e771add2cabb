"""dense11 format version 3's product on Hopper's warpgroup MMA (``dense11_wgmma``): the decoded words as wgmma's
register A operand, x as its B operand from shared memory, for 2-64 x rows a program (issue 35, M = 17-64; 128 or
256 with the ring's ``xperm``, for prompts).

The decode is ``decode_v2.decode_words``' on fixed12's word layout (``fixed12.wgmma.layouts``): lane (g, c) of a
warp holds run c (32 columns) of rows g and g + 8 of a 128-column step, 4 lane words a row (word q: columns
16 h + 4 q .. + 3 of the run's half h), so a thread's 4 weights of a lane word are wgmma's k pairs (2c, 2c + 1) and
(2c + 8, 2c + 9) of the 16-wide k chunk (h, q): slot k = 64 h + 16 q + 8 T + 2 c + j holds column
32 c + 16 h + 4 q + 2 T + j. The decoded pairs reach the MMA without leaving the registers; x is stored into shared
memory in the same slot order (``X_ORDER``) through registers. The escapes' ranks need the row's runs before a
lane's own: two shuffles within the 4 lanes of a row (``shfl_up4``), the row's total from its last lane
(``shfl_last4``), carried from step to step inside a 1024-column block and reset from the block offsets at each
block's start (K splits are whole blocks). Exceptions (digit 15, ranks 8 and up: exponent 0) are added after the
K loop by the accumulator's own threads (``fixed12.wgmma.wg_row_exceptions`` with dense11's placeholder), their
rounds shared among a tile's split programs.

Probe and first timings: ``benchmarks/probes/dense11_wgmma.py`` (an H100, 2026-12-07, escape-free weights, 14336 x
4096: 1.06x / 1.08x / 1.13x bf16 at M = 16 / 32 / 64 with the words prefetched, against the table's dense11 at
1.34x / 1.81x / 2.32x). CUDA only, Hopper only (Gluon has no interpreter): tests compile it for sm_90 on any
machine and run it against float64 on the GPU.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma_wait

from glyd.codec import dense11 as _codec
from glyd.kernels import _common as C
from glyd.kernels import _plan
from glyd.kernels._fields import flags, ints
from glyd.kernels.dense11.decode_v2 import prepare
from glyd.kernels.dense11.wgmma_decode import (BK, BLOCK, BN, _block_start, _codes, _decode, _finish, _lanes, _loads,
                                               _mma, _rest, _step_window, _tile, run_layout)
from glyd.kernels.dense11.wgmma_ring import _d11_wg_ring_kernel, pair_layout, permute_x
from glyd.kernels.fixed12.wgmma import layouts
from glyd.kernels.registry import Kernel


@dataclasses.dataclass(frozen=True)
class Dense11WgConfig(C.KernelConfig):
    """``bm`` x rows a program at most (wgmma's N: the smallest of 16, 32, 64 that holds M, capped by ``bm``; more
    rows: more programs), 64 weight rows a program (one warpgroup: ``warps`` 4), K steps of 128 in splits of whole
    1024-column blocks (``split`` 0: about ``waves`` programs an SM). ``prefetch``: a step's words and x tile loaded
    while the step before decodes. ``pipe``: a step's MMA runs beside the next step's decode (its A registers kept
    until then; one x buffer, stored once the MMA before has read it). ``ahead`` (with ``prefetch``): a step's escape
    windows loaded while the step before decodes (its code words two steps ahead), not inside its own decode.
    ``after_mma`` (with ``prefetch``, not ``ahead``): a step's escape windows loaded right after the step before's
    MMA is issued (its code words one step ahead, as ``prefetch``'s: fewer registers than ``ahead``).
    ``fixup``: the splits summed by each tile's last split program (no finalize kernel). ``maxnreg``: a register cap
    (0: none). ``wave_split`` (with ``split`` 0): the K split that finishes first when ``waves`` programs an SM run at
    once (``wave_split``), not the smallest that gives ``waves`` programs an SM. ``stages`` (0: registers): a ring of
    that many shared-memory stages, each step's words and x copied by cp.async ``stages`` steps ahead and its
    escape windows loaded after the step before's MMA (``wgmma_ring``; in place of ``prefetch``, ``ahead`` and
    ``after_mma``; with ``pipe``, 3 stages or more, the copies ``stages - 1`` steps ahead). ``xperm`` (with
    ``stages``): x permuted into the MMA's slot order once a call (one gather of x), so the ring copies it 16 bytes at
    a time; only with it ``bm`` may be 128 or 256 (each weight decoded once for that many x rows: prompts).

    >>> Dense11WgConfig(bm=32).prefetch
    True
    >>> Dense11WgConfig(bm=128, stages=3, xperm=True).bm
    128
    """

    bm: int = 64
    prefetch: bool = True
    pipe: bool = False
    ahead: bool = False
    after_mma: bool = False
    fixup: bool = False
    maxnreg: int = 0
    wave_split: bool = False
    stages: int = 0
    xperm: bool = False

    def validate(self) -> None:
        flags(self, "prefetch", "pipe", "ahead", "after_mma", "fixup", "wave_split", "xperm")
        if (self.ahead or self.after_mma) and not self.prefetch:
            raise ValueError("Dense11WgConfig.ahead and after_mma load a step's escape windows a step ahead: they need "
                             "prefetch=True")
        if self.ahead and self.after_mma:
            raise ValueError("Dense11WgConfig: ahead or after_mma, not both (two places for the same loads)")
        ints(self, 0, 255, "maxnreg")
        ints(self, 0, 8, "stages")
        if self.stages == 1 or (self.stages and (self.ahead or self.after_mma)) or (self.stages == 2 and self.pipe):
            raise ValueError(f"Dense11WgConfig.stages must be 0 (registers) or 2-8 (3-8 with pipe) without ahead and "
                             f"after_mma (the ring places its own loads), got stages={self.stages}")
        if self.xperm and not self.stages:
            raise ValueError("Dense11WgConfig.xperm puts x in slot order for the ring's copies: it needs stages >= 2")
        if self.bm not in (16, 32, 64, 128, 256) or self.warps != 4:
            raise ValueError(f"Dense11WgConfig: bm 16, 32, 64, 128 or 256 and 4 warps (one warpgroup), got "
                             f"bm={self.bm}, warps={self.warps}")
        if self.bm > 64 and not self.xperm:
            raise ValueError(f"Dense11WgConfig: bm {self.bm} needs xperm=True (and stages): x in registers or in "
                             "4-byte copies at more than 64 rows costs more than its decode")
        if self.maxnreg and not 32 <= self.maxnreg <= 255:
            raise ValueError(f"Dense11WgConfig.maxnreg must be 32-255 (0: none), got {self.maxnreg}")


@gluon.jit(do_not_specialize=["NESCW", "TH0", "TH1", "TL0", "TL1", "HA0", "HA1", "HB0", "HB1", "LA0", "LA1", "LB0",
                              "LB1"])
def _d11_wg_kernel(x_ptr, code_ptr, sm_ptr, esc_ptr, ebase_ptr, eoff_ptr, rowptr_ptr, eidx_ptr, vals_ptr, part_ptr,
                   out_ptr, bias_ptr, cnt_ptr, M, N, KP, NBR, NESCW, K_SPLIT, stride_xm, TH0, TH1, TL0, TL1, HA0, HA1,
                   HB0, HB1, LA0, LA1, LB0, LB1, BT: gl.constexpr, WL: gl.constexpr, RL: gl.constexpr, XL: gl.constexpr,
                   ML: gl.constexpr, AL: gl.constexpr, XSL: gl.constexpr, OL: gl.constexpr, OUT: gl.constexpr,
                   HAS_BIAS: gl.constexpr, EXC: gl.constexpr, PF: gl.constexpr, PIPE: gl.constexpr = False,
                   CS: gl.constexpr = 1, EA: gl.constexpr = 0):
    # part[pid_k, BT x rows, BN weight rows] (fp32, OUT 0) or out (bf16 + bias, OUT 1: one split; OUT 2: the tile's
    # last split program sums the others' partials) = x rows @ W^T over this program's blocks; acc is [BN weight
    # rows, BT x rows]. KP a multiple of 128 (no padded columns); rows past M or N read row M - 1 / N - 1 again. EA 1:
    # a step's escape windows loaded while the step before decodes (its codes two steps ahead); 2: right after the
    # step before's MMA (its codes one step ahead)
    pid_k = gl.program_id(1)
    c_off, s_off, nr, cc, q, th0, th1, tl0, tl1 = _tile(gl.program_id(0), N, KP, TH0, TH1, TL0, TL1, BN, WL, RL)
    runs = KP // 32
    zr = cc * 0
    m0 = gl.program_id(2) * BT
    t = gl.minimum(m0 + gl.arange(0, BT, layout=gl.SliceLayout(1, XL)), M - 1)
    xoff = t[:, None] * stride_xm + gl.arange(0, BK, layout=gl.SliceLayout(0, XL))[None, :]
    xs = gl.allocate_shared_memory(gl.bfloat16, [BT, BK], XSL)
    acc = gl.zeros([BN, BT], gl.float32, ML)
    s0 = (pid_k * K_SPLIT) // BK
    s1 = gl.minimum(pid_k * K_SPLIT + K_SPLIT, KP) // BK
    c0, c1, c2, s4a, s4b, xv = _loads(code_ptr, sm_ptr, x_ptr, c_off, s_off, xoff, s0, runs)
    run = _block_start(ebase_ptr, eoff_ptr, nr * NBR + s0 // 8) + zr  # s0 starts a block
    if EA:  # step s0's window words, and the next step's codes
        rank, run, w0, w1 = _step_window(c0, c1, c2, run, cc, esc_ptr, NESCW)
        if EA == 1:
            d0, d1, d2 = _codes(code_ptr, c_off, gl.minimum(s0 + 1, s1 - 1), runs)
    ap = gl.zeros([BN, BK], gl.bfloat16, AL)  # the A operand of the MMA in flight (PIPE)
    for st in range(s0, s1):
        nx = gl.minimum(st + 1, s1 - 1)  # the next step (the last step reloads its own)
        if EA == 2:  # the next step's words in flight; this step's window was loaded after the last step's MMA
            nc0, nc1, nc2, ns4a, ns4b, nxv = _loads(code_ptr, sm_ptr, x_ptr, c_off, s_off, xoff, nx, runs)
        elif EA:  # codes two steps ahead; the next step's ranks and window words from its codes (loaded a step ago)
            e0, e1, e2 = _codes(code_ptr, c_off, gl.minimum(st + 2, s1 - 1), runs)
            ns4a, ns4b, nxv = _rest(sm_ptr, x_ptr, s_off, xoff, nx, runs)
            if nx % 8 == 0:
                run = _block_start(ebase_ptr, eoff_ptr, nr * NBR + nx // 8) + zr
            nrank, run, nw0, nw1 = _step_window(d0, d1, d2, run, cc, esc_ptr, NESCW)
        if EA:
            a = _lanes(c0, c1, c2, s4a, s4b, q, w0, w1, rank, th0, th1, tl0, tl1, HA0, HA1, HB0, HB1, LA0, LA1, LB0,
                       LB1, BN, WL, AL)
        else:
            if PF:  # the next step's words and x in flight while this one decodes
                nc0, nc1, nc2, ns4a, ns4b, nxv = _loads(code_ptr, sm_ptr, x_ptr, c_off, s_off, xoff, nx, runs)
            else:
                c0, c1, c2, s4a, s4b, xv = _loads(code_ptr, sm_ptr, x_ptr, c_off, s_off, xoff, st, runs)
            if st % 8 == 0 and st != s0:  # a block's first step: its rows' ranks from the block offsets
                run = _block_start(ebase_ptr, eoff_ptr, nr * NBR + st // 8) + zr
            a, run = _decode(c0, c1, c2, s4a, s4b, run, q, cc, esc_ptr, NESCW, th0, th1, tl0, tl1, HA0, HA1, HB0,
                             HB1, LA0, LA1, LB0, LB1, BN, WL, AL)
        acc, ap = _mma(acc, a, ap, xs, xv, BT, PIPE)
        if EA == 2:  # the next step's ranks and window words once its codes had this step's decode to arrive
            if nx % 8 == 0:
                run = _block_start(ebase_ptr, eoff_ptr, nr * NBR + nx // 8) + zr
            rank, run, w0, w1 = _step_window(nc0, nc1, nc2, run, cc, esc_ptr, NESCW)
            c0, c1, c2, s4a, s4b, xv = nc0, nc1, nc2, ns4a, ns4b, nxv
        elif EA:
            c0, c1, c2, d0, d1, d2, s4a, s4b, xv = d0, d1, d2, e0, e1, e2, ns4a, ns4b, nxv
            w0, w1, rank = nw0, nw1, nrank
        elif PF:
            c0, c1, c2, s4a, s4b, xv = nc0, nc1, nc2, ns4a, ns4b, nxv
    if PIPE:
        acc, ap = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ap))
    _finish(acc, x_ptr, rowptr_ptr, eidx_ptr, vals_ptr, part_ptr, out_ptr, bias_ptr, cnt_ptr, stride_xm, m0, M, N, KP,
            BT, ML, OL, OUT, HAS_BIAS, EXC, CS)


def wave_split(tiles: int, k: int, slots: int) -> int:
    """K splits (of whole ``BLOCK``-column blocks) for ``tiles`` output tiles when ``slots`` programs run at once: the
    count whose ceil(tiles * splits / slots) waves of ceil(blocks / splits) blocks each take the fewest blocks, the
    fewest splits among equals (a split costs its partial sums). gate_up of a 7B (592 tiles, K 3584: 3.5 blocks) on 132
    SMs at 3 programs each: 2 splits (3 waves of 2 blocks, against 2 waves of 4 unsplit).

    >>> wave_split(592, 3584, 396), wave_split(72, 3584, 396), wave_split(56, 18944, 396), wave_split(2376, 3584, 396)
    (2, 4, 7, 1)
    """
    if tiles < 1 or k < 1 or slots < 1:
        raise ValueError(f"wave_split needs tiles, K and slots >= 1, got {tiles}, {k}, {slots}")
    nb = -(-k // BLOCK)
    best = (None, 1)
    for s in range(1, nb + 1):
        per = -(-nb // s)
        if -(-nb // per) != s:  # the same blocks a split as a smaller count
            continue
        cost = -(-tiles * s // slots) * per
        if best[0] is None or cost < best[0]:
            best = (cost, s)
    return best[1]


def x_rows(m: int, bm: int) -> int:
    """x rows a program (wgmma's N): the smallest of 16, 32, 64, 128, 256 that holds ``m``, at most ``bm``.

    >>> x_rows(2, 64), x_rows(17, 64), x_rows(40, 32), x_rows(100, 64), x_rows(100, 256)
    (16, 32, 32, 64, 128)
    """
    return min(max(16, triton.next_power_of_2(m)), bm)


# x: bf16 [M, K]; packed: dense11 version 3 [N, K], K a multiple of 128 -> run(x2, bias, out, arrays) (Kernel.plan)
def plan(x2: torch.Tensor, p, bias, cfg: Dense11WgConfig):
    m, k = x2.shape
    n = p.shape[0]
    if x2.device.type != "cuda" or C.interpreting():
        raise RuntimeError("the dense11_wgmma kernel runs only on a CUDA GPU (Gluon has no interpreter)")
    if p.version != 3:
        raise ValueError(f"dense11_wgmma decodes dense11 format version 3, got version {p.version}")
    if k % BK.value or p.arrays["sm"].shape[1] != k:
        raise ValueError(f"the dense11_wgmma kernel needs K a multiple of {BK.value} (no padded columns), got K = {k}")
    if x2.dtype != torch.bfloat16:
        raise ValueError(f"x must be bf16, got {x2.dtype}")
    prep = prepare(p)
    copy = x2.stride(1) != 1 or x2.stride(0) % 8 or x2.data_ptr() % 16  # x is read in 16-byte pieces
    stride = k if copy else x2.stride(0)
    bt = x_rows(m, cfg.bm)
    tiles = triton.cdiv(n, BN.value) * triton.cdiv(m, bt)
    if cfg.wave_split and not cfg.split:
        split, per = C.choose_split(tiles, k, BLOCK, x2.device, wave_split(tiles, k, cfg.waves * C.sm_count(x2.device)))
    else:
        split, per = C.choose_split(tiles, k, BLOCK, x2.device, cfg.split, cfg.waves)
    out_mode = 1 if split == 1 else 2 if cfg.fixup else 0
    x, xp, b, part, o = _plan.slots(5)
    arr = dict(zip(_codec.ARRAYS, _plan.slots(len(_codec.ARRAYS), 5, fixed=True)))
    part = o if out_mode == 1 else part
    cnt = C.counters(x2.device, tiles) if out_mode == 2 else None
    words, xl, mma, a_op, xsl, ol = layouts(BN.value, bt, 4)
    exc = prep.nexc > 0
    if cfg.stages:  # the ring: x copied as int32 pairs (stride even: 16-byte aligned rows) or, xperm, in slot order
        kern, xargs, opts = _d11_wg_ring_kernel, (x, xp), dict(XL=xl if cfg.xperm else pair_layout(bt), S=cfg.stages,
                                                               PIPE=cfg.pipe, LEAD=cfg.stages - cfg.pipe, XP=cfg.xperm)
    else:
        ea = 2 if cfg.after_mma else int(cfg.ahead)
        kern, xargs, opts = _d11_wg_kernel, (x,), dict(XL=xl, PF=cfg.prefetch, PIPE=cfg.pipe, EA=ea)
    tile = _plan.Launch(kern, (triton.cdiv(n, BN.value), split, triton.cdiv(m, bt)), (
        *xargs, arr["code"], arr["sm"].view(torch.int32), arr["esc"], arr["esc_base"], arr["esc_off"], prep.rowptr,
        prep.pos if exc else prep.rowptr, prep.vals if exc else prep.rowptr, part, o, b, cnt, m, n, k,
        _codec.blocks_per_row(k), prep.nescw, per, stride, *prep.lut, *prep.tab), dict(
        BT=bt, WL=words, RL=run_layout(4), ML=mma, AL=a_op, XSL=xsl, OL=ol, OUT=out_mode, HAS_BIAS=bias is not None,
        EXC=exc, CS=C.COUNTER_SLOTS, num_warps=4, **opts, **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {})))
    fin = C.finalize_launch(split, m, n, bias is not None, x2.device, cfg.pdl) if out_mode == 0 else None
    shape, dev, xperm = (split, m, n), x2.device, cfg.xperm

    def run(x2, bias, out, arrays):
        if copy:
            x2 = x2.contiguous()
        pt = torch.empty(shape, dtype=torch.float32, device=dev) if out_mode != 1 else out
        tile(x2, permute_x(x2) if xperm else x2, bias if bias is not None else out, pt, out, *arrays)
        if fin is not None:
            fin(pt, bias if bias is not None else pt, out)
        return out

    return run


class Dense11WgKernel(Kernel):
    """dense11 version 3's wgmma tile: a Hopper GPU (sm_90) with Gluon's Hopper MMA, K (no padded columns) a
    multiple of 128."""

    name = "dense11_wgmma"
    layout = "dense11"
    Config = Dense11WgConfig

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if not ok:
            return ok, why
        if "wgmma" not in device.features:
            return False, "needs Gluon's warpgroup MMA on a Hopper GPU (sm_90)"
        if problem.version != 3:
            return False, (f"{cls.name} decodes dense11 format version 3; this matrix is version {problem.version} "
                           "(re-save it with this glyd to get version 3)")
        if problem.k != problem.kp or problem.k % BK.value:
            return False, f"needs K a multiple of {BK.value} (no padded columns), got K = {problem.k}"
        return True, ""

    # x: bf16 [M, K]; packed: dense11 version 3 [N, K]; bias: [N] or None; out: bf16 [M, N] (written) -> out
    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        C.check_launch_shapes(cls.name, x2, tuple(packed.shape), out, bias)
        return plan(x2, packed, bias, config)(x2, bias, out, tuple(packed.arrays[a] for a in _codec.ARRAYS))

    @classmethod
    def plan(cls, x2, packed, bias, config):
        return plan(x2, packed, bias, config)
