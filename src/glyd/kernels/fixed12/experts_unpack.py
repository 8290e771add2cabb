"""All experts of a packed ``fixed12`` experts tensor unpacked to bf16 ``[E, N, K]`` in one launch (the
prompt path of ``experts_unpack_grouped``: the unpacked experts then go to ``torch._grouped_mm``).

The experts' planes are concatenated along their rows (``glyd.codec.experts``): with K == Kp they
are one stream of 64-weight groups, as one matrix's are for the flat unpack (``unpack.py``), except
that each expert has its own exponent ``base`` (a program's groups may straddle two experts, so the
base is loaded a group). Given the rows each expert was routed (``offs``, cumulative, on the device),
the groups of experts that no row chose are skipped: nothing read, nothing written (their scratch
rows keep stale bits that ``_grouped_mm`` never reads, their groups being empty), with no host sync.
The exceptions are written by the program whose groups hold them (``_common.patch_exceptions``), from
a per-tile list over all experts built once a packed experts tensor and tiling (``prepare_range``,
host syncs: an eager call before a CUDA graph capture builds them; a capture that would build them is
refused by name). The launch is a ``glyd.kernels._plan.Launch`` kept with the packed experts' plans
(``_plan.keep``, per range and tiling): from its third call it skips Triton's binder.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glyd.codec import fixed12 as _codec
from glyd.codec.experts import PackedExperts, array_names
from glyd.errors import UnsupportedError
from glyd.kernels import _common as C
from glyd.kernels import _plan
from glyd.kernels._interp import isolated
from glyd.kernels.fixed12.exceptions import check_readable


class Prepared:
    """Per packed experts tensor: every exception's flat position in ``[E, N, K]`` (int64) and its true
    16-bit word (int16), in expert order."""

    def __init__(self, p: PackedExperts) -> None:
        e, n, k = p.shape
        a = p.arrays
        check_readable(p)
        idx = a["exc_idx"].to(torch.int64)
        dev = idx.device
        self.nexc = int(idx.numel())
        self.pos = self.vals = None
        if not self.nexc:
            return
        starts = p.starts[_codec.ARRAYS.index("exc_idx")]
        owner = torch.repeat_interleave(torch.arange(e, device=dev),
                                        torch.tensor([starts[i + 1] - starts[i] for i in range(e)], device=dev))
        if int(idx.min()) < 0 or int(idx.max()) >= n * k:
            raise C.FormatError("fixed12 'exc_idx' holds indices outside an expert's matrix")
        kp = a["lo"].shape[1]
        lo = a["lo"].reshape(-1)[(owner * n + idx // k) * kp + idx % k].to(torch.int32)
        self.pos = owner * (n * k) + idx  # ascending: each expert's list is sorted, experts in order
        self.vals = ((a["exc_hi"].to(torch.int32) << 8) | lo).to(torch.int16)


def prepare(p: PackedExperts) -> Prepared:
    """The exceptions of ``p`` over all its experts (once a packed experts tensor; again after an
    in-place change). Cached on ``exc_hi``: ``exc_idx`` keys the experts GEMV's own index."""
    if p.layout != _codec.NAME:
        raise ValueError(f"expected fixed12 experts, got layout {p.layout!r}")
    return C.cached(p.arrays["exc_hi"], lambda: _outside_a_capture(p) and Prepared(p), p.arrays.values(),
                    C.packed_tag(p))


def _outside_a_capture(p: PackedExperts) -> bool:
    # the exception lists are built on the host: impossible while a CUDA graph is being captured
    if p.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise UnsupportedError(f"the experts unpack's exception tiles of these {list(p.shape)} experts are built on "
                               "the host: run the product once outside the CUDA graph capture (a warm-up step) first")
    return True


@isolated
@triton.jit
def _unpack_experts_kernel(code_ptr, lo_ptr, base_ptr, offs_ptr, out_ptr, tile_ptr, epos_ptr, eval_ptr, NG, GPE,
                           BG: tl.constexpr, SKIP: tl.constexpr, HAS_EXC: tl.constexpr, E: tl.constexpr):
    # BG 64-weight groups of the [E*N, K] stream (GPE groups an expert), each decoded with its
    # expert's base; groups of experts with no rows (offs) masked off when SKIP. Then the
    # exceptions among the program's 64 BG weights over them (those of skipped experts land in
    # rows nobody reads).
    g32 = tl.program_id(0) * BG + tl.arange(0, BG)[:, None]
    g = g32.to(tl.int64)
    j = tl.arange(0, 32)[None, :]
    m = g32 < NG
    ex = g32 // GPE  # 32-bit: NG * 64 < 2**31 (check_size), a 64-bit division costs ~100 instructions
    if SKIP:
        hi = tl.load(offs_ptr + ex, mask=m, other=0)
        lo = tl.load(offs_ptr + ex - 1, mask=m & (ex > 0), other=0)
        m = m & (hi > lo)
    base = tl.load(base_ptr + ex, mask=m, other=0).to(tl.int32)
    c = tl.load(code_ptr + g * 32 + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int32)
    la = tl.load(lo_ptr + g * 64 + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int32)
    lb = tl.load(lo_ptr + g * 64 + 32 + j, mask=m, other=0, eviction_policy="evict_first").to(tl.int32)
    na = c & 0xF
    nb = c >> 4
    va = (((na & 8) << 4) | ((na & 7) + base)) << 8 | la
    vb = (((nb & 8) << 4) | ((nb & 7) + base)) << 8 | lb
    tl.store(out_ptr + g * 64 + j, va.to(tl.int16), mask=m)
    tl.store(out_ptr + g * 64 + 32 + j, vb.to(tl.int16), mask=m)
    if HAS_EXC:
        C.patch_exceptions(out_ptr, tile_ptr, epos_ptr, eval_ptr, tl.program_id(0), 0, NG * 64, E)


def _tiles(p: PackedExperts, prep: Prepared, first: int, count: int, span: int, ntiles: int):
    """The exception tiles of experts ``first .. first + count`` (positions from expert ``first``'s
    first weight), built once a range and tiling, or None where they hold no exception."""
    e, n, k = p.shape
    starts = p.starts[_codec.ARRAYS.index("exc_idx")]
    i0, i1 = starts[first], starts[first + count]
    if i1 == i0:
        return None
    key = ("experts", first, count, span, ntiles)
    kept = prep.__dict__.setdefault("_exception_tiles", {})
    if key not in kept and _outside_a_capture(p):  # exception_tiles keeps it there too: built once, its arguments too
        pos = prep.pos[i0:i1] - first * n * k
        C.exception_tiles(prep, key, pos, prep.vals[i0:i1], pos // span, ntiles)
    return kept[key]


def prepare_range(p: PackedExperts, first: int, count: int, groups: int):
    """What the unpack of experts ``first .. first + count`` in programs of ``groups`` groups needs
    (the exception tiles, or None), built on the host once: call it before a CUDA graph capture."""
    e, n, k = p.shape
    prep = prepare(p)
    ntiles = triton.cdiv(count * n * p.arrays["lo"].shape[1] // 64, groups)
    return _tiles(p, prep, first, count, groups * 64, ntiles) if prep.nexc and ntiles else None


# packed: fixed12 experts [E, N, K], K == Kp (a multiple of 64); out: bf16 [C, N, K] (written, contiguous):
# experts first .. first + C; offs: int32 [C] rows routed to those experts, cumulative (None: all) -> out
def unpack_experts(p: PackedExperts, out: torch.Tensor, offs: torch.Tensor | None = None, first: int = 0,
                   groups: int = 16, warps: int = 2) -> torch.Tensor:
    """Experts ``first ..`` of ``p`` into ``out`` bit for bit, one launch; with ``offs`` only those with rows."""
    e, n, k = p.shape
    a = p.arrays
    kp = a["lo"].shape[1]
    c = out.shape[0] if out.dim() == 3 else -1
    if p.layout != _codec.NAME:
        raise ValueError(f"expected fixed12 experts, got layout {p.layout!r}")
    if k != kp:
        raise ValueError(f"the one-launch experts unpack needs K a multiple of 64 (no padded columns), got K = {k}")
    if not 0 <= first < first + c <= e or tuple(out.shape[1:]) != (n, k) or out.dtype != torch.bfloat16 \
            or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 [C, {n}, {k}] tensor of experts {first} .. {first} + C "
                         f"<= {e}, got {out.dtype}{list(out.shape)}")
    if out.device != a["lo"].device:
        raise ValueError(f"out is on {out.device}, the packed experts on {a['lo'].device}")
    if offs is not None and (offs.shape != (c,) or offs.dtype != torch.int32 or offs.device != out.device
                             or not offs.is_contiguous()):
        raise ValueError(f"offs must be a contiguous int32 [{c}] on {out.device}, got {offs.dtype}{list(offs.shape)} "
                         f"on {offs.device} (strides {offs.stride()})")
    C.check_size("the experts' fixed12 'lo' planes", c * n * kp)
    if not c * n * kp:
        return out
    launch = kept_launch(p, first, c, groups, warps, offs is not None)
    if first:
        rows = slice(first * n, (first + c) * n)
        launch(out, out if offs is None else offs, a["code"][rows], a["lo"][rows], a["base"][first:first + c])
    else:  # the planes from expert 0: the arrays themselves (their addresses), as a kept launch takes them
        launch(out, out if offs is None else offs, a["code"], a["lo"], a["base"])
    return out


def kept_launch(p: PackedExperts, first: int, c: int, groups: int, warps: int, skip: bool) -> _plan.Launch:
    """``unpack_experts_launch``, kept with ``p``'s plans (``_plan.keep``; plans off: made each call)."""
    if not _plan.enabled():
        return unpack_experts_launch(p, first, c, groups, warps, skip)
    arrays = [p.arrays[name] for name in array_names(p.layout)]
    key = ("experts_unpack", first, c, groups, warps, skip)
    launch = _plan.kept(p.layout, p.shape, arrays, p.version, key)
    if launch is None:
        launch = unpack_experts_launch(p, first, c, groups, warps, skip)
        _plan.keep(p.layout, p.shape, arrays, p.version, key, launch)
    return launch


# packed: fixed12 experts [E, N, K], K == Kp -> launch(out, offs or out, code, lo, base): out bf16 [C, N, K];
# offs int32 [C] (skip) or out; the planes of experts first .. first + C (views from their first row)
def unpack_experts_launch(p: PackedExperts, first: int, c: int, groups: int, warps: int, skip: bool) -> _plan.Launch:
    """``unpack_experts``'s one launch as a ``glyd.kernels._plan.Launch``, its exception tiles built
    (host syncs, once a range and tiling: outside a CUDA graph capture); the tensors per call."""
    n, kp = p.shape[1], p.arrays["lo"].shape[1]
    ng = c * n * kp // 64
    tiles = prepare_range(p, first, c, groups)
    out, offs = _plan.slots(2)
    code, lo, base = _plan.slots(3, 2, fixed=True)
    return _plan.Launch(_unpack_experts_kernel, (triton.cdiv(ng, groups),),
                        (code, lo, base, offs, out.view(torch.int16), *(tiles or (out,) * 3), ng, n * kp // 64),
                        dict(BG=groups, SKIP=skip, HAS_EXC=tiles is not None, E=C.PATCH_CHUNK, num_warps=warps))
