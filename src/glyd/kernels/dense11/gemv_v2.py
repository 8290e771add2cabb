"""The fused GEMV of a ``dense11`` format-version-2 matrix (``dense11_v2_gemv``) and of a version-3 one
(``dense11_v3_gemv``: the same kernel with ``V3``, its words loaded block-wise) for M = 1-64: each
[BN, BK] weight tile decoded once (``decode_v2.decode_step``) for every x row of the program.

- M = 1 (``MB == 1``): products of the lane words with x in fp32 FMAs into a [BN, W, 4] accumulator,
  reduced along K once after the last step (no cross-thread reduction inside the loop), in a fixed
  order (``row_sum``): both versions' kernels give the same bits whatever layouts they compile to.
- M = 2-64: one decode serves MB = 16, 32 or 64 rows (``x_rows``: the smallest that holds M, capped
  by the config's ``mb``; rows past M masked to 0), the tensor cores do the products:
  ``dot="tile"`` rebuilds the tile in column order (``tl.join``, a permute) for one ``tl.dot``
  x [MB, BK] @ tile^T [BK, BN] a step (``"tile_wx"``: tile [BN, BK] @ x^T [BK, MB], the weights as
  the first operand); ``dot="lanes"`` runs 8 dots a step, one a byte lane t of a half h ([BN, BK/8]:
  columns 16h + 4q + t of each run) with the matching slice of x. Static sm_90 counts
  (``benchmarks/probes/dense_sass.py``, whole tiles, bn 16 x bk 256 on 4 warps): "tile" 16.2
  instructions a weight a thread a step at MB 16 (mma.sync), 17.9 at MB 32, 15.6 at MB 64 (wgmma
  64 x 16 x 16, one a 16 columns of K, both operands from shared memory; 168 registers, no spill);
  "tile_wx" 16.3, 18.1 and 24.0 (MB 64: mma.sync, 16 bytes spilled); "lanes" 22.2 at MB 16. Which
  is faster is for the H200 to say (``benchmarks/history/2026-12-05-dense11-mid-cpu.md``).
  ``dot="mma"`` (``gemv_mma.py``): the decoded lane words as ``mma.sync``'s A operand in registers (no
  shared memory), 8-64 x rows a program: 8.0-9.3 a weight at bn 64 x bk 128
  (``benchmarks/history/2026-12-05-dense11-decode-cpu.md``).

Exceptions (digit 15, and a run's escapes of rank 8 and up) decode with exponent 0; the program of
the first K split adds ``x[col] * (true - placeholder)`` for its rows' exceptions after the loop.
K splits of whole 1024-column blocks (a block's first rank comes from its offsets, so a split needs
no carry) fill the GPU when the row tiles alone would not; their fp32 partials are summed after.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from glyd.codec import dense11 as _codec
from glyd.kernels import _common as C
from glyd.kernels._fields import flags, ints
from glyd.kernels._interp import isolated
from glyd.kernels.dense11.decode_v2 import block_start, decode_step, decode_words, hw, load_words, prepare
from glyd.kernels.dense11.exceptions_v2 import exceptions as _exceptions
from glyd.kernels.fixed12.words import f32_lane, x_lane
from glyd.kernels.registry import Kernel

BLOCK = _codec.BLOCK
BLOCK_C = tl.constexpr(BLOCK)  # what a jit function may read of a global
MAX_MB = 64  # x rows a program: 64 x BK of bf16 x is 32 KiB a step at BK 256


@triton.jit
def _fma_half(acc, hi, lo, x_ptr, x32_ptr, kb, K, HALF: tl.constexpr, W: tl.constexpr, HW: tl.constexpr,
              X32: tl.constexpr, FULL: tl.constexpr):
    # acc [BN, W, 4] += the half's 16 weights of each run times x (one x row). X32: x read as bf16
    # pairs (two int32 words a lane word), else bf16 by bf16
    c = kb + 32 * tl.arange(0, W)[None, :, None] + 16 * HALF + 4 * tl.arange(0, 4)[None, None, :]
    if X32:
        if FULL:  # the half's 8 words of each run as one [W, 8] load (two 16-byte vectors), split into pairs
            v = kb // 2 + 16 * tl.arange(0, W)[:, None] + 8 * HALF + tl.arange(0, 8)[None, :]
            xa, xb = tl.split(tl.reshape(tl.load(x32_ptr + v).to(tl.uint32, bitcast=True), [1, W, 4, 2]))
        else:
            xa = tl.load(x32_ptr + c // 2, mask=c < K, other=0).to(tl.uint32, bitcast=True)
            xb = tl.load(x32_ptr + c // 2 + 1, mask=c + 2 < K, other=0).to(tl.uint32, bitcast=True)
        for t in tl.static_range(4):
            acc += f32_lane(hi, lo, t, HW) * x_lane(xa, xb, t)
    else:
        for t in tl.static_range(4):
            xv = tl.load(x_ptr + c + t, mask=c + t < K, other=0.0).to(tl.float32)
            acc += f32_lane(hi, lo, t, HW) * xv
    return acc


@triton.jit
def row_sum(acc1, BN: tl.constexpr, W: tl.constexpr):
    # acc1 [BN, W, 4] -> [1, BN]: a fixed pairwise order (flat index 2i + 1 onto 2i, again and again), the same
    # whatever layout the compiler gave acc1. tl.sum's order follows the layout (v2's decode has lanes along
    # the rows and W over 4 warps, a block-wise order's along W): fp32 sums differing in the last bit, and
    # about 2-5 bf16 outputs in 10^5 (2026-12-05: qkv and o at M = 1 "differed from v2")
    s = tl.reshape(acc1, [BN, 2 * W, 2])
    for _ in tl.static_range(W.bit_length()):  # 4 W = 2^(log2 W + 2) values: log2 W + 2 halvings
        a, b = tl.split(s)
        s = tl.reshape(a + b, [BN, a.shape[1] // 2, 2])
    a, b = tl.split(s)
    return tl.reshape(a + b, [1, BN])


@triton.jit
def _dot_half(acc, hi, lo, x_ptr, rm, mmask, stride_xm, kb, K, HALF: tl.constexpr, BN: tl.constexpr,
              W: tl.constexpr, HW: tl.constexpr):
    # acc [MB, BN] += x [MB, 16 W] @ the half's weights^T, as 4 dots over the byte lanes t
    j = tl.arange(0, 4 * W)
    c = kb + 32 * (j // 4) + 16 * HALF + 4 * (j % 4)  # [4W]: lane word (w, q)'s first column, w-major as the reshape
    for t in tl.static_range(4):
        w16 = (((hi >> (8 * t)) & 0xFF) << 8) | ((lo >> (8 * t)) & 0xFF)
        xt = tl.load(x_ptr + rm[:, None] * stride_xm + (c + t)[None, :], mask=mmask[:, None] & (c + t < K)[None, :],
                     other=0.0)
        if HW:
            wb = w16.to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:  # the interpreter's dot multiplies bf16's raw integers: fp32 operands there (exact products)
            wb = (w16 << 16).to(tl.float32, bitcast=True)
            xt = xt.to(tl.float32)
        acc += tl.dot(xt, tl.trans(tl.reshape(wb, [BN, 4 * W])))
    return acc


@triton.jit
def _lane16(hi, lo, t: tl.constexpr, HW: tl.constexpr):
    # the weights of byte lane t as bf16 (fp32 under the interpreter, whose dot misreads bf16)
    w16 = (((hi >> (8 * t)) & 0xFF) << 8) | ((lo >> (8 * t)) & 0xFF)
    if HW:
        r = w16.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        r = (w16 << 16).to(tl.float32, bitcast=True)
    return r


@triton.jit
def _lanes16(hi, lo, BN: tl.constexpr, W: tl.constexpr, HW: tl.constexpr):
    # [BN, W, 16] of one half's lane words, in column order
    j = tl.join(tl.join(_lane16(hi, lo, 0, HW), _lane16(hi, lo, 2, HW)),
                tl.join(_lane16(hi, lo, 1, HW), _lane16(hi, lo, 3, HW)))  # [.., q, i, j]: lane 2i + j
    return tl.reshape(j, [BN, W, 16])


@triton.jit
def _dot_tile(acc, hia, loa, hib, lob, x_ptr, rm, mmask, stride_xm, kb, K, BN: tl.constexpr, W: tl.constexpr,
              HW: tl.constexpr, W_FIRST: tl.constexpr):
    # the tile rebuilt in column order, one dot a step: acc [MB, BN] += x [MB, 32 W] @ tile^T, or
    # (W_FIRST) acc [BN, MB] += tile [BN, 32 W] @ x^T (the decoded weights as the dot's first operand)
    t = tl.permute(tl.join(_lanes16(hia, loa, BN, W, HW), _lanes16(hib, lob, BN, W, HW)), (0, 1, 3, 2))
    wt = tl.reshape(t, [BN, 32 * W])
    c = kb + tl.arange(0, 32 * W)
    xt = tl.load(x_ptr + rm[:, None] * stride_xm + c[None, :], mask=mmask[:, None] & (c < K)[None, :], other=0.0)
    if not HW:
        xt = xt.to(tl.float32)
    if W_FIRST:
        r = tl.dot(wt, tl.trans(xt), acc)
    else:
        r = tl.dot(xt, tl.trans(wt), acc)
    return r


@isolated
@triton.jit(do_not_specialize=["NESCW", "TH0", "TH1", "TL0", "TL1", "HA0", "HA1", "HB0", "HB1", "LA0", "LA1", "LB0",
                               "LB1"])
def _gemv_v2_kernel(x_ptr, x32_ptr, sm_ptr, sm8_ptr, code_ptr, esc_ptr, ebase_ptr, eoff_ptr, rowptr_ptr, eidx_ptr, eexp_ptr,
                    bias_ptr, out_ptr, M, N, K, KP, NBR, NESCW, BLOCKS_SPLIT, stride_xm, TH0, TH1, TL0, TL1, HA0, HA1,
                    HB0, HB1, LA0, LA1, LB0, LB1, BN: tl.constexpr, BK: tl.constexpr, MB: tl.constexpr,
                    HW: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_EXC: tl.constexpr, PARTIAL: tl.constexpr,
                    X32: tl.constexpr = False, FULL: tl.constexpr = False, TILE_DOT: tl.constexpr = True,
                    W_FIRST: tl.constexpr = False, PREFETCH: tl.constexpr = False, V3: tl.constexpr = False):
    # rows [pid_n * BN, +BN) x blocks [pid_k * BLOCKS_SPLIT, +BLOCKS_SPLIT) for x rows [pid_m * MB, +MB).
    # V3: format version 3's arrays (decode_v2.load_step_v3, digits gathered 1-D, exceptions' sm block-wise)
    W: tl.constexpr = BK // 32
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    rm = pid_m * MB + tl.arange(0, MB)
    mmask = rm < M
    tab = (HA0, HA1, HB0, HB1, LA0, LA1, LB0, LB1)
    lut = (TH0, TH1, TL0, TL1)
    if MB == 1:
        acc1 = tl.zeros([BN, W, 4], dtype=tl.float32)
    elif W_FIRST and TILE_DOT:
        acc = tl.zeros([BN, MB], dtype=tl.float32)
    else:
        acc = tl.zeros([MB, BN], dtype=tl.float32)
    xrow = x_ptr + pid_m * stride_xm
    x32row = x32_ptr + pid_m * (stride_xm // 2)
    # the split's steps in one loop (a block's first step takes the block's first rank); PREFETCH: the next
    # step's words are loaded before this step decodes (their latency hidden behind it, 11 registers more)
    k0 = pid_k * BLOCKS_SPLIT * BLOCK_C
    k1 = tl.minimum(k0 + BLOCKS_SPLIT * BLOCK_C, KP)
    last = k0 + ((k1 - k0 - 1) // BK) * BK
    run = block_start(ebase_ptr, eoff_ptr, rn * NBR + pid_k * BLOCKS_SPLIT, nmask)
    if PREFETCH:
        c0, c1, c2, s4a, s4b = load_words(code_ptr, sm_ptr, rn, nmask, k0, KP, BN, W, FULL, V3)
    for kb in range(k0, k1, BK):
        if kb == (kb // BLOCK_C) * BLOCK_C:  # (constexpr has no __rmod__ under the interpreter)
            run = block_start(ebase_ptr, eoff_ptr, rn * NBR + kb // BLOCK_C, nmask)
        if PREFETCH:
            n0, n1, n2, n4a, n4b = load_words(code_ptr, sm_ptr, rn, nmask, tl.minimum(kb + BK, last), KP, BN, W,
                                              FULL, V3)
            hia, loa, hib, lob, run = decode_words(c0, c1, c2, s4a, s4b, esc_ptr, NESCW, run, tab, lut, HW, BN, W,
                                                   V3)
            c0, c1, c2, s4a, s4b = n0, n1, n2, n4a, n4b
        else:
            hia, loa, hib, lob, run = decode_step(code_ptr, sm_ptr, esc_ptr, rn, nmask, kb, KP, NESCW, run, tab, lut,
                                                  BN, W, HW, FULL, V3)
        if MB == 1:
            acc1 = _fma_half(acc1, hia, loa, xrow, x32row, kb, K, 0, W, HW, X32, FULL)
            acc1 = _fma_half(acc1, hib, lob, xrow, x32row, kb, K, 1, W, HW, X32, FULL)
        else:
            if TILE_DOT:
                acc = _dot_tile(acc, hia, loa, hib, lob, x_ptr, rm, mmask, stride_xm, kb, K, BN, W, HW, W_FIRST)
            else:
                acc = _dot_half(acc, hia, loa, x_ptr, rm, mmask, stride_xm, kb, K, 0, BN, W, HW)
                acc = _dot_half(acc, hib, lob, x_ptr, rm, mmask, stride_xm, kb, K, 1, BN, W, HW)
    if MB == 1:
        acc = row_sum(acc1, BN, W)
    elif W_FIRST and TILE_DOT:
        acc = tl.trans(acc)
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


def x_rows(m: int, mb: int) -> int:
    """The x rows a program decodes its tile for (the kernel's MB): 1 (FMAs) at M = 1 or ``mb`` 1,
    else the smallest of 16, 32, 64 that holds M, at most ``max(mb, 16)`` (a tl.dot side is 16 or more).

    >>> x_rows(1, 64), x_rows(7, 64), x_rows(33, 64), x_rows(33, 32), x_rows(200, 64)
    (1, 16, 64, 32, 64)
    """
    if m == 1 or mb == 1:
        return 1
    return min(max(16, triton.next_power_of_2(m)), max(16, mb), MAX_MB)


def _pairs(x2: torch.Tensor) -> torch.Tensor | None:
    # x2 as int32 bf16 pairs (K even, rows at even strides, 4-byte aligned), else None
    k = x2.shape[1]
    if k % 2 or x2.stride(0) % 2 or x2.data_ptr() % 4:
        return None
    return torch.as_strided(x2, (x2.shape[0], k), (x2.stride(0), 1)).view(torch.int32)


@dataclasses.dataclass(frozen=True)
class Dense11V2GemvConfig:
    """``bn`` weight rows a program, ``bk`` columns a step (dividing 1024; a run of 32 a thread at
    ``bn * bk / 32 = 32 * warps``), up to ``mb`` x rows decoded once (1: the FMA path; 2-64: the
    smallest of 16, 32, 64 rows that holds M, at most ``max(mb, 16)``, through ``tl.dot``; more rows:
    more programs), ``split`` K splits of whole 1024-column blocks (0: one split a block when the
    row tiles alone would leave the GPU's SMs idle), ``warps``, ``dot``: the M >= 2 products as one
    dot a step of the tile in column order, x @ tile^T (``"tile"``) or tile @ x^T (``"tile_wx"``),
    or 8 dots a step, one a byte lane (``"lanes"``; at most 32 x rows a program), or (``"mma"``, bk
    128 and bn 16 x warps) the decoded words as an MMA operand in registers, 8-64 x rows
    (``gemv_mma``; version 3 only: version 2 runs ``"tile"`` for it), ``prefetch``: each
    step's words loaded while the step before decodes (2026-12-05 Nsight Compute: 46% of the M = 1
    GEMV's cycles between issues wait on its loads; off until the H200 times it), ``prefetch_depth``
    (``dot="mma"`` with ``prefetch``): 2 loads them two steps ahead (a loop of two steps a trip),
    ``x_prefetch`` (``dot="mma"``): x's lines of the step two on prefetched into L1 each step
    (``prefetch.global.L1``, no register held).

    >>> Dense11V2GemvConfig(bn=32, bk=128, mb=64).mb
    64
    """

    bn: int = 16
    bk: int = 256
    mb: int = 64
    split: int = 0
    warps: int = 4
    dot: str = "tile"
    prefetch: bool = False
    prefetch_depth: int = 1
    x_prefetch: bool = False

    def __post_init__(self) -> None:
        C.pow2(self, "bn", "bk", "mb", "warps")
        if not 64 <= self.bk <= BLOCK or self.mb > MAX_MB or self.bn < 16:
            raise ValueError(f"bk must be 64-{BLOCK}, mb at most {MAX_MB} and bn at least 16 (a tl.dot side), "
                             f"got bk={self.bk}, mb={self.mb}, bn={self.bn}")
        if not isinstance(self.split, int) or isinstance(self.split, bool) or self.split < 0:
            raise ValueError(f"split must be an int >= 0, got {self.split!r}")
        if not isinstance(self.prefetch, bool):
            raise ValueError(f"prefetch must be True or False, got {self.prefetch!r}")
        ints(self, 1, 2, "prefetch_depth")
        flags(self, "x_prefetch")
        if self.dot not in ("tile", "tile_wx", "lanes", "mma"):  # first: the checks below name dot's value
            raise ValueError(f"dot must be 'tile', 'tile_wx', 'lanes' or 'mma', got {self.dot!r}")
        if self.x_prefetch and self.dot != "mma":
            raise ValueError(f"x_prefetch applies with dot='mma', got x_prefetch={self.x_prefetch}, dot={self.dot!r}")
        if self.prefetch_depth == 2 and not (self.prefetch and self.dot == "mma"):
            raise ValueError(f"prefetch_depth=2 applies with prefetch=True and dot='mma', got "
                             f"prefetch={self.prefetch}, dot={self.dot!r}")
        if self.dot == "mma" and (self.bk != 128 or self.bn != 16 * self.warps):
            raise ValueError(f"dot='mma' takes bk=128 and bn=16*warps (a run of 32 of two rows a thread), got "
                             f"bk={self.bk}, bn={self.bn}, warps={self.warps}")


@dataclasses.dataclass(frozen=True)
class Dense11V3GemvConfig(Dense11V2GemvConfig):
    """``Dense11V2GemvConfig``'s fields for the GEMV of format version 3 (``dense11_v3_gemv``).

    >>> Dense11V3GemvConfig(prefetch=True).bk
    256
    """


class Dense11V2GemvKernel(Kernel):
    """The fused GEMV of dense11 format version 2: any shape, 1-64 x rows a program (any M: more programs)."""

    name = "dense11_v2_gemv"
    layout = "dense11"
    Config = Dense11V2GemvConfig
    VERSION = 2

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if ok and problem.version != cls.VERSION:
            return False, (f"{cls.name} decodes dense11 format version {cls.VERSION}; this matrix is version "
                           f"{problem.version} (re-save it with this glyd to get version 3; dense11_v3_gemv runs "
                           "version 3, dense11_v2_gemv 2, dense11_gemv 1)")
        return ok, why

    # x: bf16 [M, K]; packed: dense11 v2 (v3: Dense11V3GemvKernel) [N, K]; bias: [N] or None; out: bf16 [M, N]
    @classmethod
    def launch(cls, x2, packed, bias, config, out):
        p = packed
        if p.version != cls.VERSION:
            raise ValueError(f"{cls.name} decodes dense11 format version {cls.VERSION}, got version {p.version}")
        C.check_launch_shapes(cls.name, x2, p.shape, out, bias)  # (K = 0 divided by zero choosing the K splits)
        prep = prepare(p)
        m, k = x2.shape
        n = p.shape[0]
        kp = p.arrays["sm"].shape[1]
        if x2.dtype != torch.bfloat16 or x2.stride(1) != 1:
            raise ValueError(f"x must be bf16 with unit stride along K, got {x2.dtype}, strides {x2.stride()}")
        if out.shape != (m, n) or out.dtype != torch.bfloat16:
            raise ValueError(f"out must be bf16 [{m}, {n}], got {out.dtype} {tuple(out.shape)}")
        nbr = _codec.blocks_per_row(k)
        x32 = _pairs(x2)
        # x as bf16 pairs: the MMA's B registers. Version 3 only: the kernel's lane map (element (8 w + g, c) of a
        # [bn / 2, 4] operand in lane 4 g + c of warp w) is Triton's layout choice, not forced; for version 2's
        # loads (code words at stride 3) Triton 3.6 gives the MMA's operands threadsPerWarp [32, 1] where K and x's
        # row stride are not multiples of 16 (2026-12-05 H100: garbage products at K 1100). Version 2 with
        # dot="mma" runs the tile dot (its x rows as "tile": x_rows of config.mb)
        mma = config.dot == "mma" and x32 is not None and cls.VERSION == 3
        if mma:
            from glyd.kernels.dense11.gemv_mma import mma_rows

            mb = mma_rows(m, config.mb)
        else:  # "lanes" at 64 rows: Triton 3.6's sm_90 compile aborts (LLVM ERROR: Illegal shared layout)
            mb = x_rows(m, min(config.mb, 32) if config.dot == "lanes" else config.mb)
        tiles = triton.cdiv(n, config.bn) * triton.cdiv(m, mb)
        split = config.split or (nbr if tiles < 2 * C.sm_count(x2.device) else 1)
        per = triton.cdiv(nbr, max(1, min(split, nbr)))
        split = triton.cdiv(nbr, per)
        dst = torch.empty(split, m, n, dtype=torch.float32, device=x2.device) if split > 1 else out
        bk = min(config.bk, triton.next_power_of_2(kp))
        if mma:
            from glyd.kernels.dense11.gemv_mma import launch_mma

            launch_mma(x2, x32, p, prep, bias, dst, (triton.cdiv(n, config.bn), split, triton.cdiv(m, mb)), per, mb,
                       config, cls.VERSION == 3)
        else:
            cls._launch_v2(x2, x32, p, prep, bias, dst, config, split, per, mb, bk)
        if split > 1:
            C.finalize(dst, bias, out)
        return out

    @staticmethod
    def _launch_v2(x2, x32, p, prep, bias, dst, config, split, per, mb, bk):
        m, k = x2.shape
        n = p.shape[0]
        kp = p.arrays["sm"].shape[1]
        a = p.arrays
        _gemv_v2_kernel[(triton.cdiv(n, config.bn), split, triton.cdiv(m, mb))](
            x2, x32 if x32 is not None else x2, a["sm"].view(torch.int32), a["sm"], a["code"], a["esc"], a["esc_base"],
            a["esc_off"], prep.rowptr, a["exc_idx"], a["exc_exp"], bias if bias is not None else x2, dst, m, n, k, kp,
            _codec.blocks_per_row(k), prep.nescw, per,
            x2.stride(0), *prep.lut, *prep.tab,
            BN=config.bn, BK=bk, MB=mb, HW=hw(), HAS_BIAS=bias is not None, HAS_EXC=prep.nexc > 0, PARTIAL=split > 1,
            X32=x32 is not None, FULL=n % config.bn == 0 and k == kp and kp % bk == 0, TILE_DOT=config.dot != "lanes",
            W_FIRST=config.dot == "tile_wx", PREFETCH=config.prefetch, V3=p.version == 3, num_warps=config.warps,
        )


class Dense11V3GemvKernel(Dense11V2GemvKernel):
    """The fused GEMV of dense11 format version 3 (``glyd.codec.dense11_v3``): version 2's kernel reading the
    block-wise ``code`` and ``sm`` (whole sectors a warp load) and gathering its escape digits 1-D."""

    name = "dense11_v3_gemv"
    Config = Dense11V3GemvConfig
    VERSION = 3
