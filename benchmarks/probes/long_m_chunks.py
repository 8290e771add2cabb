"""Issue 38 probe, the pieces: a fixed12 matrix unpacked a chunk at a time into a small reused bf16
buffer (meant to stay in L2) and multiplied by cuBLAS chunk by chunk (``probe_long_m.py`` checks
and times them).

* N-chunks: rows n0:n1 of W (rows are independent): the flat unpack kernel of
  ``glyd.kernels.fixed12.unpack`` launched on the row range of the planes (a view, no copy), the
  chunk's exceptions precomputed once as buffer-local positions (one indexed store a chunk); cuBLAS
  writes ``out[:, n0:n1]`` in place (row stride N is a valid leading dimension: no copy; it is the
  same cuBLAS call as computing ``out.T``'s rows n0:n1).
* K-chunks: columns k0:k1 of every row (the byte-tile unpack kernel on shifted planes, row stride
  Kp), accumulated in fp32 (``torch.mm/addmm(out_dtype=float32)``), rounded to bf16 once.

Modes of the N-chunk product: ``s1`` one stream, one buffer; ``p2`` an unpack stream and a GEMM
stream, two buffers, events (unpack of chunk i + 1 beside the GEMM of chunk i); ``l2`` / ``l4``
2 / 4 lanes (a stream and a buffer each), chunks dealt round robin (narrow GEMMs side by side).
On the CPU the streams are no-ops and the same chunk logic runs in order (``--tiny``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from glyd.kernels.fixed12.exceptions import prepare
from glyd.kernels.fixed12.unpack import _unpack_flat_kernel, _unpack_kernel

MODES = ("s1", "p2", "l2", "l4")
FLAT_BG, FLAT_WARPS = 16, 2  # UnpackConfig's flat defaults (66 us an 18944 x 3584 matrix on the H200)


# ---------------------------------------------------------------- streams (no-ops on the CPU)

class Sched:
    """Side streams and events on CUDA; on the CPU everything runs in order (same chunk logic)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.streams = [torch.cuda.Stream() for _ in range(4)] if cuda else [None] * 4

    def fork(self, used) -> None:
        if self.cuda:
            cur = torch.cuda.current_stream()
            for s in used:
                s.wait_stream(cur)

    def join(self, used) -> None:
        if self.cuda:
            cur = torch.cuda.current_stream()
            for s in used:
                cur.wait_stream(s)

    def on(self, s):
        return torch.cuda.stream(s) if self.cuda else contextlib.nullcontext()

    def mark(self, s):
        if not self.cuda:
            return None
        ev = torch.cuda.Event()
        ev.record(s)
        return ev

    def after(self, s, ev) -> None:
        if ev is not None:
            s.wait_event(ev)


# ---------------------------------------------------------------- chunk plans

@dataclasses.dataclass
class Chunk:
    a0: int  # first row (axis n) or column (axis k)
    a1: int
    pos: torch.Tensor | None  # the chunk's exceptions: flat positions in its [rows, K] / [N, cols] buffer
    vals: torch.Tensor | None  # their bf16 bits (int16)


@dataclasses.dataclass
class Plan:
    axis: str  # "n": rows of W; "k": columns of W
    size: int  # rows or columns a chunk (the last may be shorter)
    chunks: list
    elems: int  # bf16 elements of the largest chunk


def chunk_len(nbytes: int, full: int, other: int, align: int) -> int:
    """Rows (or columns) a chunk: about ``nbytes`` of bf16, a multiple of ``align``, balanced."""
    want = max(align, nbytes // (2 * other) // align * align)
    if want >= full:
        return full
    parts = math.ceil(full / want)
    return min(full, math.ceil(full / parts / align) * align)


def row_plan(p, rows: int) -> Plan:
    n, k = p.shape
    prep = prepare(p)
    chunks = []
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        pos = vals = None
        if prep.nexc:
            e0, e1 = prep.rowptr_host[r0], prep.rowptr_host[r1]
            if e1 > e0:
                pos, vals = (prep.pos[e0:e1] - r0 * k).contiguous(), prep.vals[e0:e1].contiguous()
        chunks.append(Chunk(r0, r1, pos, vals))
    return Plan("n", rows, chunks, min(rows, n) * k)


def col_plan(p, cols: int) -> Plan:
    n, k = p.shape
    prep = prepare(p)
    chunks = []
    for c0 in range(0, k, cols):
        c1 = min(k, c0 + cols)
        pos = vals = None
        if prep.nexc:
            r, c = prep.pos // k, prep.pos % k
            sel = (c >= c0) & (c < c1)
            if bool(sel.any()):
                pos, vals = (r[sel] * (c1 - c0) + c[sel] - c0).contiguous(), prep.vals[sel].contiguous()
        chunks.append(Chunk(c0, c1, pos, vals))
    return Plan("k", cols, chunks, n * min(cols, k))


# buf: bf16 [>= chunk elements] -> the chunk's bf16 view ([rows, K] or [N, cols]), bit-exact
def unpack_chunk(p, plan: Plan, c: Chunk, buf: torch.Tensor) -> torch.Tensor:
    import triton

    n, k = p.shape
    a = p.arrays
    kp = a["lo"].shape[1]
    if plan.axis == "n":
        rows = c.a1 - c.a0
        w = buf[:rows * k].view(rows, k)
        if k == kp:  # whole rows are one stream of 64-weight groups: the flat kernel on the range
            ng = rows * kp // 64
            _unpack_flat_kernel[(triton.cdiv(ng, FLAT_BG),)](a["code"][c.a0:c.a1], a["lo"][c.a0:c.a1], a["base"],
                                                             w.view(torch.int16), *(w,) * 3, ng, BG=FLAT_BG,
                                                             HAS_EXC=False, E=16, num_warps=FLAT_WARPS)
        else:
            _unpack_kernel[(triton.cdiv(rows, 32), triton.cdiv(kp, 128))](
                a["code"][c.a0:c.a1], a["lo"][c.a0:c.a1], a["base"], w.view(torch.int16), *(w,) * 3, rows, k, kp,
                0, 0, 0, BN=32, G=2, HAS_EXC=False, E=16, num_warps=4)
    else:  # columns c0:c1 of every row: the byte tiles with shifted planes (row stride kp), 64 a step
        if c.a0 % 64 or (c.a1 - c.a0) % 64 or k != kp:
            raise ValueError(f"K-chunks need 64-aligned columns and K == Kp, got {c.a0}:{c.a1} of {k} ({kp})")
        cols = c.a1 - c.a0
        w = buf[:n * cols].view(n, cols)
        _unpack_kernel[(triton.cdiv(n, 32), cols // 64)](a["code"][:, c.a0 // 2:], a["lo"][:, c.a0:], a["base"],
                                                         w.view(torch.int16), *(w,) * 3, n, cols, kp, 0, 0, 0,
                                                         BN=32, G=1,
                                                         HAS_EXC=False, E=16, num_warps=4)
    if c.pos is not None:  # (the library's unpack patches them inside its launch: this probe keeps its scatter)
        w.view(torch.int16).view(-1)[c.pos] = c.vals
    return w


# ---------------------------------------------------------------- products from a plan

# x: bf16 [M, K]; p: fixed12 [N, K]; out: bf16 [M, N] (written); bufs: bf16 scratch, one a lane/slot
def linear_rows(x, p, plan: Plan, mode: str, out, bufs, sched: Sched):
    def gemm(w, c):
        torch.mm(x, w.t(), out=out[:, c.a0:c.a1])

    if mode == "s1":
        for c in plan.chunks:
            gemm(unpack_chunk(p, plan, c, bufs[0]), c)
    elif mode == "p2":
        u, g = sched.streams[0], sched.streams[1]
        sched.fork((u, g))
        done = []
        for i, c in enumerate(plan.chunks):
            with sched.on(u):
                if i >= 2:
                    sched.after(u, done[i - 2])  # the GEMM that read this buffer is finished
                w = unpack_chunk(p, plan, c, bufs[i % 2])
                ready = sched.mark(u)
            with sched.on(g):
                sched.after(g, ready)
                gemm(w, c)
                done.append(sched.mark(g))
        sched.join((u, g))
    else:
        lanes = sched.streams[:int(mode[1:])]
        sched.fork(lanes)
        for i, c in enumerate(plan.chunks):
            with sched.on(lanes[i % len(lanes)]):
                gemm(unpack_chunk(p, plan, c, bufs[i % len(lanes)]), c)
        sched.join(lanes)
    return out


_ADDMM_FP32: list = []  # [bool]: torch.addmm takes a float32 accumulator beside bf16 operands (asked once)


def addmm_fp32_ok() -> bool:
    if not _ADDMM_FP32:
        a = torch.ones(2, 64, dtype=torch.bfloat16, device="cuda")
        acc = torch.ones(2, 2, device="cuda")
        try:  # some torch versions ask self to have the operands' dtype
            torch.addmm(acc, a, a.t(), out_dtype=torch.float32, out=acc)
            _ADDMM_FP32.append(bool((acc == 65).all()))
        except RuntimeError:
            _ADDMM_FP32.append(False)
    return _ADDMM_FP32[0]


# accs: fp32 [M, N] accumulator and a second one for one chunk's product; out: bf16 [M, N]
# (written: the fp32 sum rounded once)
def linear_cols(x, p, plan: Plan, out, bufs, accs, cuda: bool):
    acc, part = accs
    for i, c in enumerate(plan.chunks):
        w = unpack_chunk(p, plan, c, bufs[0])
        xs = x[:, c.a0:c.a1]
        if not cuda:  # the twin: bf16 products are exact in fp32, summed in fp32 (no dtype overloads on the CPU)
            torch.mm(xs.float(), w.float().t(), out=acc if i == 0 else part)
        elif i == 0:
            torch.mm(xs, w.t(), out_dtype=torch.float32, out=acc)
        elif addmm_fp32_ok():
            torch.addmm(acc, xs, w.t(), out_dtype=torch.float32, out=acc)
        else:  # one more pass over [M, N] fp32 a chunk
            torch.mm(xs, w.t(), out_dtype=torch.float32, out=part)
        if i and not (cuda and addmm_fp32_ok()):
            acc.add_(part)
    return out.copy_(acc)


def gemm_slices(x, w, plan: Plan, out):
    """bf16 cuBLAS on W's row slices (W in HBM, no unpack): what narrowing the GEMM alone costs."""
    for c in plan.chunks:
        torch.mm(x, w[c.a0:c.a1].t(), out=out[:, c.a0:c.a1])
    return out


def gemm_resident(x, plan: Plan, out, buf):
    """The chunk GEMMs all reading one buffer that stays in L2 (timing only: wrong values by design)."""
    for c in plan.chunks:
        rows = c.a1 - c.a0
        torch.mm(x, buf[:rows * x.shape[1]].view(rows, -1).t(), out=out[:, c.a0:c.a1])
    return out
