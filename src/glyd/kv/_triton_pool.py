"""Triton kernel that writes tokens into a static kvf12 pool (kernel and thin launcher only).

One program a (sequence, KV head, page the write touches). A page the write fills is packed in
registers straight into its block (``lo``, ``code``, ``base``, ``meta``; its exceptions appended to the
layer's arena at a place an atomic counter hands out); the page that stays partial goes to the raw
page. A decode step is one program a (sequence, head): it writes one row of the raw page, and packs
the page on the step that fills it. ``write_pair_triton`` writes a layer's keys and values in one launch
(a third grid axis picks the side). The pool and the byte layout: ``glyd.kv.pool``, ``glyd.kv.fixed``;
the twin: ``glyd.kv.pool_twin.write_torch`` (the same planes; the arena's order of blocks may differ).

Per 16-channel group the window base is the lowest start of the 8 values of ``exponent >> 1`` that
covers the most values (``glyd.kv.fixed.choose_base``): one histogram of the page's values (128
bins a group), its running sum, and ``win[b] = cum[b + 7] - cum[b - 1]`` by two gathers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from glyd.errors import FormatError
from glyd.kernels._interp import isolated
from glyd.kernels._fields import ints
from glyd.kv.registry import KVKernel


@triton.jit
def _half_words(x_ptr, raw_ptr, xrow, rrow, from_x, from_raw, c0, HD: tl.constexpr, D: tl.constexpr):
    """bf16 words (int32) of channels ``c0 .. c0+HD`` of a page tile: rows from ``x`` or the raw page."""
    cols = c0 + tl.arange(0, HD)[None, :]
    xv = tl.load(x_ptr + xrow[:, None] * D + cols, mask=from_x[:, None], other=0).to(tl.int32) & 0xFFFF
    rv = tl.load(raw_ptr + rrow[:, None] * D + cols, mask=from_raw[:, None], other=0).to(tl.int32) & 0xFFFF
    return tl.where(from_x[:, None], xv, rv)


@triton.jit
def _bases(hi7, P: tl.constexpr, HD: tl.constexpr):
    """Window base of each 16-channel group of a half tile ``hi7 [P, HD]`` -> ``[HD // 16]`` int32."""
    HG: tl.constexpr = HD // 16
    gid = (tl.arange(0, HD) // 16)[None, :] * 128
    slots = tl.reshape(hi7 + gid, [P * HD])
    hist = tl.reshape(tl.histogram(slots, HG * 128), [HG, 128])
    cum = tl.cumsum(hist, 1)
    bb = tl.arange(0, 128)[None, :] + tl.zeros([HG, 128], tl.int32)
    top = tl.gather(cum, tl.minimum(bb + 7, 127), 1)
    below = tl.where(bb > 0, tl.gather(cum, tl.maximum(bb - 1, 0), 1), 0)
    win = tl.where(bb <= 120, top - below, -1)
    return tl.argmax(win, 1, tie_break_left=True).to(tl.int32)


@triton.jit
def _codes(w, hi7, base, HD: tl.constexpr):
    """4-bit codes and the exception flags of a half tile, from its groups' bases."""
    HG: tl.constexpr = HD // 16
    cb = tl.reshape(tl.broadcast_to(base[:, None], [HG, 16]), [HD])
    off = hi7 - cb[None, :]
    inside = (off >= 0) & (off < 8)
    return ((w >> 12) & 8) | tl.where(inside, off, 0), ~inside


@triton.jit
def _pack_page(wa, wb, blk, lo_ptr, code_ptr, base_ptr, meta_ptr, exc_ptr, used_ptr, E,
               P: tl.constexpr, D: tl.constexpr):
    HD: tl.constexpr = D // 2
    HG: tl.constexpr = HD // 16
    rows = tl.arange(0, P)[:, None]
    cols = tl.arange(0, HD)[None, :]
    ha = (wa >> 8) & 0x7F
    hb = (wb >> 8) & 0x7F
    base_a = _bases(ha, P, HD)
    base_b = _bases(hb, P, HD)
    ca, ea = _codes(wa, ha, base_a, HD)
    cb, eb = _codes(wb, hb, base_b, HD)
    lop = lo_ptr + blk * (P * D) + rows * D + cols
    tl.store(lop, (wa & 0xFF).to(tl.uint8))
    tl.store(lop + HD, (wb & 0xFF).to(tl.uint8))
    tl.store(code_ptr + blk * (P * HD) + rows * HD + cols, (ca | (cb << 4)).to(tl.uint8))
    gs = tl.arange(0, HG)
    tl.store(base_ptr + blk * (2 * HG) + gs, base_a.to(tl.uint8))
    tl.store(base_ptr + blk * (2 * HG) + HG + gs, base_b.to(tl.uint8))
    # exceptions in index order (t * D + c): rows before, then this row's half A, then its half B
    ia = ea.to(tl.int32)
    ib = eb.to(tl.int32)
    ra = tl.sum(ia, 1)
    rt = ra + tl.sum(ib, 1)
    before = tl.cumsum(rt, 0) - rt
    n = tl.sum(rt, 0)
    start = tl.atomic_add(used_ptr, n)
    fits = start + n <= E
    rank_a = before[:, None] + tl.cumsum(ia, 1) - ia
    rank_b = before[:, None] + ra[:, None] + tl.cumsum(ib, 1) - ib
    tl.store(exc_ptr + start + rank_a, (rows * D + cols) | (wa << 16), mask=ea & fits)
    tl.store(exc_ptr + start + rank_b, (rows * D + cols + HD) | (wb << 16), mask=eb & fits)
    tl.store(meta_ptr + blk * 2, start)
    tl.store(meta_ptr + blk * 2 + 1, tl.where(fits, n, -1))


@triton.jit
def _write_side(x_ptr, lens_ptr, bidx_ptr, lo_ptr, code_ptr, base_ptr, meta_ptr, exc_ptr, used_ptr, raw_ptr,
                T, J, E, H, P: tl.constexpr, D: tl.constexpr):
    """One program's page of one side: (sequence, head) = program 0, the page the write touches = program 1."""
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    pos0 = tl.load(lens_ptr + b) - T
    j = pos0 // P + tl.program_id(1)
    t = tl.arange(0, P)
    g = j * P + t
    from_x = (g >= pos0) & (g < pos0 + T)
    from_raw = g < pos0
    xrow = pid_bh.to(tl.int64) * T + (g - pos0)
    rrow = pid_bh.to(tl.int64) * P + t
    HD: tl.constexpr = D // 2
    if j * P < pos0 + T:  # the page holds new tokens
        if ((j + 1) * P <= pos0 + T) & (j < J):  # and fills: pack it into its block
            blk = tl.load(bidx_ptr + pid_bh.to(tl.int64) * J + j).to(tl.int64)
            wa = _half_words(x_ptr, raw_ptr, xrow, rrow, from_x, from_raw, 0, HD, D)
            wb = _half_words(x_ptr, raw_ptr, xrow, rrow, from_x, from_raw, HD, HD, D)
            _pack_page(wa, wb, blk, lo_ptr, code_ptr, base_ptr, meta_ptr, exc_ptr, used_ptr, E, P, D)
        else:  # the partial page: its new rows go to the raw page
            cols = tl.arange(0, D)[None, :]
            v = tl.load(x_ptr + xrow[:, None] * D + cols, mask=from_x[:, None], other=0)
            tl.store(raw_ptr + rrow[:, None] * D + cols, v, mask=from_x[:, None])


# Shape-dependent ints are not specialised (no recompile per batch size, prompt length or pool size).
@isolated
@triton.jit(do_not_specialize=["T", "J", "E", "H"])
def _kvf12_write_kernel(x_ptr, lens_ptr, bidx_ptr, lo_ptr, code_ptr, base_ptr, meta_ptr, exc_ptr, used_ptr, raw_ptr,
                        T, J, E, H, P: tl.constexpr, D: tl.constexpr):
    _write_side(x_ptr, lens_ptr, bidx_ptr, lo_ptr, code_ptr, base_ptr, meta_ptr, exc_ptr, used_ptr, raw_ptr,
                T, J, E, H, P, D)


# Both sides in one launch (program 2: 0 keys, 1 values): a layer's write is one kernel, and the two sides'
# pages (each a latency-bound program at a prompt's few pages) run side by side instead of one after the other.
@isolated
@triton.jit(do_not_specialize=["T", "J", "EK", "EV", "H"])
def _kvf12_write_pair_kernel(xk_ptr, xv_ptr, lens_ptr, bidx_ptr,
                             klo, kcode, kbase, kmeta, kexc, kused, kraw,
                             vlo, vcode, vbase, vmeta, vexc, vused, vraw,
                             T, J, EK, EV, H, P: tl.constexpr, D: tl.constexpr):
    if tl.program_id(2) == 0:
        _write_side(xk_ptr, lens_ptr, bidx_ptr, klo, kcode, kbase, kmeta, kexc, kused, kraw, T, J, EK, H, P, D)
    else:
        _write_side(xv_ptr, lens_ptr, bidx_ptr, vlo, vcode, vbase, vmeta, vexc, vused, vraw, T, J, EV, H, P, D)


@dataclass(frozen=True)
class WriteConfig:
    """``num_warps``: warps a program (one page of one head)."""

    num_warps: int = 4

    def __post_init__(self) -> None:
        ints(self, 1, 16, "num_warps")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")


class Kvf12WriteKernel(KVKernel):
    """The pool's page writer: pages of a power of two >= 16 tokens, head dims powers of two >= 32."""

    name = "kvf12_write_triton"
    code = "kvf12"
    op = "write"
    Config = WriteConfig

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if not ok:
            return ok, why
        if device.type != "cuda" and not device.interpreting:
            return False, "needs a CUDA GPU (or Triton's interpreter)"
        if problem.where != "pool":
            return False, "writes static pools only"
        p, d = problem.page, problem.head_dim
        if p & (p - 1) or p < 16 or d & (d - 1) or d < 32:
            return False, f"page {p} (>= 16) and head dim {d} (>= 32) must be powers of two"
        return True, ""

    @classmethod
    def launch(cls, x, lens, block_index, lo, code, base, meta, exc, used, raw, *, config):
        write_triton(x, lens, block_index, lo, code, base, meta, exc, used, raw, num_warps=config.num_warps)

    @classmethod
    def launch_pair(cls, keys, values, lens, block_index, k_planes, v_planes, *, config):
        write_pair_triton(keys, values, lens, block_index, k_planes, v_planes, num_warps=config.num_warps)


def _check_side(x, lens, block_index, lo, code, base, meta, exc, used, raw, side: str = ""):
    """Shapes, dtypes and devices of one side's write (``side``: a prefix for the names in errors)."""
    b, h, t, d = x.shape
    p = lo.shape[1]
    want = {"lo": (lo, torch.uint8, (p, d)), "code": (code, torch.uint8, (p, d // 2)),
            "base": (base, torch.uint8, (d // 16,)), "meta": (meta, torch.int32, (2,)),
            "raw": (raw, torch.bfloat16, (b, h, p, d)), "exc": (exc, torch.int32, None), "used": (used, torch.int32, (1,)),
            "lens": (lens, torch.int32, (b,)), "block_index": (block_index, torch.int32, None)}
    for name, (ten, dtype, shape) in want.items():
        name = side + name if name in ("lo", "code", "base", "meta", "raw", "exc", "used") else name
        if ten.dtype != dtype or not ten.is_contiguous() or ten.device != x.device:
            raise FormatError(f"{name} must be a contiguous {dtype} tensor on {x.device}, got {ten.dtype} on {ten.device}")
        full = tuple(ten.shape[1:]) if name.endswith(("lo", "code", "base", "meta")) else tuple(ten.shape)
        if shape is not None and full != shape:
            raise FormatError(f"{name} has shape {tuple(ten.shape)}, want [..., {', '.join(map(str, shape))}]")
    if x.dtype != torch.bfloat16 or not x.is_contiguous():
        raise FormatError(f"{ {'k.': 'keys', 'v.': 'values'}.get(side, 'x')} must be contiguous bf16 [B, H, T, D], "
                          f"got {x.dtype}")
    if block_index.dim() != 3 or tuple(block_index.shape[:2]) != (b, h):
        raise FormatError(f"block_index has shape {tuple(block_index.shape)}, want [{b}, {h}, J]")


# x [B, H, T, D] bf16; lens [B] int32 (tokens after the write); block_index [B, H, J] int32; lo [NB, P, D],
# code [NB, P, D/2], base [NB, D/16] uint8; meta [NB, 2], exc [E + 1], used [1] int32; raw [B, H, P, D] bf16.
def write_triton(x, lens, block_index, lo, code, base, meta, exc, used, raw, num_warps=4):
    _check_side(x, lens, block_index, lo, code, base, meta, exc, used, raw)
    b, h, t, d = x.shape
    p = lo.shape[1]
    chunks = (t + 2 * p - 2) // p
    _kvf12_write_kernel[(b * h, chunks)](  # bf16 as int16: the words move as bits
        x.view(torch.int16), lens, block_index, lo, code, base, meta, exc, used, raw.view(torch.int16),
        t, block_index.shape[2], exc.numel() - 1, h, P=p, D=d, num_warps=num_warps,
    )


# keys, values [B, H, T, D] bf16 (one head dim); lens, block_index as write_triton; k_planes, v_planes: each side's
# (lo, code, base, meta, exc, used, raw) as write_triton takes them. One launch: grid (B * H, pages, 2 sides).
def write_pair_triton(keys, values, lens, block_index, k_planes, v_planes, num_warps=4):
    if tuple(values.shape) != tuple(keys.shape):
        raise FormatError(f"values of shape {tuple(values.shape)} must match keys' {tuple(keys.shape)} in one launch")
    _check_side(keys, lens, block_index, *k_planes, side="k.")
    _check_side(values, lens, block_index, *v_planes, side="v.")
    if k_planes[0].shape[1] != v_planes[0].shape[1]:
        raise FormatError(f"k.lo pages of {k_planes[0].shape[1]} tokens, v.lo of {v_planes[0].shape[1]}: one page size")
    b, h, t, d = keys.shape
    p = k_planes[0].shape[1]
    chunks = (t + 2 * p - 2) // p
    k7 = (*k_planes[:6], k_planes[6].view(torch.int16))
    v7 = (*v_planes[:6], v_planes[6].view(torch.int16))
    _kvf12_write_pair_kernel[(b * h, chunks, 2)](
        keys.view(torch.int16), values.view(torch.int16), lens, block_index, *k7, *v7,
        t, block_index.shape[2], k_planes[4].numel() - 1, v_planes[4].numel() - 1, h, P=p, D=d, num_warps=num_warps,
    )
