"""The exceptions of a ``fixed12`` matrix (weights outside its 16-exponent window): the per-matrix
index built once (``prepare``) and the pass that adds their corrections to fp32 partials.

A kernel whose exceptions are not added inside its tiles writes fp32 partials; ``add_exceptions``
adds ``x[col] * (true - placeholder)`` for every exception (``exceptions_on_side_stream`` runs that
pass on a second CUDA stream beside the tile kernel, a parallel branch in a CUDA graph).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from glyd.codec import fixed12 as _codec
from glyd.codec.packed import Packed
from glyd.errors import CorruptError, UnsupportedError
from glyd.kernels import _common as C
from glyd.kernels import _plan
from glyd.kernels._interp import isolated
from glyd.kernels.fixed12.words import exc_chunk


class Prepared:
    """Per-matrix data derived once from the packed arrays (host syncs allowed here, never in linear)."""

    def __init__(self, p: Packed) -> None:
        n, k = p.shape
        a = p.arrays
        check_readable(p)
        idx = a["exc_idx"]
        self.nexc = int(idx.numel())
        dev = idx.device
        self.base = int(a["base"].reshape(-1)[0])  # the mma kernel compiles it in (one sync, here)
        if self.nexc:
            idx64 = idx.to(torch.int64)
            if int(idx64.min()) < 0 or int(idx64.max()) >= n * k:
                raise C.FormatError("fixed12 'exc_idx' holds indices outside the matrix")
            if bool((idx64[1:] <= idx64[:-1]).any()):  # the row pointers below find rows by bisection
                raise CorruptError("fixed12 'exc_idx' is not strictly increasing (a damaged or crafted file)")
            bounds = torch.arange(n + 1, device=dev, dtype=torch.int64) * k
            self.rowptr = torch.searchsorted(idx64, bounds).to(torch.int32)
            kp = a["lo"].shape[1]
            lo = a["lo"].reshape(-1)[(idx64 // k) * kp + idx64 % k].to(torch.int32)
            self.pos = idx64
            self.vals = ((a["exc_hi"].to(torch.int32) << 8) | lo).to(torch.int16)
        else:
            self.rowptr = torch.zeros(n + 1, dtype=torch.int32, device=dev)
            self.pos = self.vals = None
        # host copy for the chunked long-prompt path (which exceptions fall in a row range)
        self.rowptr_host = self.rowptr.cpu().tolist() if self.nexc else None


def check_readable(p) -> None:
    """What the kernels take of a fixed12 ``Packed`` or ``PackedExperts`` beyond its dtypes and shapes:
    contiguous arrays (each pointer is read as one dense array; ``FormatError`` naming the array), ``lo`` and
    ``code`` at a storage offset divisible by 4 (read as 32-bit words) and
    zero padding (the fused products multiply it by x's zeros: 0 * inf is NaN; ``CorruptError``)."""
    for name in _codec.ARRAYS:
        if not p.arrays[name].is_contiguous():
            raise C.FormatError(f"fixed12 array '{name}' must be contiguous (the kernels read it as one array), "
                                f"got strides {p.arrays[name].stride()}")
    for name in ("lo", "code"):  # the products' launchers view these as int32 words: torch wants the offset aligned
        if p.arrays[name].storage_offset() % 4:
            raise C.FormatError(f"fixed12 array '{name}' must start at a 4-byte aligned place of its storage (the "
                                f"kernels read it as 32-bit words), got storage offset {p.arrays[name].storage_offset()}")
    _codec.check_padding(p)


def prepare(p: Packed) -> Prepared:
    """The exception index of ``p`` (built once a matrix, with host syncs; again after an in-place change)."""
    if p.layout != _codec.NAME:
        raise ValueError(f"expected a fixed12 packed matrix, got layout {p.layout!r}")
    return C.cached(p.arrays["exc_idx"], lambda: _outside_a_capture(p) and Prepared(p), p.arrays.values(),
                    C.packed_tag(p))


def _outside_a_capture(p: Packed) -> bool:
    # Prepared reads the exception indices on the host: impossible while a CUDA graph is captured
    # (CUDA's own error names the sync, not the cause)
    if p.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise UnsupportedError(f"the exception index of this {p.shape[0]}x{p.shape[1]} fixed12 matrix is built on "
                               "the host: run its product or lookup once outside the CUDA graph capture (a warm-up "
                               "step) first")
    return True


EXC_ROWS = 4  # weight rows an exception program corrects (swept: 4 against 16 and 64)
EXC_WARPS = 4
EXC_CHUNK = 16  # exceptions loaded at once (their loads overlap instead of queueing one by one)


@isolated
@triton.jit
def _exception_kernel(part_ptr, x_ptr, rowptr_ptr, eidx_ptr, ehi_ptr, lo_ptr, base_ptr, M, N, K, stride_lo, stride_xm,
                      BM_: tl.constexpr, BN_: tl.constexpr, E: tl.constexpr, ADD: tl.constexpr,
                      XT: tl.constexpr = False):
    # part[0][rows, cols] += (true - decoded weight) * x summed over the exceptions of BN_ weight
    # rows, E exceptions a step: a row of a long matrix (down: K 18944) holds ~1.4 of them in
    # random weights, and one by one each costs two dependent memory round trips. XT: x_ptr is x
    # transposed ([K, M], contiguous): an exception's BM_ x values are one contiguous read.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rn = pid_n * BN_ + tl.arange(0, BN_)
    rm = pid_m * BM_ + tl.arange(0, BM_)
    mmask = rm < M
    base = tl.load(base_ptr).to(tl.uint32)
    e0 = tl.load(rowptr_ptr + pid_n * BN_)
    e1 = tl.load(rowptr_ptr + tl.minimum(pid_n * BN_ + BN_, N))
    delta = tl.zeros([BN_, BM_], dtype=tl.float32)
    for eb in range(e0, e1, E):
        e = eb + tl.arange(0, E)
        em = e < e1
        r, c, tv, pv = exc_chunk(eidx_ptr, ehi_ptr, lo_ptr, base, K, stride_lo, e, em)
        if XT:
            xp = x_ptr + c[:, None] * M + rm[None, :]
        else:
            xp = x_ptr + rm[None, :] * stride_xm + c[:, None]
        xv = tl.load(xp, mask=em[:, None] & mmask[None, :], other=0.0).to(tl.float32)  # [E, BM_]
        d = xv * tv[:, None] - xv * pv[:, None]
        hit = (rn.to(tl.int64)[:, None] == r[None, :]) & em[None, :]  # [BN_, E]
        delta += tl.sum(tl.where(hit[:, :, None], d[None, :, :], 0.0), axis=1)
    ptr = part_ptr + rm[None, :] * N + rn[:, None]
    omask = mmask[None, :] & (rn < N)[:, None]
    if ADD:
        delta += tl.load(ptr, mask=omask, other=0.0)
    tl.store(ptr, delta, mask=omask)  # ADD False: a partial of its own (zeros where no exception)


# part: fp32 [>= 1, M, N] (part[0] corrected in place, or written when add is False); x: bf16 [M, K];
# packed fixed12 [N, K]
def add_exceptions(part: torch.Tensor, x2: torch.Tensor, p, prep, add: bool = True) -> None:
    check_part(part, *x2.shape[:1], p.shape[0])
    launch = exceptions_launch(x2, p, prep, add)
    if launch is not None:
        launch(part, x2, *(p.arrays[a] for a in _codec.ARRAYS))


def check_part(part: torch.Tensor, m: int, n: int) -> None:
    if part.dtype != torch.float32 or part.dim() != 3 or tuple(part.shape[1:]) != (m, n) or not part.is_contiguous():
        raise ValueError(f"part must be contiguous float32 [splits, {m}, {n}], got {part.dtype} {tuple(part.shape)}")


# x: bf16 [M, K] (its shape and strides); packed fixed12 [N, K] -> launch(part, x2, *arrays) or None (nothing to add);
# xt: launch(part, xt, *arrays) with xt x transposed, bf16 [K, M] contiguous
def exceptions_launch(x2: torch.Tensor, p, prep, add: bool = True, xt: bool = False, bm: int = 16):
    """``add_exceptions`` as a ``glyd.kernels._plan.Launch`` (``arrays``: fixed12's, in its order); ``xt``: it
    reads x transposed (a column's rows contiguous), ``bm`` x rows a program (a power of two, 16-256)."""
    m, k = x2.shape
    n = p.shape[0]
    if not (prep.nexc or not add):
        return None
    if bm not in (16, 32, 64, 128, 256):
        raise ValueError(f"the exception pass takes 16-256 x rows a program (a power of two), got {bm}")
    part, x = _plan.slots(2)
    lo, _code, base, eidx, ehi = _plan.slots(5, 2, fixed=True)
    grid = (triton.cdiv(n, EXC_ROWS), triton.cdiv(m, bm))
    return _plan.Launch(_exception_kernel, grid, (part, x, prep.rowptr, eidx, ehi, lo, base, m, n, k,
                                                  p.arrays["lo"].shape[1], m if xt else x2.stride(0)),
                        dict(BM_=bm, BN_=EXC_ROWS, E=EXC_CHUNK, ADD=add, XT=xt, num_warps=EXC_WARPS))


@functools.lru_cache(maxsize=None)
def _side_stream(device: torch.device) -> "torch.cuda.Stream":
    return torch.cuda.Stream(device)


# own: fp32 [1, M, N] (written: the corrections alone) -> join(), to call after the tile kernel
def exceptions_on_side_stream(own: torch.Tensor, x2: torch.Tensor, p, prep):
    check_part(own, x2.shape[0], p.shape[0])
    side = SidePass(x2, p, prep)
    cur = side.begin(own, x2, *(p.arrays[a] for a in _codec.ARRAYS))
    return lambda: side.join(cur)


class SidePass:
    """The exceptions' pass (written to a partial of its own) on a second CUDA stream beside the
    tile kernel: ``cur = begin(own, x2, *arrays)`` before the tile kernel, ``join(cur)`` after it."""

    def __init__(self, x2: torch.Tensor, p, prep) -> None:
        self.device = x2.device
        self.side = _side_stream(x2.device)
        self.launch = exceptions_launch(x2, p, prep, add=False)

    def begin(self, *vals):
        cur = torch.cuda.current_stream(self.device)
        self.side.wait_stream(cur)  # x and the partial buffer are ready
        self.launch(*vals, stream=self.side)
        return cur

    def join(self, cur) -> None:
        # everything after on this stream, and any reuse of the buffers it frees, waits for the pass
        cur.wait_stream(self.side)
