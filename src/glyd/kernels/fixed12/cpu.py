"""The fixed12 CPU kernels (C, ``glyd/kernels/fixed12/_cpu.c``) and their thin launchers.

The pure-torch twin multiplies by unpacking the whole matrix in several numpy passes, then calling
``F.linear``: generating on a CPU took 2.87x bf16's time (benchmarks/RESULTS.md, CPU generation).
These kernels read the packed planes once:

* ``unpack``: rows of the matrix as bf16, bit for bit (one pass, AVX2 where the CPU has it);
* ``linear``: ``x @ W.T (+ bias)`` for a few rows of ``x`` (a decode step): each weight row decoded
  once (AVX2: 64 weights at a time into registers, the row's exceptions added after as corrections;
  the portable loops: into a one-row buffer, patched), multiplied with every row of ``x`` in fp32,
  rounded once to ``x``'s dtype. Sums run in another order than bf16's ``F.linear`` (as the
  GPU kernels' do): use ``exact=True`` modules for bf16's bits.
* more rows of ``x`` (a prompt): row blocks of the matrix unpacked into one reused bf16 buffer of
  ``CHUNK_WEIGHTS`` weights, each multiplied by ``F.linear`` (torch's own GEMM): nothing is cached,
  the weights stay packed in memory.

The extension is optional (built by ``setup.py`` where a C compiler is found); ``available()`` says
whether it is here, and the callers (``glyd.ops.backends.cpu``) fall back to the twin when not.

>>> import torch, glyd
>>> from glyd.kernels.fixed12 import cpu as cpu_fixed12
>>> w = (torch.randn(64, 96) * 0.02).to(torch.bfloat16)
>>> p = glyd.pack(w, "fixed12")
>>> if cpu_fixed12.available():
...     assert torch.equal(cpu_fixed12.unpack(p).view(torch.int16), w.view(torch.int16))
"""

from __future__ import annotations

import functools
import importlib
import logging
import weakref

import torch
import torch.nn.functional as F

from glyd.codec import fixed12 as _codec
from glyd.codec.packed import Packed
from glyd.errors import CorruptError

log = logging.getLogger(__name__)

__all__ = ["available", "simd", "unpack", "rows", "linear", "MAX_FUSED_ROWS", "CHUNK_WEIGHTS"]

#: Rows of ``x`` up to which ``linear`` decodes each weight row once and dots it with every row
#: (above: row blocks through torch's GEMM). The fused product's time grows by about a third of its
#: one-row time a row; on the development CPU (AMD EPYC, AVX2, 2 cores, 2026-12-04; a 1536 x 576
#: matrix out of cache) it took 110 / 175 / 238 / 318 us at 1 / 4 / 6 / 8 rows against 406 / 274 /
#: 280 / 293 for the row blocks: the blocks win from 7 rows (a 38-token prompt: 1534 against 369 us).
MAX_FUSED_ROWS = 6
#: Weights of the bf16 buffer a prompt's product unpacks into, a block of rows at a time (2 MiB).
CHUNK_WEIGHTS = 1 << 20

_ERRORS = {1: "its base is out of range 0..120", 2: "exc_idx holds indices outside the matrix",
           3: "exc_idx is not strictly increasing", 4: "out of memory for one row's buffer"}
_ERR_INDEX = 5


@functools.lru_cache(maxsize=1)
def _ext():
    try:
        return importlib.import_module("glyd.kernels.fixed12._cpu")
    except ImportError as exc:
        log.info("glyd's C kernels are not built (%s): fixed12 products on the CPU use the pure-torch twin", exc)
        return None


def available() -> bool:
    """True when the compiled kernels import (``pip install`` builds them where a C compiler is)."""
    return _ext() is not None


def simd() -> str | None:
    """``"avx2"``, ``"portable"`` (plain C loops), or ``None`` when the kernels are not built."""
    ext = _ext()
    return ext.simd() if ext is not None else None


#: id(lo) -> (key of the arrays, the matrix as C takes it, the ids watched): built and checked once
#: for the same tensors at the same addresses, unchanged since (the entry dies with any of them).
_MATRICES: dict[int, tuple[tuple, tuple, set]] = {}
_NAMES = ("lo", "code", "base", "exc_idx", "exc_hi")


def _raise(err: int) -> None:
    if err:
        raise CorruptError(f"fixed12 matrix: {_ERRORS.get(err, f'error {err}')}")


def _matrix(p: Packed) -> tuple:
    """The matrix as the C functions take it, after the checks that keep every access in bounds
    (once for the same arrays; again after any in-place change)."""
    if p.layout != _codec.NAME:
        raise ValueError(f"expected a fixed12 packed matrix, got layout {p.layout!r}")
    arrays = [p.arrays[name] for name in _NAMES]
    key = (p.shape, *((id(t), t._version, t.data_ptr()) for t in arrays))
    first = id(arrays[0])
    hit = _MATRICES.get(first)
    if hit is not None and hit[0] == key:
        return hit[1]
    t = _describe(p)
    _raise(_ext().check(t))
    _codec.check_padding(p)  # linear multiplies the padding by x's zeros (0 * inf: NaN)
    watched = set() if hit is None else hit[2]
    _MATRICES[first] = (key, t, watched)
    # any array's death drops the entry (it holds addresses C reads): CPython gives a freed array's id
    # to the next tensor made (version 0), which would match the key
    for a in arrays:
        if id(a) not in watched:
            watched.add(id(a))
            weakref.finalize(a, _MATRICES.pop, first, None)
    return t


def _describe(p: Packed) -> tuple:
    a = p.arrays
    for name in _NAMES:
        t = a[name]
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"fixed12 array {name!r} must be a contiguous CPU tensor (it is on {t.device})")
    n, k = p.shape
    lo, code, base, idx, hi = (a[name] for name in _NAMES)
    kp = _codec.padded_cols(k)
    # Packed checked dtypes and shapes; again here, because pointers go to C.
    if (lo.dtype, code.dtype, base.dtype, hi.dtype) != (torch.uint8,) * 4 or tuple(lo.shape) != (n, kp) \
            or tuple(code.shape) != (n, kp // 2) or base.numel() != 1 or idx.dtype not in (torch.int32, torch.int64) \
            or idx.dim() != 1 or tuple(hi.shape) != tuple(idx.shape):
        raise ValueError(f"fixed12 arrays do not match a {n}x{k} matrix")
    return (lo.data_ptr(), code.data_ptr(), idx.data_ptr(), int(idx.dtype == torch.int64), hi.data_ptr(),
            idx.numel(), n, k, kp, int(base.reshape(-1)[0]))


# p: [N, K] fixed12 -> bf16 [N, K] (rows r0..r1 when given: [r1 - r0, K]), bit for bit
def unpack(p: Packed, r0: int = 0, r1: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``r0..r1`` of ``p`` as bf16, bit for bit, into ``out`` (a contiguous bf16 CPU tensor of
    at least that many weights) or a new tensor."""
    ext = _ext()
    if ext is None:
        raise RuntimeError("glyd's C kernels are not built (see glyd.kernels.fixed12.cpu.available())")
    m = _matrix(p)
    n, k = p.shape
    r1 = n if r1 is None else r1
    if not 0 <= r0 <= r1 <= n:
        raise ValueError(f"rows {r0}..{r1} are not inside the matrix's {n}")
    if out is None:
        out = torch.empty(r1 - r0, k, dtype=torch.bfloat16)
    elif out.dtype != torch.bfloat16 or out.device.type != "cpu" or not out.is_contiguous() \
            or out.numel() < (r1 - r0) * k:
        raise ValueError(f"out must be a contiguous bf16 CPU tensor of >= {(r1 - r0) * k} weights")
    _raise(ext.unpack(m, r0, r1, out.data_ptr()))
    return out


# p: [N, K] fixed12, index: any shape of int indices in -N..N-1 -> bf16 [*index.shape, K], bit for bit
def rows(p: Packed, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` of ``p`` (an embedding lookup; negative indices count from the end, as torch
    indexing does), decoded one row each, bit for bit."""
    ext = _ext()
    if ext is None:
        raise RuntimeError("glyd's C kernels are not built (see glyd.kernels.fixed12.cpu.available())")
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise IndexError(f"row indices must be integers, got {index.dtype}")
    n, k = p.shape
    flat = index.reshape(-1).to(device="cpu", dtype=torch.int64).contiguous()
    out = torch.empty(flat.numel(), k, dtype=torch.bfloat16)
    err = ext.rows(_matrix(p), flat.data_ptr(), flat.numel(), out.data_ptr())
    if err == _ERR_INDEX:
        bad = flat[(flat < -n) | (flat >= n)][:1].tolist()
        raise IndexError(f"row index {bad[0] if bad else '?'} is out of range for a matrix of {n} rows")
    _raise(err)
    return out.reshape(*index.shape, k)


# x: [..., K] bf16 or fp32 on the CPU, p: [N, K] fixed12, bias: [N] x's dtype or None -> [..., N] x's dtype
def linear(x: torch.Tensor, p: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` from the packed weights (see the module's docstring for the two paths)."""
    ext = _ext()
    if ext is None:
        raise RuntimeError("glyd's C kernels are not built (see glyd.kernels.fixed12.cpu.available())")
    n, k = p.shape
    if x.dtype not in (torch.bfloat16, torch.float32) or x.device.type != "cpu":
        raise TypeError(f"x must be a bf16 or fp32 CPU tensor, got {x.dtype} on {x.device}")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"x has shape {tuple(x.shape)}; the matrix is {n}x{k}: x's last dimension must be {k}")
    if bias is not None and (bias.dtype != x.dtype or tuple(bias.shape) != (n,) or bias.device.type != "cpu"):
        raise ValueError(f"bias must be a CPU tensor of shape ({n},) and x's dtype {x.dtype}, "
                         f"got {bias.dtype} {tuple(bias.shape)}")
    x2 = x.reshape(-1, k)
    rows = x2.shape[0]
    if rows > MAX_FUSED_ROWS:
        return _linear_blocks(x2, p, bias).reshape(*x.shape[:-1], n)
    m = _matrix(p)
    x2 = x2.contiguous()
    b = None if bias is None else bias.contiguous()
    out = torch.empty(rows, n, dtype=x.dtype)
    _raise(ext.linear(m, x2.data_ptr(), rows, 0, n, 0 if b is None else b.data_ptr(), out.data_ptr(),
                      int(x.dtype == torch.bfloat16)))
    return out.reshape(*x.shape[:-1], n)


def _linear_blocks(x2: torch.Tensor, p: Packed, bias: torch.Tensor | None) -> torch.Tensor:
    n, k = p.shape
    step = max(1, CHUNK_WEIGHTS // max(k, 1))
    buf = torch.empty(min(step, n), k, dtype=torch.bfloat16)
    out = torch.empty(x2.shape[0], n, dtype=x2.dtype)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        unpack(p, r0, r1, buf)
        w = buf[: r1 - r0]
        out[:, r0:r1] = F.linear(x2, w.to(x2.dtype), None if bias is None else bias[r0:r1])
    return out
