"""Triton kernel for decode attention straight from ``kvf12`` pages (kernel and thin launcher only).

The page code is in ``glyd.kv.fixed`` and ``docs/format.md``; the pure-torch twin is
``glyd.kv.attention.decode_attention_torch``. Each value decodes in a few integer operations
(``word = ((code & 8) * 15 + code) << 8 + (base << 8) + lo``); a block's rare exceptions are patched
into the decoded tile by a loop that runs only for blocks that have any. Channels ``c`` and
``c + D/2`` share a code byte, so the kernel keeps every key and value tile as two halves of ``D/2``
channels (the scores are the sum of two dots; the output is two accumulators): no shuffles.
The softmax, the split of the pages and the combine are those of ``glyd.kv._triton``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from glyd.errors import FormatError
from glyd.kernels._common import pdl_begin
from glyd.kernels._fields import check_int
from glyd.kernels._interp import isolated
from glyd.kv._triton import _combine, _dot, _interpreting, _kept, _split_state, _splits, _valid_arg, qk_f32
from glyd.kv._triton_words import decode_words, perm, word_bases, word_order
from glyd.kv.registry import KVKernel


@triton.jit
def _half(code, lo, bshift):
    """bf16 words of one half of a tile: 4-bit codes, raw low bytes, ``base << 8`` per channel."""
    w = (((code & 8) * 15 + code) << 8) + bshift + lo
    return w


@triton.jit
def _patch(wa, wb, exc_ptr, e0, ne, t0, TS: tl.constexpr, D: tl.constexpr):
    """Put the block's exceptions that fall in rows ``t0 .. t0+TS`` into the two half tiles (int32
    words): one ``where`` over the one half tile an exception is in, none for the block's other rows."""
    H: tl.constexpr = D // 2
    rows = tl.arange(0, TS)[:, None]
    cols = tl.arange(0, H)[None, :]
    for e in range(e0, e0 + ne):
        ent = tl.load(exc_ptr + e)
        idx = ent & 0xFFFF
        r = idx // D - t0
        c = idx % D
        if (r >= 0) & (r < TS):
            word = (ent >> 16) & 0xFFFF
            if c < H:
                wa = tl.where((rows == r) & (cols == c), word, wa)
            else:
                wb = tl.where((rows == r) & (cols == c - H), word, wb)
    return wa, wb


@triton.jit
def _decode(lo_ptr, code_ptr, exc_ptr, blk, t0, ba, bb, e0, ne, P: tl.constexpr, TS: tl.constexpr, D: tl.constexpr):
    """Rows ``t0 .. t0+TS`` of one block -> two bf16 half tiles ``[TS, D/2]`` (channels ``< D/2``, then the rest)."""
    H: tl.constexpr = D // 2
    rows = (t0 + tl.arange(0, TS))[:, None]
    cols = tl.arange(0, H)[None, :]
    code = tl.load(code_ptr + blk * (P * H) + rows * H + cols).to(tl.int32)
    lop = lo_ptr + blk * (P * D) + rows * D + cols
    wa = _half(code & 15, tl.load(lop).to(tl.int32), ba[None, :])
    wb = _half(code >> 4, tl.load(lop + H).to(tl.int32), bb[None, :])
    if ne > 0:
        wa, wb = _patch(wa, wb, exc_ptr, e0, ne, t0, TS, D)
    return (wa.to(tl.int16).to(tl.bfloat16, bitcast=True), wb.to(tl.int16).to(tl.bfloat16, bitcast=True))


@triton.jit
def _bases(base_ptr, meta_ptr, blk, D: tl.constexpr):
    """A block's ``base << 8`` for each channel of the two halves, and its exception range."""
    H: tl.constexpr = D // 2
    offs = tl.arange(0, H)
    bp = base_ptr + blk * (D // 16)
    ba = tl.load(bp + offs // 16).to(tl.int32) << 8
    bb = tl.load(bp + (offs + H) // 16).to(tl.int32) << 8
    return ba, bb, tl.load(meta_ptr + blk * 2), tl.load(meta_ptr + blk * 2 + 1)


@triton.jit
def _probs(qa, qb, ka, kb, valid, m_i, l_i, qk_scale, QK_F32: tl.constexpr, LANES: tl.constexpr = False):
    """Online-softmax step: the key tile's probabilities (bf16), the rescale factor, the new state.
    ``LANES`` (the word-decode variant): ``l_i`` is ``[GP, TS]``, each lane's own running sum, added up
    once after the last tile: one reduction across the warps a tile fewer (the maximum still needs one)."""
    s = (_dot(qa, tl.trans(ka), QK_F32) + _dot(qb, tl.trans(kb), QK_F32)) * qk_scale  # [GP, TS], log2 units
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a fully masked tile so far: no NaN
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    if LANES:
        return p.to(tl.bfloat16), alpha, m_new, l_i * alpha[:, None] + p
    else:
        return p.to(tl.bfloat16), alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _opaque(keep):
    """``keep`` through a reduction over an axis of one: the same values, but Triton 3.6 no longer traces the
    mask's uint8 load into the probabilities' dot, where it makes the operands kWidth 4 (register moves)."""
    return tl.max(keep.to(tl.int32)[:, None], 1) != 0


@triton.jit
def _block(base_ptr, meta_ptr, blk, D: tl.constexpr, SWAR: tl.constexpr):
    """A block's window bases, as the byte-wise or the word decode (``SWAR``) takes them, and its exception range."""
    if SWAR:
        return word_bases(base_ptr, meta_ptr, blk, D)
    else:
        return _bases(base_ptr, meta_ptr, blk, D)


@triton.jit
def _tiles(lo_ptr, code_ptr, exc_ptr, blk, t0, ba, bb, e0, ne, P: tl.constexpr, TS: tl.constexpr, D: tl.constexpr,
           SWAR: tl.constexpr, PRMT: tl.constexpr):
    """Rows ``t0 .. t0+TS`` of one block as two bf16 half tiles: byte-wise, or on words (in word order)."""
    if SWAR:
        return decode_words(lo_ptr, code_ptr, exc_ptr, blk, t0, ba, bb, e0, ne, P, TS, D, PRMT)
    else:
        return _decode(lo_ptr, code_ptr, exc_ptr, blk, t0, ba, bb, e0, ne, P, TS, D)


@triton.jit
def _query(q_ptr, pid_bh, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, SWAR: tl.constexpr):
    """The group's query rows (``GP``, rows past ``G`` zero) as two halves, in word order for ``SWAR``."""
    HD: tl.constexpr = D // 2
    offs_g = tl.arange(0, GP)
    qp = q_ptr + (pid_bh * G + offs_g)[:, None] * D + tl.arange(0, HD)[None, :]
    qa = tl.load(qp, mask=offs_g[:, None] < G, other=0.0)
    qb = tl.load(qp + HD, mask=offs_g[:, None] < G, other=0.0)
    if SWAR:  # read in channel order (vector loads, not 2-byte gathers through perm), then put in word order
        qa = word_order(qa, GP, HD)
        qb = word_order(qb, GP, HD)
    return qa, qb


# Shape-dependent ints are not specialised (no recompile per batch size or length).
@isolated
@triton.jit(do_not_specialize=["H", "J", "CAP", "PAGES_PER_SPLIT", "S", "VS"])
def _kvf_decode_split_kernel(
    q_ptr, lens_ptr, starts_ptr, valid_ptr, VS, bidx_ptr,
    k_lo, k_code, k_base, k_meta, k_exc, k_raw,
    v_lo, v_code, v_base, v_meta, v_exc, v_raw,
    m_out, l_out, acc_out, qk_scale, H, J, CAP, PAGES_PER_SPLIT, S,
    G: tl.constexpr, GP: tl.constexpr, P: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    F32: tl.constexpr, TS: tl.constexpr, QK_F32: tl.constexpr, HAS_VALID: tl.constexpr, SWAR: tl.constexpr = False,
    PRMT: tl.constexpr = False, PDL: tl.constexpr = 0,
):
    pdl_begin(PDL)  # config.pdl: "all" waits for the kernel before; the combine may launch now (it waits for the state)
    b = tl.program_id(1)  # grid (H, B, splits): no division by H; programs start in the order of (B * H, splits)
    pid_bh = b * H + tl.program_id(0)
    split = tl.program_id(2)
    L = tl.load(lens_ptr + b)
    S0 = tl.load(starts_ptr + b)  # tokens before S0 are masked (left padding)
    n_full = tl.minimum(L // P, J)
    j0 = split * PAGES_PER_SPLIT
    j1 = tl.minimum(j0 + PAGES_PER_SPLIT, (L + P - 1) // P)
    HD: tl.constexpr = D // 2
    HV: tl.constexpr = DV // 2
    offs_g = tl.arange(0, GP)
    offs_hd = tl.arange(0, HD)
    offs_hv = tl.arange(0, HV)
    if SWAR:  # tiles in word order (glyd.kv._triton_words): the query, raw pages and output through perm
        offs_hd = perm(offs_hd)
        offs_hv = perm(offs_hv)
    offs_ts = tl.arange(0, TS)
    qa, qb = _query(q_ptr, pid_bh, G, GP, D, SWAR)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP, TS] if SWAR else [GP], tl.float32)  # SWAR: a sum a lane (_probs)
    acc_a = tl.zeros([GP, HV], tl.float32)
    acc_b = tl.zeros([GP, HV], tl.float32)
    lost = L > CAP  # more tokens than the pool holds: no page of it is trusted
    for j in range(j0, tl.minimum(j1, n_full)):
        blk = tl.load(bidx_ptr + pid_bh.to(tl.int64) * J + j).to(tl.int64)  # the block of page j, this head
        kba, kbb, ke0, kne = _block(k_base, k_meta, blk, D, SWAR)
        vba, vbb, ve0, vne = _block(v_base, v_meta, blk, DV, SWAR)
        lost = lost | (kne < 0) | (vne < 0)  # a page whose exceptions did not fit the arena
        for t0 in range(0, P, TS):
            ka, kb = _tiles(k_lo, k_code, k_exc, blk, t0, kba, kbb, ke0, kne, P, TS, D, SWAR, PRMT)
            pos = j * P + t0 + offs_ts
            valid = (pos >= S0) & _kept(valid_ptr, b, VS, pos, HAS_VALID)
            if SWAR & HAS_VALID:
                valid = _opaque(valid)
            p, alpha, m_i, l_i = _probs(qa, qb, ka, kb, valid, m_i, l_i, qk_scale, QK_F32, SWAR)
            va, vb = _tiles(v_lo, v_code, v_exc, blk, t0, vba, vbb, ve0, vne, P, TS, DV, SWAR, PRMT)
            acc_a = acc_a * alpha[:, None] + _dot(p, va, F32)
            acc_b = acc_b * alpha[:, None] + _dot(p, vb, F32)
    if (n_full >= j0) & (n_full < j1):  # this split holds the raw, unfilled page
        raw = pid_bh.to(tl.int64) * P
        for t0 in range(0, P, TS):
            offs_t = t0 + offs_ts
            pos = n_full * P + offs_t
            valid = (offs_t < (L - n_full * P)) & (pos >= S0) & _kept(valid_ptr, b, VS, pos, HAS_VALID)
            kp = k_raw + (raw + offs_t[:, None]) * D + offs_hd[None, :]
            ka = tl.load(kp, mask=valid[:, None], other=0.0)
            kb = tl.load(kp + HD, mask=valid[:, None], other=0.0)
            p, alpha, m_i, l_i = _probs(qa, qb, ka, kb, valid, m_i, l_i, qk_scale, QK_F32, SWAR)
            vp = v_raw + (raw + offs_t[:, None]) * DV + offs_hv[None, :]
            va = tl.load(vp, mask=valid[:, None], other=0.0)
            vb = tl.load(vp + HV, mask=valid[:, None], other=0.0)
            acc_a = acc_a * alpha[:, None] + _dot(p, va, F32)
            acc_b = acc_b * alpha[:, None] + _dot(p, vb, F32)
    if SWAR:
        l_i = tl.sum(l_i, 1)
    if lost:  # never a plausible wrong value: the output is NaN, and FixedPagePool.check() says why
        l_i = tl.full([GP], float("nan"), tl.float32)
    o = pid_bh * S + split
    # the GP - G padding rows are never read (the combine reads G rows): not storing them saves up to 9/16 of the
    # state's bytes at G 7 (the 7B's group), written and read back through L2 every split
    gmask = offs_g < G
    tl.store(m_out + o * GP + offs_g, m_i, mask=gmask)
    tl.store(l_out + o * GP + offs_g, l_i, mask=gmask)
    if SWAR:  # back to channel order (perm is its own inverse): vector stores, not 4-byte scatters through perm
        acc_a = word_order(acc_a, GP, HV)
        acc_b = word_order(acc_b, GP, HV)
        offs_hv = tl.arange(0, HV)
    ap = acc_out + (o * GP + offs_g)[:, None] * DV + offs_hv[None, :]
    tl.store(ap, acc_a, mask=gmask[:, None])
    tl.store(ap + HV, acc_b, mask=gmask[:, None])


#: ``AttentionConfig.pdl``'s values: off, the combine launched early, the split kernel too.
PDL_MODES = ("", "combine", "all")


def _pdl_flags(mode: str, dev: torch.device) -> tuple[int, int]:
    """(split kernel's, combine's) flags for ``mode``: bit 1 launched early and waits, bit 2 lets the next start."""
    if not mode or dev.type != "cuda" or _interpreting() or torch.cuda.get_device_capability(dev)[0] < 9:
        return 0, 0
    return (1 if mode == "all" else 0) | 2, 1


@dataclass(frozen=True)
class AttentionConfig:
    """``num_warps`` a program; ``sub_tile``: tokens decoded at a time (>= 32 on the GPU: see
    ``glyd.kv._triton._scores``); ``programs_per_sm``: programs launched an SM (splits of the pages);
    ``maxnreg``: a register cap a thread, 0 for none (at 168 registers three programs share an SM:
    11% occupancy on the H200, 2026-12-04); ``swar``: decode pages on 32-bit words
    (``glyd.kv._triton_words``: under half the integer instructions, and the softmax's row sums kept
    per lane until the end; 0.56-0.99 of the byte decode's time on the H200, 2026-12-05);
    ``num_stages``: Triton's software pipeline depth, 0 for its default (3: 37 KB of shared memory a
    program with ``swar``, 25 KB at 2, which lets more programs share an SM); ``pdl``: programmatic
    dependent launch (CUDA, Hopper and later; ignored elsewhere): "combine" launches the splits' combine
    while the split kernel runs (it waits for the splits' state before it reads it), "all" the split kernel
    too (while the kernel before it runs), "" neither."""

    num_warps: int = 4
    sub_tile: int = 32
    programs_per_sm: int = 16
    maxnreg: int = 0
    swar: bool = False
    num_stages: int = 0
    pdl: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.num_warps, bool) or not isinstance(self.num_warps, int) or self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps!r}")
        if isinstance(self.sub_tile, bool) or not isinstance(self.sub_tile, int) or self.sub_tile < 16 \
                or self.sub_tile & (self.sub_tile - 1):
            raise ValueError(f"sub_tile must be a power of two >= 16, got {self.sub_tile!r}")
        check_int("AttentionConfig.programs_per_sm", self.programs_per_sm, 1)
        if isinstance(self.maxnreg, bool) or not isinstance(self.maxnreg, int) \
                or (self.maxnreg and not 24 <= self.maxnreg <= 255):
            raise ValueError(f"maxnreg must be 0 (no cap) or 24..255 registers, got {self.maxnreg!r}")
        if not isinstance(self.swar, bool):
            raise ValueError(f"swar must be True or False, got {self.swar!r}")
        check_int("AttentionConfig.num_stages (0: Triton's default)", self.num_stages, 0, 4)
        if self.pdl not in PDL_MODES:
            raise ValueError(f"pdl must be one of {PDL_MODES}, got {self.pdl!r}")


class Kvf12AttentionKernel(KVKernel):
    """Flash-decoding over kvf12 pages read through a block table (a static pool or a growing store)."""

    name = "kvf12_attention_triton"
    code = "kvf12"
    op = "attention"
    Config = AttentionConfig

    @classmethod
    def can_implement(cls, problem, device, config):
        ok, why = super().can_implement(problem, device, config)
        if not ok:
            return ok, why
        if device.type != "cuda" and not device.interpreting:
            return False, "needs a CUDA GPU (or Triton's interpreter)"
        p, d, dv = problem.page, problem.head_dim, problem.v_head_dim
        if p & (p - 1) or d & (d - 1) or dv & (dv - 1) or p < 16 or d < 32 or dv < 32:
            return False, f"page {p} (>= 16), head dims {d}/{dv} (>= 32) must be powers of two"
        if min(config.sub_tile, p) < 32 and not device.interpreting:
            return False, f"sub-tiles (and pages) of >= 32 tokens on the GPU, got {min(config.sub_tile, p)}"
        return True, ""

    @classmethod
    def launch(cls, q, lens, starts, block_index, k_side, v_side, scale, *, config, capped=True, num_splits=None,
               valid=None):
        return attention_triton(q, lens, starts, block_index, k_side, v_side, scale, capped=capped, num_splits=num_splits,
                                valid=valid,
                                num_warps=config.num_warps, sub_tile=config.sub_tile,
                                programs_per_sm=config.programs_per_sm, maxnreg=config.maxnreg or None,
                                swar=config.swar, num_stages=config.num_stages or None, pdl=config.pdl)


def _side(side, name: str, dev: torch.device):
    lo, code, base, meta, exc, raw = side
    for a, t in zip(("lo", "code", "base", "meta", "exc", "raw"), side):
        if not t.is_contiguous() or t.device != dev:
            raise FormatError(f"{name}.{a} must be contiguous on {dev}")
    want = ((lo, torch.uint8), (code, torch.uint8), (base, torch.uint8), (meta, torch.int32), (exc, torch.int32),
            (raw, torch.bfloat16))
    for a, (t, dt) in zip(("lo", "code", "base", "meta", "exc", "raw"), want):
        if t.dtype != dt:
            raise FormatError(f"{name}.{a} must be {dt}, got {t.dtype}")
    if lo.dim() != 3:
        raise FormatError(f"{name}.lo must be [blocks, page, head dim], got {tuple(lo.shape)}")
    nb, p, d = lo.shape  # the kernel reads each plane at a block's offset: a plane of other blocks is read past
    for a, t, want in (("code", code, (nb, p, d // 2)), ("base", base, (nb, (d + 15) // 16)), ("meta", meta, (nb, 2))):
        if tuple(t.shape) != want:
            raise FormatError(f"{name}.{a} must be {list(want)} for {name}.lo {list(lo.shape)}, got {list(t.shape)}")
    if exc.numel() == 0:
        exc = torch.zeros(1, dtype=torch.int32, device=dev)
    return lo, code, base, meta, exc, raw


def _word_views(side):
    lo, code, *rest = side
    return [lo.view(torch.int32), code.view(torch.int32), *rest]


# q [B, Hq, D] bf16; lens [B] int32 (tokens a sequence); starts [B] int32 or None (tokens before it are masked);
# valid [B, S] bool/uint8 or None (the attention mask's row: position t is attended only where t < S and valid[b, t]);
# block_index [B, H, J] int32 (page j of sequence b, head h -> block); k_side/v_side [lo [NB, P, D] uint8,
# code [NB, P, D/2] uint8, base [NB, D/16] uint8, meta [NB, 2] int32, exc [E] int32, raw [B, H, P, D] bf16]
# -> out [B, Hq, DV] bf16. capped: a sequence holds at most J pages (a pool); else its raw page follows them.
# swar: the page decode on 32-bit words (lo and code read as int32 words); num_stages: Triton's pipeline depth;
# pdl: programmatic dependent launch, "" / "combine" / "all" (AttentionConfig).
def attention_triton(q, lens, starts, block_index, k_side, v_side, scale, capped=True, num_splits=None, num_warps=4,
                     sub_tile=32, programs_per_sm=16, valid=None, maxnreg=None, swar=False, num_stages=None, pdl=""):
    if q.dim() != 3 or q.dtype != torch.bfloat16 or not q.is_contiguous():
        raise FormatError(f"q must be contiguous bf16 [B, Hq, D], got {q.dtype} {tuple(q.shape)}")
    b, hq, d = q.shape
    dev = q.device
    if block_index.dim() != 3 or block_index.shape[0] != b or block_index.shape[1] < 1 or hq % block_index.shape[1] \
            or block_index.dtype != torch.int32 or not block_index.is_contiguous():
        raise FormatError(f"block_index must be contiguous int32 [{b}, H, J] with H >= 1 and Hq={hq} a multiple of H, "
                          f"got {block_index.dtype} {tuple(block_index.shape)}")
    h, jcap = block_index.shape[1], block_index.shape[2]
    k_side, v_side = _side(k_side, "k", dev), _side(v_side, "v", dev)
    if k_side[0].shape[0] != v_side[0].shape[0]:  # one block index serves both sides
        raise FormatError(f"k and v must hold as many blocks, got {k_side[0].shape[0]} and {v_side[0].shape[0]}")
    p, dv = k_side[0].shape[1], v_side[0].shape[2]
    if k_side[0].shape[2] != d or v_side[0].shape[1] != p or tuple(k_side[5].shape) != (b, h, p, d) \
            or tuple(v_side[5].shape) != (b, h, p, dv):
        raise FormatError(f"the KV planes do not match q {tuple(q.shape)} (pages of {p}, raw {tuple(k_side[5].shape)})")
    if d & (d - 1) or dv & (dv - 1) or p & (p - 1) or p < 16 or d < 32 or dv < 32:
        raise FormatError(f"page {p} (>= 16), head dims {d}/{dv} (>= 32) must be powers of two")
    if isinstance(sub_tile, bool) or not isinstance(sub_tile, int) or sub_tile < 16 or sub_tile & (sub_tile - 1):
        raise FormatError(f"sub_tile {sub_tile!r} must be a power of two >= 16")
    if isinstance(num_warps, bool) or not isinstance(num_warps, int) or num_warps not in (1, 2, 4, 8, 16):
        raise FormatError(f"num_warps {num_warps!r} must be 1, 2, 4, 8 or 16")
    if maxnreg is not None and not (isinstance(maxnreg, int) and 24 <= maxnreg <= 255):
        raise FormatError(f"maxnreg must be None or 24..255 registers, got {maxnreg!r}")
    ts = min(sub_tile, p)
    if ts < 32 and not _interpreting():
        raise FormatError(f"the fused kernel needs sub-tiles (and pages) of >= 32 tokens on the GPU, got {ts}")
    if not isinstance(capped, bool):
        raise FormatError(f"capped must be True or False, got {capped!r}")
    g = hq // h
    gp = max(16, triton.next_power_of_2(g))
    max_pages = jcap if capped else jcap + 1  # host ints only: no sync, so CUDA graphs can capture this
    num_splits, pages_per_split = _splits(max(max_pages, 1), b * h, dev, num_splits, programs_per_sm)
    if max(b, num_splits) > 65535:  # the grid's y and z dimensions
        raise FormatError(f"at most 65,535 sequences and splits a launch, got {b} and {num_splits}")
    lens, starts, m, l_, acc = _split_state(q, lens, starts, b, h, num_splits, gp, dv)
    vbytes, vs, has_valid = _valid_arg(valid, b, q)
    if not isinstance(swar, bool):
        raise FormatError(f"swar must be True or False, got {swar!r}")
    if num_stages is not None and (type(num_stages) is not int or not 1 <= num_stages <= 4):  # not a bool: True == 1
        raise FormatError(f"num_stages must be None or 1..4, got {num_stages!r}")
    if not isinstance(pdl, str) or pdl not in PDL_MODES:
        raise FormatError(f"pdl must be one of {PDL_MODES}, got {pdl!r}")
    split_pdl, combine_pdl = _pdl_flags(pdl, dev)
    opts = {} if _interpreting() else {k: v for k, v in (("maxnreg", maxnreg), ("num_stages", num_stages)) if v}
    if split_pdl & 1:
        opts["launch_pdl"] = True
    if swar:  # lo and code as int32 words (rows of D/4 and D/8 words: D >= 32)
        k_side, v_side = (_word_views(sd) for sd in (k_side, v_side))
    _kvf_decode_split_kernel[(h, b, num_splits)](
        q, lens, starts, vbytes, vs, block_index, *k_side, *v_side, m, l_, acc,
        scale * 1.4426950408889634, h, jcap, jcap * p if capped else jcap * p + p, pages_per_split, num_splits,
        G=g, GP=gp, P=p, D=d, DV=dv, F32=_interpreting(), TS=ts, QK_F32=qk_f32(d // 2), HAS_VALID=has_valid,
        SWAR=swar, PRMT=not _interpreting(), PDL=split_pdl, num_warps=num_warps, **opts,
    )
    out = torch.empty(b, hq, dv, dtype=torch.bfloat16, device=dev)
    _combine(m, l_, acc, out, b, h, num_splits, g, gp, dv, pdl=combine_pdl)
    return out


def decode_attention_fixed_triton(q, k_store, v_store, lens, scale=None, num_splits=None, num_warps=4,
                                  sub_tile=32, starts=None, programs_per_sm=16, valid=None):
    """The kernel over two ``FixedPageStore``s (their planes read through a block table of their pages)."""
    from glyd.kv.fixed import store_view

    b, hq, d = q.shape
    if k_store.batch != b or v_store.batch != b or v_store.heads != k_store.heads or k_store.head_dim != d \
            or v_store.page != k_store.page or hq % k_store.heads:
        raise FormatError(f"q {tuple(q.shape)} does not match the KV stores (B={k_store.batch}, H={k_store.heads}, "
                          f"D={k_store.head_dim})")
    bidx, ks, vs = store_view(k_store, v_store)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    return attention_triton(q.contiguous(), lens.to(torch.int32), starts, bidx, ks, vs, scale, capped=False,
                            num_splits=num_splits, num_warps=num_warps, sub_tile=sub_tile,
                            programs_per_sm=programs_per_sm, valid=valid)
