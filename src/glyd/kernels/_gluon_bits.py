"""Gluon helpers shared by the Gluon kernels of the weights (``fixed12.mma_v2``, ``fixed12.wgmma``,
``fixed12.wgmma_warpspec``, ``dense11.wgmma``) and of the KV cache (``glyd.kv._gluon``): byte permutes, the bf16
pair split, popcount and funnel shift, shuffles within groups of 4 lanes, exception metadata,
programmatic-dependent-launch waits, split-K counters."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def prmt(a, b, SEL: gl.constexpr):
    # prmt.b32: each byte of the result picked from the 8 bytes of (b, a) by a nibble of SEL
    return gl.inline_asm_elementwise(f"prmt.b32 $0, $1, $2, {SEL};", "=r,r,r", [a, b], dtype=gl.uint32,
                                     is_pure=True, pack=1)


@gluon.jit
def prmt_r(a, b, sel):
    # prmt.b32 with a register selector: byte t = byte (nibble t & 7) of (b:a), or that byte's top bit spread over
    # the byte where nibble t has bit 3 set
    return gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, sel], dtype=gl.uint32,
                                     is_pure=True, pack=1)


@gluon.jit
def popc(v):
    # the set bits of a 32-bit word
    return gl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [v], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def funnel(lo, hi, s):
    # (hi:lo) >> s for s in 0 .. 31 (shf.r.clamp.b32)
    return gl.inline_asm_elementwise("shf.r.clamp.b32 $0, $1, $2, $3;", "=r,r,r,r", [lo, hi, s], dtype=gl.uint32,
                                     is_pure=True, pack=1)


@gluon.jit
def shfl_up4(v, DELTA: gl.constexpr):
    # each lane gets the int32 v of the lane DELTA below it in its group of 4 lanes (shfl.sync.up, width 4: a
    # group's first DELTA lanes get their own). The caller's layout must put the groups' elements on lanes 4i..4i+3
    return gl.inline_asm_elementwise(f"shfl.sync.up.b32 $0, $1, {DELTA}, {(32 - 4) << 8}, -1;", "=r,r", [v],
                                     dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def shfl_last4(v):
    # each lane gets the int32 v of the last lane of its group of 4 lanes (shfl.sync.idx 3, width 4)
    return gl.inline_asm_elementwise(f"shfl.sync.idx.b32 $0, $1, 3, {((32 - 4) << 8) | 0x1F}, -1;", "=r,r", [v],
                                     dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def split16(p):
    # the two bf16 halves of a 32-bit pair, low half first (PTX vector unpack)
    a, b = gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [p], dtype=(gl.uint16, gl.uint16),
                                     is_pure=True, pack=1)
    return a.to(gl.bfloat16, bitcast=True), b.to(gl.bfloat16, bitcast=True)


@gluon.jit
def gdc_wait():
    # griddepcontrol.wait: the kernel before this one has finished and its writes are visible
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def gdc_launch_dependents():
    # let the next kernel launch once every program of this one has started (a hint)
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def wait_count(cnt_ptr, n):
    # spin until the counter reaches n: relaxed reads at L2, as ``_common.wait_count`` (an
    # acquire would invalidate the SM's L1, where the other programs read x from)
    c = gl.atomic_add(cnt_ptr, 0, sem="relaxed", scope="gpu")
    while c < n:
        c = gl.atomic_add(cnt_ptr, 0, sem="relaxed", scope="gpu")


@gluon.jit
def exc_meta(eidx_ptr, ehi_ptr, lo8_ptr, stride_lo, base, K, es, e1, E: gl.constexpr, L2: gl.constexpr):
    # exceptions es..min(es + E, e1): their columns, true and decoded (placeholder) fp32 values and
    # weight rows (-1 past e1), in the compact [16, E] layout L2's column slice
    e = es + gl.arange(0, E, layout=gl.SliceLayout(0, L2))
    em = e < e1
    # the index's own width (int32 where the matrix has < 2^31 weights): a 64-bit division is a
    # software call, 15-20% of an exception step's instructions (sm_90 SASS, 2026-12-06)
    idx = gl.load(eidx_ptr + e, mask=em, other=0)
    r = idx // K
    c = idx - r * K
    th = gl.load(ehi_ptr + e, mask=em, other=0).to(gl.uint32)
    lo = gl.load(lo8_ptr + r.to(gl.int64) * stride_lo + c, mask=em, other=0).to(gl.uint32)
    tv = ((th << 24) | (lo << 16)).to(gl.float32, bitcast=True)
    pv = ((((th & 0x80) | base) << 24) | (lo << 16)).to(gl.float32, bitcast=True)
    return c, em, tv, pv, gl.where(em, r, -1)


@gluon.jit
def exc_meta_vals(eidx_ptr, vals_ptr, base, K, es, e1, E: gl.constexpr, L2: gl.constexpr):
    # exc_meta from the prepared list of true bf16 values (``Prepared.vals``, hi:lo): two independent
    # loads, no gather into the lo plane behind the index's load
    e = es + gl.arange(0, E, layout=gl.SliceLayout(0, L2))
    em = e < e1
    # the index's own width (int32 where the matrix has < 2^31 weights): a 64-bit division is a
    # software call, 15-20% of an exception step's instructions (sm_90 SASS, 2026-12-06)
    idx = gl.load(eidx_ptr + e, mask=em, other=0)
    r = idx // K
    c = idx - r * K
    v = gl.load(vals_ptr + e, mask=em, other=0).to(gl.int32).to(gl.uint32) & 0xFFFF
    tv = (v << 16).to(gl.float32, bitcast=True)
    pv = (((v & 0x80FF) | (base << 8)) << 16).to(gl.float32, bitcast=True)
    return c, em, tv, pv, gl.where(em, r, -1)
