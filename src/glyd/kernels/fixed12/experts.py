"""The grouped GEMV of packed ``fixed12`` experts: each activation row times the expert it was routed
to, reading only that expert's packed planes (the decode step of a mixture-of-experts block, where a
few tokens pick a few experts each).

One program multiplies one row by a [BN, K] tile of its expert, decoding the group-major word tiles
with the fixed12 GEMV's own helpers (``fixed12_gemv._gm_fma``, ``_words``): the experts' planes are
concatenated along their rows (``glyd.codec.experts``), so expert ``e``'s rows start at ``e * N``.
Its exceptions come through a row pointer over all experts' rows, built once a packed experts tensor
(``prepare``, host syncs; none in the launch, so a decode step can be captured in a CUDA graph).
Rows that share an expert read its tile once each (from L2 when they run together): a tile decoded
once for several rows of one expert is the next step (sorted rows, as the prompt path needs).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from glyd.codec import fixed12 as _codec
from glyd.codec.experts import PackedExperts
from glyd.errors import CorruptError, UnsupportedError
from glyd.kernels import _common as C
from glyd.kernels._fields import flags, ints
from glyd.kernels._interp import isolated
from glyd.kernels.fixed12.exceptions import check_readable
from glyd.kernels.fixed12.words import exception_delta, gm_offsets, gm_planes
from glyd.kernels.experts import ExpertsKernel
from glyd.kernels.fixed12.gemv import _gm_fma

#: Rows of one launch at most (the grid's second dimension).
MAX_ROWS = 65535


@dataclasses.dataclass(frozen=True)
class ExpertsGemvConfig:
    """``bn`` expert rows a program, K steps of ``bk`` (>= 64), ``warps`` a program."""

    bn: int = 16
    bk: int = 256
    warps: int = 4

    def __post_init__(self) -> None:
        C.pow2(self, "bn", "bk")
        ints(self, 1, 16, "warps")
        if self.bk < 64:
            raise ValueError(f"ExpertsGemvConfig.bk must be >= 64, got {self.bk}")
        if self.warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"warps must be 1, 2, 4, 8 or 16, got {self.warps}")


class Prepared:
    """Per packed experts tensor: the exception row pointer over all E*N rows (positions in the
    concatenated exception list, whose indices stay local to each expert)."""

    def __init__(self, p: PackedExperts) -> None:
        e, n, k = p.shape
        a = p.arrays
        check_readable(p)
        dev = a["lo"].device
        idx = a["exc_idx"].to(torch.int64)
        self.nexc = int(idx.numel())
        starts = p.starts[_codec.ARRAYS.index("exc_idx")]
        if self.nexc >= 2**31:
            raise C.FormatError(f"{self.nexc} exceptions: the experts GEMV indexes them with 32-bit offsets")
        if self.nexc:
            owner = torch.repeat_interleave(torch.arange(e, device=dev),
                                            torch.tensor([starts[i + 1] - starts[i] for i in range(e)], device=dev))
            if int(idx.min()) < 0 or int(idx.max()) >= n * k:
                raise C.FormatError("fixed12 'exc_idx' holds indices outside an expert's matrix")
            flat = owner * (n * k) + idx  # each expert's list strictly increasing <=> this one
            if bool((flat[1:] <= flat[:-1]).any()):
                raise CorruptError("fixed12 'exc_idx' of an expert is not strictly increasing (a damaged or crafted "
                                   "file)")
            rows = owner * n + idx // k  # ascending: each expert's list is sorted, experts in order
            bounds = torch.arange(e * n + 1, device=dev, dtype=torch.int64)
            self.rowptr = torch.searchsorted(rows, bounds).to(torch.int32)
        else:
            self.rowptr = torch.zeros(e * n + 1, dtype=torch.int32, device=dev)


def prepare(p: PackedExperts) -> Prepared:
    """The exception row pointer of ``p`` (once a packed experts tensor; again after an in-place change)."""
    if p.layout != "fixed12":
        raise ValueError(f"expected fixed12 experts, got layout {p.layout!r}")
    return C.cached(p.arrays["exc_idx"], lambda: _outside_a_capture(p) and Prepared(p), p.arrays.values(),
                    C.packed_tag(p))


def _outside_a_capture(p: PackedExperts) -> bool:
    # Prepared reads exception indices on the host: impossible while a CUDA graph is being captured
    if p.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise UnsupportedError(f"the experts GEMV's exception index of these {list(p.shape)} experts is built on the host: "
                               "run the product once outside the CUDA graph capture (a warm-up step) first")
    return True


@isolated
@triton.jit
def _experts_gemv_kernel(x_ptr, x32_ptr, ids_ptr, code_ptr, lo_ptr, lo8_ptr, base_ptr, rowptr_ptr, eidx_ptr, ehi_ptr,
                         out_ptr, S, E, N, K, KP, stride_xm, stride_code, stride_lo,
                         BN: tl.constexpr, BK: tl.constexpr, EVEN: tl.constexpr, PRMT: tl.constexpr,
                         HAS_EXC: tl.constexpr):
    # One x row (program 1) times rows pid_n * BN .. of its expert's matrix (program 0).
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    G: tl.constexpr = BK // 64
    ex = tl.load(ids_ptr + pid_m).to(tl.int32)
    ex = tl.minimum(tl.maximum(ex, 0), E - 1)  # never outside the planes (the op checks ids before the launch)
    row0 = ex.to(tl.int64) * N  # the expert's first row in the concatenated planes
    code_e = code_ptr + row0 * stride_code
    lo_e = lo_ptr + row0 * stride_lo
    rn = pid_n * BN + tl.arange(0, BN)
    base = tl.load(base_ptr + ex).to(tl.uint32)
    b4 = base * 0x01010101
    code_off, lo_off, m3 = gm_offsets(rn, N, stride_code, stride_lo, G, EVEN)
    gi = tl.arange(0, G)[:, None, None]
    kx = gi * 64 + tl.arange(0, 8)[None, None, :] * 4
    xoff = pid_m * stride_xm
    x32off = pid_m * (stride_xm // 2)
    acc4 = tl.zeros([G, BN, 8], dtype=tl.float32)
    for kb in range(0, KP, BK):
        cw, la, lb = gm_planes(code_e, lo_e, code_off, lo_off, kb, m3 & (kb + gi * 64 < KP), BK, EVEN)
        acc4 = _gm_fma(acc4, cw, la, lb, b4, x_ptr, x32_ptr, xoff, x32off, pid_m < S, kb + kx, K, 1, EVEN, PRMT)
    acc = tl.sum(tl.sum(acc4, axis=2), axis=0)
    if HAS_EXC:
        acc += exception_delta(rowptr_ptr + row0, eidx_ptr, ehi_ptr, lo8_ptr + row0 * KP, x_ptr + xoff, rn, base,
                               pid_n, N, K, KP, BN, 0, 1)
    tl.store(out_ptr + pid_m * N + rn, acc.to(tl.bfloat16), mask=rn < N)


# x2: bf16 [S, K]; ids: int [S]; packed: fixed12 experts [E, N, K]; out: bf16 [S, N] (written) -> out
def launch(x2: torch.Tensor, ids: torch.Tensor, p: PackedExperts, cfg: ExpertsGemvConfig, out: torch.Tensor) -> torch.Tensor:
    """Row ``s`` of ``x2`` times expert ``ids[s]``'s matrix transposed, into ``out``."""
    s, k = x2.shape
    e, n, _ = p.shape
    a = p.arrays
    kp = a["lo"].shape[1]
    if ids.shape != (s,) or ids.dtype not in (torch.int32, torch.int64) or ids.device != x2.device \
            or not ids.is_contiguous():  # read as one array
        raise ValueError(f"ids must be contiguous int32 or int64 [{s}] on {x2.device}, got "
                         f"{ids.dtype}{list(ids.shape)} on {ids.device} (strides {ids.stride()})")
    if out.shape != (s, n) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [{s}, {n}] tensor, got {out.dtype}{list(out.shape)}")
    if s > MAX_ROWS:
        raise ValueError(f"x has {s} rows; the experts GEMV takes at most {MAX_ROWS} a launch")
    C.check_size("one expert's fixed12 'lo' plane", n * kp)
    prep = prepare(p)
    even = k == kp and kp % cfg.bk == 0 and x2.stride(0) % 2 == 0 and x2.data_ptr() % 4 == 0
    grid = (triton.cdiv(n, cfg.bn), s)
    _experts_gemv_kernel[grid](
        x2, x2.view(torch.int32) if even else x2, ids, a["code"].view(torch.int32), a["lo"].view(torch.int32), a["lo"],
        a["base"], prep.rowptr, a["exc_idx"], a["exc_hi"], out, s, e, n, k, kp, x2.stride(0), kp // 8, kp // 4,
        BN=cfg.bn, BK=cfg.bk, EVEN=even, PRMT=not C.interpreting(), HAS_EXC=prep.nexc > 0, num_warps=cfg.warps,
        num_stages=1)
    return out


class ExpertsGemvKernel(ExpertsKernel):
    """The grouped GEMV over packed fixed12 experts: up to ``MAX_ROWS`` rows, any CUDA GPU (and the interpreter)."""

    experts = True
    name = "fixed12_experts_gemv"
    layout = "fixed12"
    Config = ExpertsGemvConfig

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if ok and problem.m > MAX_ROWS:
            return False, f"{cls.name} takes at most {MAX_ROWS} rows a launch, got {problem.m}"
        return ok, why

    @classmethod
    def launch(cls, x2, ids, packed, config, out):
        return launch(x2, ids, packed, config, out)

    @classmethod
    def prepare(cls, packed, config=None):
        prepare(packed)
