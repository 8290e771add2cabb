"""dense11 format version 3's unpack on ``dense11_wgmma``'s decode (Hopper, Gluon): each program decodes 64 rows of
one 1024-column block, 128 columns a step, with the tile's word-level decode (``wgmma_decode._lane_words``: the
codes, escape ranks and windows of a run once, 8 byte permutes a lane word of 4 weights), and stores the bf16 rows
16 bytes at a time; the exceptions (digit 15 and ranks 8 and up, decoded as exponent 0) are patched in after it from
the prepared list (``Prepared.pos`` / ``vals``: one indexed store).

Why: on an H100 (2026-12-07, ``benchmarks/history/2026-12-07-h100-34.md``) the Triton unpack (``unpack_v2``, one run
of 32 weights a thread) moved about 0.7 TB/s on the 7B step's matrices, while ``dense11_wgmma`` decoded the same
weights about 3x faster inside its product; the long-M path (unpack + cuBLAS) is bound by the unpack. CUDA only,
Hopper only (Gluon has no interpreter): tests compile it for sm_90 on any machine and check its bits on the GPU.
``dense11_unpack_cublas`` runs it with ``Dense11LongConfig(unpack="wg")``; no table row chooses it until
``benchmarks/probes/dense11_unpack_wg.py`` has timed it against ``unpack_v2``.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from glyd.codec import dense11 as _codec
from glyd.kernels import _common as C
from glyd.kernels.dense11.decode_v2 import prepare
from glyd.kernels.dense11.wgmma_decode import BK, BN, _block_start, _codes, _lane_words, _step_window, _tile, _u, \
    run_layout
from glyd.kernels.fixed12.wgmma import layouts

# the decoded [row, c1, c0, q1, q0, j, T, h] words permuted to column order (c1 c0 h q1 q0 T j)
COL_ORDER = gl.constexpr((0, 1, 2, 7, 3, 4, 6, 5))


@gluon.jit
def _sm_words(sm_ptr, s_off, st, RUNS):
    # step st's sm words of halves a and b ([BN, 16] lane words, version 3's block-wise places)
    b = st // 8
    rb = gl.minimum(RUNS - 32 * b, 32)
    sp = sm_ptr + s_off + 256 * b + 16 * (st % 8)
    return _u(gl.load(sp)), _u(gl.load(sp + 4 * rb))


@gluon.jit(do_not_specialize=["NESCW", "TH0", "TH1", "TL0", "TL1", "HA0", "HA1", "HB0", "HB1", "LA0", "LA1", "LB0",
                              "LB1"])
def _d11_unpack_wg_kernel(code_ptr, sm_ptr, esc_ptr, ebase_ptr, eoff_ptr, out_ptr, N, KP, NBR, NESCW, TH0, TH1, TL0,
                          TL1, HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1, WL: gl.constexpr, RL: gl.constexpr,
                          SL: gl.constexpr):
    # out[N, KP] bf16: rows pid_n * 64 .. of block program_id(1), exceptions as their placeholder (patched after);
    # rows past N decode row N - 1 again and are not stored. A step's words are loaded while the step before decodes
    c_off, s_off, nr, cc, q, th0, th1, tl0, tl1 = _tile(gl.program_id(0), N, KP, TH0, TH1, TL0, TL1, BN, WL, RL)
    runs = KP // 32
    blk = gl.program_id(1)
    s0 = blk * 8
    s1 = gl.minimum(s0 + 8, KP // BK)
    run = _block_start(ebase_ptr, eoff_ptr, nr * NBR + blk) + cc * 0
    rows = gl.program_id(0) * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, SL))
    cols = gl.arange(0, BK, layout=gl.SliceLayout(0, SL))
    off = rows[:, None].to(gl.int64) * KP + cols[None, :]
    keep = (rows[:, None] < N) & (cols[None, :] < BK)
    c0, c1, c2 = _codes(code_ptr, c_off, s0, runs)
    s4a, s4b = _sm_words(sm_ptr, s_off, s0, runs)
    for st in range(s0, s1):
        nx = gl.minimum(st + 1, s1 - 1)  # the last step loads its own words again
        nc0, nc1, nc2 = _codes(code_ptr, c_off, nx, runs)
        ns4a, ns4b = _sm_words(sm_ptr, s_off, nx, runs)
        rank, run, w0, w1 = _step_window(c0, c1, c2, run, cc, esc_ptr, NESCW)
        w = _lane_words(c0, c1, c2, s4a, s4b, q, w0, w1, rank, th0, th1, tl0, tl1, HA0, HA1, HB0, HB1, LA0, LA1, LB0,
                        LB1, BN, WL)
        v = gl.convert_layout(gl.reshape(gl.permute(w, COL_ORDER.value), [BN, BK]), SL)
        gl.store(out_ptr + off + st * BK, v, mask=keep)
        c0, c1, c2, s4a, s4b = nc0, nc1, nc2, ns4a, ns4b


def store_layout(warps: int = 4):
    """The [64, 128] bf16 rows' store layout: 8 columns (16 bytes) a thread, a row's 128 columns on 16 lanes (the
    decoded words reach it through shared memory: 16 barriers a step, every store a whole 32-byte sector)."""
    return gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[warps, 1], order=[1, 0])


def direct_layout(warps: int = 4):
    """The decode's own layout of the [64, 128] bf16 rows, its registers in column order: a thread keeps run c's 32
    columns of rows g and g + 8 (lane 4 g + c, ``fixed12.wgmma.layouts``' words), so the convert moves nothing
    between threads (static sm_90: 474 instructions a step, 96 registers, no barrier) and stores 16 bytes at a time,
    half a sector each: a warp's store touches 32 sectors where ``store_layout``'s fills 16."""
    return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [8, 0]],
                                      lane_bases=[[0, 32], [0, 64], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[16 << i, 0] for i in range(warps.bit_length() - 1)],
                                      block_bases=[], shape=[BN.value, BK.value])


def _check(p) -> None:
    # the matrices unpack_wg decodes (the same words as dense11_unpack_cublas's can_implement for unpack="wg")
    n, k = p.shape
    if p.arrays["sm"].device.type != "cuda" or C.interpreting():
        raise RuntimeError("unpack_wg runs only on a CUDA GPU (Gluon has no interpreter)")
    if p.version != 3:
        raise ValueError(f"unpack_wg decodes dense11 format version 3, got version {p.version}")
    if k % BK.value or p.arrays["sm"].shape[1] != k:
        raise ValueError(f"unpack_wg needs K a multiple of {BK.value} (no padded columns), got K = {k}")


class WgLaunch:
    """The unpack of one version-3 matrix worked out once (grid, tables, the exceptions' places and words), called as
    ``launch(out, *arrays)`` (``arrays``: dense11's, in ``glyd.codec.dense11.ARRAYS`` order) like
    ``glyd.kernels._plan.Launch``; it holds none of the matrix's arrays."""

    __slots__ = ("grid", "scalars", "meta", "pos", "vals")

    def __init__(self, p, direct: bool = False) -> None:
        _check(p)
        n, k = p.shape
        prep = prepare(p)
        nbr = _codec.blocks_per_row(k)
        self.grid = (triton.cdiv(n, BN.value), nbr)
        self.scalars = (n, k, nbr, prep.nescw, *prep.lut, *prep.tab)
        sl = direct_layout(4) if direct else store_layout(4)
        self.meta = dict(WL=layouts(BN.value, 16, 4)[0], RL=run_layout(4), SL=sl, num_warps=4)
        self.pos, self.vals = (prep.pos, prep.vals) if prep.nexc else (None, None)

    # out: bf16 [N, K] (written, contiguous); arrays: dense11's, in ARRAYS order (sm, code, base, ...)
    def __call__(self, out: torch.Tensor, *arrays: torch.Tensor) -> None:
        a = dict(zip(_codec.ARRAYS, arrays))
        if self.grid[0] * self.grid[1] == 0 or out.numel() == 0:
            return
        _d11_unpack_wg_kernel[self.grid](a["code"], a["sm"].view(torch.int32), a["esc"], a["esc_base"], a["esc_off"],
                                         out, *self.scalars, **self.meta)
        if self.pos is not None:  # the exceptions' true words over their placeholders
            out.view(torch.int16).view(-1)[self.pos] = self.vals


# packed: dense11 version 3 [N, K], K a multiple of 128 (no padded columns) -> launch(out, *arrays): out bf16 [N, K]
def unpack_wg_launch(p, direct: bool = False) -> WgLaunch:
    """The unpack of the version-3 ``p`` as one launch (``dense11_unpack_cublas``'s with ``unpack="wg"``, or
    ``"wg_direct"``: ``direct``, the stores from the decode's own layout)."""
    return WgLaunch(p, direct)


# packed: dense11 version 3 [N, K], K a multiple of 128 (no padded columns) -> bf16 [N, K] (into out when given)
def unpack_wg(p, out: torch.Tensor | None = None, direct: bool = False) -> torch.Tensor:
    """The bf16 matrix of the version-3 ``p`` on its (Hopper) GPU, bit for bit, by the wgmma tile's decode
    (``direct``: stored from the decode's own layout, ``direct_layout``, not through shared memory).

    >>> import torch, glyd
    >>> w = torch.randn(64, 256).to(torch.bfloat16)
    >>> unpack_wg(glyd.pack(w.cuda(), "dense11")).equal(w.cuda())  # doctest: +SKIP
    True
    """
    _check(p)
    n, k = p.shape
    if out is None:
        out = torch.empty(n, k, dtype=torch.bfloat16, device=p.arrays["sm"].device)
    elif out.shape != (n, k) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 tensor of shape {(n, k)}, got {out.dtype} "
                         f"{tuple(out.shape)}")
    WgLaunch(p, direct)(out, *(p.arrays[a] for a in _codec.ARRAYS))
    return out
