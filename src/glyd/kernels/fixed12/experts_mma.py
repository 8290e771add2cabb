"""The grouped tensor-core product of packed ``fixed12`` experts: the rows sorted by expert on the
device, each expert's packed tile decoded once for a block of its rows (``tl.dot``, fp32), no host
sync (a decode step of 32-64 sequences at top-8, 256-512 rows, captured in a CUDA graph).

Two launches, as vLLM's fused MoE (``moe_align_block_size``, then ``fused_moe_kernel``):

* ``_align_kernel`` (one program an expert, one more for the unused blocks): each expert's rows in
  their original order (a stable sort by expert) at the start of its own run of BLOCK_M-row blocks,
  the run's tail padded with the sentinel S; each block's expert, -1 where the block is past the last
  expert's run. The number of blocks is bounded on the host, ``(S + min(E, S) * (BLOCK_M - 1)) /
  BLOCK_M``, so the grid never depends on the routing.
* ``_mma_kernel`` (a row block and a tile of BLOCK_N weight rows a program): the block's rows of x
  gathered by their indices, the expert's [BLOCK_N, K] byte tiles decoded as ``fixed12_operand_dot``
  decodes them (weights as the MMA's first operand, x transposed as the second: 16 x rows are the
  smallest MMA), its exceptions added (through the grouped GEMV's row pointer over all experts'
  rows, ``EXC`` at a time: the first chunk loaded before the K loop, summed onto the weight rows by
  a one-hot product after it), and the bf16 results stored back to the rows' own positions.

Where every expert has the same exponent window (``base``), as random or trained experts usually
do, the base is a compile-time constant: ``fixed12_operand_dot`` measured that a runtime base moves
the decoded tile through shared memory.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from glyd.codec.experts import PackedExperts
from glyd.kernels import _common as C
from glyd.kernels._fields import flags, ints
from glyd.kernels._interp import isolated
from glyd.kernels.experts import ExpertsKernel
from glyd.kernels.fixed12.experts import _outside_a_capture
from glyd.kernels.fixed12.experts import prepare as prepare_exceptions
from glyd.kernels.fixed12.words import exc_chunk

#: Rows of one launch at most (the alignment kernel reads every row once an expert).
MAX_ROWS = 4096
_CHUNK = 256  # rows the alignment kernel reads at once
#: Exceptions a step of the tile's exception sum (the one-hot product's K). Trained weights hold about
#: 0.1% (~130 a [64, 2048] tile): one at a time, each costs a chain of dependent loads.
EXC = 32


@dataclasses.dataclass(frozen=True)
class ExpertsMmaConfig:
    """``block_m`` rows of one expert a program (>= 16, the MMA's smallest), ``block_n`` weight rows
    a program, K steps of ``block_k`` (64-weight groups; fewer where the padded K is not a multiple),
    ``warps`` a program, ``stages`` of the K loop's software pipeline; ``max_rows``: the most rows
    (token-expert pairs) the registry gives it, <= ``MAX_ROWS`` (above, the unpack + grouped GEMM wins
    on the H200: 0.70 against 0.88 ms for a Qwen3-30B-A3B gate_up at 4096 rows)."""

    block_m: int = 16
    block_n: int = 64
    block_k: int = 128
    warps: int = 4
    stages: int = 3
    max_rows: int = MAX_ROWS

    def __post_init__(self) -> None:
        C.pow2(self, "block_m", "block_n", "block_k", "warps")
        if isinstance(self.max_rows, bool) or not isinstance(self.max_rows, int) or not 1 <= self.max_rows <= MAX_ROWS:
            raise ValueError(f"ExpertsMmaConfig.max_rows must be an int in 1..{MAX_ROWS}, got {self.max_rows!r}")
        if self.block_m < 16 or self.block_n < 16 or self.block_k < 64:
            raise ValueError(f"ExpertsMmaConfig needs block_m >= 16, block_n >= 16 and block_k >= 64, got {self}")
        if self.block_m > 128 or self.block_n > 256 or self.warps > 16:
            raise ValueError(f"ExpertsMmaConfig: block_m <= 128, block_n <= 256, warps <= 16, got {self}")
        ints(self, 1, 8, "stages")


class Prepared:
    """Per packed experts tensor: the grouped GEMV's exception row pointer and the experts' shared
    base (None where they differ)."""

    def __init__(self, p: PackedExperts) -> None:
        self.exc = prepare_exceptions(p)
        bases = p.arrays["base"].reshape(-1).tolist()  # E bytes to the host, once
        self.base = bases[0] if bases and all(b == bases[0] for b in bases) else None


def prepare(p: PackedExperts) -> Prepared:
    """What the launch needs of ``p`` beyond its arrays (once a packed experts tensor, outside a capture)."""
    if p.layout != "fixed12":
        raise ValueError(f"expected fixed12 experts, got layout {p.layout!r}")
    return C.cached(p.arrays["base"], lambda: _outside_a_capture(p) and Prepared(p), p.arrays.values(),
                    C.packed_tag(p))


def max_blocks(s: int, e: int, block_m: int) -> int:
    """Row blocks of S rows over E experts at most, whatever the routing (each expert's last block
    may be partly padding; at most min(E, S) experts have rows)."""
    return (s + min(e, s) * (block_m - 1)) // block_m


@isolated
@triton.jit
def _align_kernel(ids_ptr, rows_ptr, bexp_ptr, S, E, NB, BM: tl.constexpr, EP: tl.constexpr, CH: tl.constexpr):
    # Program e < E: expert e's rows (stable) into its blocks, then the sentinel S; program E: -1 for
    # the blocks past the last expert's. Ids outside the experts are clamped, as the GEMV does (the
    # op checks them before an eager launch; a captured one cannot).
    e = tl.program_id(0)
    ch = tl.arange(0, CH)
    hist = tl.zeros([EP], dtype=tl.int32)
    for s0 in range(0, S, CH):
        v = tl.load(ids_ptr + s0 + ch, mask=s0 + ch < S, other=0).to(tl.int32)
        v = tl.minimum(tl.maximum(v, 0), E - 1)
        hist += tl.histogram(v, EP, mask=s0 + ch < S)
    ep = tl.arange(0, EP)
    nblk = (hist + BM - 1) // BM
    if e < E:
        cnt = tl.sum(tl.where(ep == e, hist, 0))
        b0 = tl.sum(tl.where(ep < e, nblk, 0))
        nb = (cnt + BM - 1) // BM
        run = b0 * BM
        for s0 in range(0, S, CH):
            ok = s0 + ch < S
            v = tl.load(ids_ptr + s0 + ch, mask=ok, other=0).to(tl.int32)
            hit = (tl.minimum(tl.maximum(v, 0), E - 1) == e) & ok
            h = hit.to(tl.int32)
            rank = tl.cumsum(h, 0) - h
            tl.store(rows_ptr + run + rank, s0 + ch, mask=hit)
            run += tl.sum(h)
        pad = cnt + tl.arange(0, BM)
        tl.store(rows_ptr + b0 * BM + pad, S + 0 * pad, mask=pad < nb * BM)
        for j in range(0, nb, CH):
            tl.store(bexp_ptr + b0 + j + ch, e + 0 * ch, mask=j + ch < nb)
    else:
        for j in range(tl.sum(nblk), NB, CH):
            tl.store(bexp_ptr + j + ch, -1 + 0 * ch, mask=j + ch < NB)


@triton.jit
def _exc_chunk(eidx_ptr, ehi_ptr, lo_ptr, x_ptr, es, e1, rml, mmask, stride_xm, base, K, stride_lo,
               E: tl.constexpr):
    # exceptions es.. (up to E, below e1) of the expert: their weight rows [E] (-1: none) and
    # x[rows, col] * (true - decoded weight) [E, BM] (decoded: the code's sign with offset 0)
    e = es + tl.arange(0, E)
    em = e < e1
    r, c, tv, pv = exc_chunk(eidx_ptr, ehi_ptr, lo_ptr, base, K, stride_lo, e, em)
    xv = tl.load(x_ptr + rml[None, :] * stride_xm + c[:, None], mask=em[:, None] & mmask[None, :],
                 other=0.0).to(tl.float32)
    return r, xv * tv[:, None] - xv * pv[:, None]  # (r: -1 past e1)


@triton.jit
def _exc_add(acc, r, d, rn):
    # acc [BN, BM] += one-hot [BN, E] (weight row rn holds exception j) @ d [E, BM] in full fp32
    # ("ieee": FMA, not tf32, which would drop 13 bits of each correction)
    oh = (rn.to(tl.int64)[:, None] == r[None, :]).to(tl.float32)
    return tl.dot(oh, d, acc, input_precision="ieee")


@isolated
@triton.jit
def _mma_kernel(x_ptr, rows_ptr, bexp_ptr, code_ptr, lo_ptr, base_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, out_ptr,
                S, N, K, KP, stride_xm, stride_code, stride_lo, BASE: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, G: tl.constexpr, EVEN: tl.constexpr, HAS_EXC: tl.constexpr, F32DOT: tl.constexpr,
                EXC: tl.constexpr = 32):
    # out[rows, n tile]^T [BN, BM] = W_e tile [BN, 32] @ x[rows]^T [32, BM], twice a 64-weight group
    # (its halves share the code bytes). Weight rows past N read row N-1 again, padding slots of the
    # block read x row 0; neither is stored.
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    ex = tl.load(bexp_ptr + pid_b)
    if ex < 0:  # a block past the last expert's run: no rows
        return
    rm = tl.load(rows_ptr + pid_b * BM + tl.arange(0, BM))
    mmask = rm < S
    rml = tl.where(mmask, rm, 0)
    row0 = ex.to(tl.int64) * N  # the expert's first row in the concatenated planes
    if BASE >= 0:
        base = BASE
    else:
        base = tl.load(base_ptr + ex).to(tl.uint16)
    rn = pid_n * BN + tl.arange(0, BN)
    rnl = tl.minimum(rn, N - 1)
    j = tl.arange(0, 32)
    code_off = (row0 + rnl)[:, None] * stride_code + j[None, :]
    lo_off = (row0 + rnl)[:, None] * stride_lo + j[None, :]
    x_off = rml[None, :] * stride_xm + j[:, None]
    if HAS_EXC:
        # the tile's first EXC exceptions loaded before the K loop (their chain of dependent loads
        # overlaps it), the rest (rare) after it
        e0 = tl.load(rowptr_ptr + row0 + pid_n * BN)
        e1 = tl.load(rowptr_ptr + row0 + tl.minimum(pid_n * BN + BN, N))
        lo_e = lo_ptr + row0 * stride_lo
        er, ed = _exc_chunk(eidx_ptr, ehi_ptr, lo_e, x_ptr, e0, e1, rml, mmask, stride_xm, base, K, stride_lo, EXC)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for kb in range(0, KP, 64 * G):
        for g in tl.static_range(G):
            kg = kb + 64 * g
            c = tl.load(code_ptr + code_off + kg // 2).to(tl.uint16)
            la = tl.load(lo_ptr + lo_off + kg).to(tl.uint16)
            lb = tl.load(lo_ptr + lo_off + kg + 32).to(tl.uint16)
            if EVEN:
                xa = tl.load(x_ptr + x_off + kg, mask=mmask[None, :], other=0.0)
                xb = tl.load(x_ptr + x_off + kg + 32, mask=mmask[None, :], other=0.0)
            else:  # padding columns: x is 0 there (the padded weights are finite)
                xa = tl.load(x_ptr + x_off + kg, mask=mmask[None, :] & (kg + j < K)[:, None], other=0.0)
                xb = tl.load(x_ptr + x_off + kg + 32, mask=mmask[None, :] & (kg + 32 + j < K)[:, None], other=0.0)
            # bf16 bits: sign = code bit 3 (7), exponent >> 1 = code bits 0-2 (4-6) + base, low byte = lo
            wa = ((((c & 8) << 12) | (((c & 7) + base) << 8)) | la).to(tl.uint16).to(tl.bfloat16, bitcast=True)
            wb = ((((c & 0x80) << 8) | ((((c >> 4) & 7) + base) << 8)) | lb).to(tl.uint16).to(tl.bfloat16,
                                                                                            bitcast=True)
            if F32DOT:  # the interpreter's tl.dot reads bf16 as raw integers
                acc = tl.dot(wa.to(tl.float32), xa.to(tl.float32), acc)
                acc = tl.dot(wb.to(tl.float32), xb.to(tl.float32), acc)
            else:
                acc = tl.dot(wa, xa, acc)
                acc = tl.dot(wb, xb, acc)
    if HAS_EXC:
        acc = _exc_add(acc, er, ed, rn)
        for es in range(e0 + EXC, e1, EXC):
            er, ed = _exc_chunk(eidx_ptr, ehi_ptr, lo_e, x_ptr, es, e1, rml, mmask, stride_xm, base, K, stride_lo,
                                EXC)
            acc = _exc_add(acc, er, ed, rn)
    tl.store(out_ptr + rml[None, :] * N + rn[:, None], acc.to(tl.bfloat16), mask=mmask[None, :] & (rn < N)[:, None])


# ids: int [S] (experts 0..E-1) -> rows: int32 [NB * block_m] (row indices, S = padding), bexp: int32 [NB]
def align(ids: torch.Tensor, e: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows sorted by expert (stable) in blocks of ``block_m``, each expert's run padded with S,
    and each block's expert (-1: no rows); NB = ``max_blocks``. One launch, no host sync."""
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids must be a 1-D int32 or int64 tensor, got {ids.dtype}{list(ids.shape)}")
    if e < 1 or block_m < 1:
        raise ValueError(f"align needs at least one expert and block_m >= 1, got {e} and {block_m}")
    s = ids.shape[0]
    nb = max_blocks(s, e, block_m)
    rows = torch.empty(nb * block_m, dtype=torch.int32, device=ids.device)
    bexp = torch.empty(nb, dtype=torch.int32, device=ids.device)
    if s:
        _align_kernel[(e + 1,)](ids, rows, bexp, s, e, nb, BM=block_m, EP=max(32, triton.next_power_of_2(e)),
                                CH=_CHUNK, num_warps=4)
    return rows, bexp


# x2: bf16 [S, K]; ids: int [S]; packed: fixed12 experts [E, N, K]; out: bf16 [S, N] (written) -> out
def launch(x2: torch.Tensor, ids: torch.Tensor, p: PackedExperts, cfg: ExpertsMmaConfig,
           out: torch.Tensor) -> torch.Tensor:
    """Row ``s`` of ``x2`` times expert ``ids[s]``'s matrix transposed, into ``out``; no host sync."""
    s, k = x2.shape
    e, n, _ = p.shape
    a = p.arrays
    kp = a["lo"].shape[1]
    if x2.dtype != torch.bfloat16 or x2.stride(1) != 1:
        raise ValueError(f"x must be bf16 with contiguous rows, got {x2.dtype} with strides {x2.stride()}")
    if ids.shape != (s,) or ids.dtype not in (torch.int32, torch.int64) or ids.device != x2.device \
            or not ids.is_contiguous():  # read as one array
        raise ValueError(f"ids must be contiguous int32 or int64 [{s}] on {x2.device}, got "
                         f"{ids.dtype}{list(ids.shape)} on {ids.device} (strides {ids.stride()})")
    if out.shape != (s, n) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [{s}, {n}] tensor, got {out.dtype}{list(out.shape)}")
    if not 1 <= s <= MAX_ROWS:
        raise ValueError(f"x has {s} rows; the grouped experts MMA takes 1 to {MAX_ROWS} a launch")
    C.check_size("the experts' fixed12 'lo' plane", e * n * kp)
    C.check_size("out", s * n)
    prep = prepare(p)
    rows, bexp = align(ids, e, cfg.block_m)
    nb = bexp.shape[0]
    g = cfg.block_k // 64
    while (kp // 64) % g:  # whole steps only: no step reads past the rows' padding
        g //= 2
    _mma_kernel[(nb, triton.cdiv(n, cfg.block_n))](
        x2, rows, bexp, a["code"], a["lo"], a["base"], prep.exc.rowptr, a["exc_idx"], a["exc_hi"], out,
        s, n, k, kp, x2.stride(0), kp // 2, kp,
        BASE=-1 if prep.base is None else prep.base, BM=cfg.block_m, BN=cfg.block_n, G=g, EVEN=k == kp,
        HAS_EXC=prep.exc.nexc > 0, F32DOT=C.interpreting(), EXC=EXC, num_warps=cfg.warps, num_stages=cfg.stages)
    return out


class ExpertsMmaKernel(ExpertsKernel):
    """The grouped tensor-core product over packed fixed12 experts: up to ``MAX_ROWS`` rows, any CUDA
    GPU (and the interpreter); no host sync (CUDA graphs).

    Example (needs a CUDA GPU)::

        from glyd.kernels.fixed12.experts_mma import ExpertsMmaConfig
        y = glyd.kernels.experts.linear(x, ids, packed, ExpertsMmaConfig(block_n=128))
    """

    experts = True
    name = "fixed12_experts_mma"
    layout = "fixed12"
    Config = ExpertsMmaConfig

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        most = MAX_ROWS if config is None else getattr(config, "max_rows", MAX_ROWS)
        if ok and problem.m > most:
            return False, f"{cls.name} takes at most {most} rows a launch here, got {problem.m}"
        if ok and device.type == "cuda" and not device.interpreting and (device.capability or (0, 0)) < (8, 0):
            return False, f"{cls.name} needs bf16 tensor cores (sm_80 or later), got sm_{device.capability}"
        return ok, why

    @classmethod
    def launch(cls, x2, ids, packed, config, out):
        return launch(x2, ids, packed, config, out)

    @classmethod
    def prepare(cls, packed, config=None):
        prepare(packed)  # the same for every config
