"""The fixed12 wgmma kernel (weights as warpgroup MMA's register operand; Hopper only): static
checks compiled for sm_90 on any machine, products on the GPU against float64."""

from __future__ import annotations

import pytest
import torch

import glyd

from .conftest import needs_triton, random_weights
from .test_gluon import _res_usage, _sass, compile_gluon_sm90
from .test_linear import _check

pytestmark = needs_triton


def _wg():
    try:
        from glyd.kernels.fixed12 import wgmma as fixed12_wg
    except ImportError as exc:  # a Triton without Gluon's Hopper module
        pytest.skip(f"no Gluon wgmma in this Triton: {exc}")
    return fixed12_wg


def _compile_sm90(bn, bt, warps, out=0, bias=False, pipe=0, exc=False, xe=16, xt=False, pre=False):
    w = _wg()
    words, xl, mma, a_op, xsl, ol = w.layouts(bn, bt, warps)
    ptrs = {"x_ptr": "*bf16", "code_ptr": "*i32", "lo_ptr": "*i32", "base_ptr": "*u8", "part_ptr": "*fp32",
            "out_ptr": "*bf16", "bias_ptr": "*bf16", "rowptr_ptr": "*i32", "eidx_ptr": "*i32", "ehi_ptr": "*u8",
            "lo8_ptr": "*i16" if pre else "*u8", **({"xt_ptr": "*bf16"} if xt else {}),
            **({"cnt_ptr": "*i32"} if out == 2 else {})}
    const = dict(BN=bn, BT=bt, WL=words, XL=xl, ML=mma, AL=a_op, XSL=xsl, OL=ol, OUT=out, HAS_BIAS=bias, PIPE=pipe,
                 EXC=exc, EL=w.exc_layout(warps, xt) if exc else None, XE=xe, XT=xt, PRE=pre, CS=32,
                 **({} if xt else {"xt_ptr": None}), **({} if out == 2 else {"cnt_ptr": None}))
    return compile_gluon_sm90(w._wg_kernel, const, ptrs, num_warps=warps)


@pytest.mark.cpu_sample(every=2)  # compiles for sm_90 (6 compiles a case, 10-14 s): half the configs in the default run
@pytest.mark.parametrize("bn,bt,warps", [(64, 16, 4), (64, 64, 4)])
def test_wg_exception_step_options_compile_sm90(bn, bt, warps):
    # WgConfig.exc_chunk / exc_xt / exc_pre in the tile's exception step: it compiles for sm_90 with the
    # step's MMAs (two a round) and, with the values prepared, no byte load from the lo plane in it
    from .test_gluon import _sass

    plain = _sass(_compile_sm90(bn, bt, warps, exc=True))
    k = _compile_sm90(bn, bt, warps, exc=True, xe=64, xt=True, pre=True)
    sass = _sass(k)
    assert sass.count("HGMMA") >= plain.count("HGMMA")
    assert sass.count("LDG.E.U8") < plain.count("LDG.E.U8")
    # exc_vals (PRE 2): the prepared values in the round itself, no byte load from the lo plane either
    vals = _sass(_compile_sm90(bn, bt, warps, exc=True, xe=64, pre=2))
    assert "STL" not in vals and vals.count("LDG.E.U8") < plain.count("LDG.E.U8")
    # exc_rows (PRE 3): the accumulator's threads add their rows' exceptions with FMAs: no one-hot MMA, no spill
    rows = _compile_sm90(bn, bt, warps, exc=True, xt=True, pre=3)
    none = _sass(_compile_sm90(bn, bt, warps))
    assert "STL" not in _sass(rows) and _sass(rows).count("HGMMA") == none.count("HGMMA")
    assert _sass(rows).count("FFMA") > none.count("FFMA")
    # ... with x's columns from x itself (no transposed copy: exc_xt off)
    direct = _sass(_compile_sm90(bn, bt, warps, exc=True, pre=3))
    assert "STL" not in direct and direct.count("HGMMA") == none.count("HGMMA")
    assert direct.count("FFMA") > none.count("FFMA")


@pytest.mark.cpu_sample(every=2)  # compiles for sm_90: half the configs in the default run
@pytest.mark.parametrize("bn,bt,warps", [(64, 8, 4), (64, 16, 4), (64, 64, 4), (128, 32, 8), (128, 64, 8)])
@pytest.mark.parametrize("out,pipe,exc", [(0, 0, False), (1, 0, False), (0, 1, False), (1, 1, True)])
def test_wg_decoded_tile_is_the_register_operand_sm90(bn, bt, warps, out, pipe, exc):
    # the decoded tile reaches wgmma from registers: in the K loop (two steps, unrolled) the only
    # shared-memory stores are the x tiles' (bt x 128 bf16 a step, split over the threads), there
    # are no shared loads (wgmma reads x itself), one wgmma a 16-wide k chunk and warpgroup, one
    # barrier a step (two with an MMA in flight), and nothing spills
    import re

    k = _compile_sm90(bn, bt, warps, out=out, bias=out == 1, pipe=pipe, exc=exc)
    assert "warp_group_dot" in k.asm["ttgir"]
    res = _res_usage(k)
    assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0
    sass = _sass(k)
    lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", ln).group(1), 16) for ln in lines]
    # the K loop: the backward branch (cuobjdump prints branch targets as addresses)
    loops = [(int(m.group(1), 16), a) for ln, a in zip(lines, addr)
             if (m := re.search(r"BRA\s+0x([0-9a-f]+)", ln)) and int(m.group(1), 16) < a]
    assert loops, "no K loop found"
    lo, hi = loops[0]
    body = [ln for ln, a in zip(lines, addr) if lo <= a <= hi and "@!PT" not in ln]  # not the never-run fillers
    ops = [re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", ln).group(1) for ln in body]
    assert ops.count("HGMMA") == 2 * 8 * (bn // 64 if warps == 4 else 1)
    assert ops.count("LDS") == 0
    assert ops.count("BAR") == 2 * (1 + pipe)
    assert 0 < ops.count("STS") <= 2 * bt * 128 * 2 // (32 * warps * 4)  # at least 4-byte stores
    assert ops.count("LDL") == 0 and ops.count("STL") == 0


@pytest.mark.parametrize("bn,bt,exc", [(64, 64, True), (64, 16, False)])
def test_wg_fixup_compiles_sm90(bn, bt, exc):
    # WgConfig.fixup (OUT 2): the split-K sum in the kernel compiles for sm_90 without a spill, with its releasing
    # atomic count-in and the partials read back from L2
    k = _compile_sm90(bn, bt, 4, out=2, bias=True, exc=exc, pre=3 if exc else False)
    res = _res_usage(k)
    assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, res
    sass = _sass(k)
    plain = _sass(_compile_sm90(bn, bt, 4, out=0, bias=True, exc=exc, pre=3 if exc else False))
    assert "REDG.E.ADD.STRONG.GPU" in sass and "MEMBAR.ALL.GPU" in sass  # the releasing count-in
    assert "ATOMG.E.EXCH.STRONG.GPU" in sass  # the counter zeroed for the next launch
    assert "LDG.E.STRONG.GPU" in sass and "LDG.E.STRONG.GPU" not in plain  # the partials read from L2
    assert sass.count("HGMMA") == plain.count("HGMMA")


def test_wg_weights_and_x_share_one_k_order():
    # the decoded tile and the x tile reach the MMA in the same permutation of a step's 128
    # columns (so the product is unchanged), and both cover every column once
    import numpy as np

    w = _wg()
    bits = np.indices([2] * 7)
    g, a, i1, i0, j, h, hh = bits  # the decoded tile's dims after the row
    col_w = 4 * (16 * g + 8 * hh + 4 * a + 2 * i1 + i0) + 2 * h + j
    col_x = np.arange(128).reshape([2] * 7)  # x in column order: dims are the column's bits
    order_w = [d - 1 for d in w.DECODE_ORDER.value[1:]]
    order_x = [d - 1 for d in w.X_ORDER.value[1:]]
    slots_w = col_w.transpose(order_w).reshape(-1)
    slots_x = col_x.transpose(order_x).reshape(-1)
    assert sorted(slots_w) == list(range(128))
    assert (slots_w == slots_x).all()
    # chunk 0, h = 0: lane c = a + 2 g holds columns 16 a + 64 g + (0, 1): a thread's 16 bytes
    assert list(slots_w[:8]) == [0, 1, 16, 17, 64, 65, 80, 81]


def test_wg_needs_a_gpu():
    from glyd import kernels
    from glyd.kernels import WgConfig

    p = glyd.pack(random_weights(64, 256, "normal"), "fixed12")
    if torch.cuda.is_available():
        p = p.to("cuda")
    with pytest.raises(ValueError, match="Hopper|Gluon"):
        kernels.linear(torch.randn(2, 256).to(torch.bfloat16), p, None,
                       WgConfig(bm=16, bn=64))


def test_wg_config_checks():
    from glyd.kernels import WgConfig

    for bad in (dict(bn=32), dict(bm=128), dict(warps=2), dict(maxnreg=16), dict(exc_tile=True, exc_after=True)):
        with pytest.raises(ValueError, match="WgConfig|exc_tile"):
            WgConfig(**{**dict(bm=16, bn=64), **bad})
    for bad in (dict(bk=256), dict(ring=2)):  # the wgmma tile has none of these
        with pytest.raises(TypeError):
            WgConfig(**{**dict(bm=16, bn=64), **bad})
    with pytest.raises(ValueError, match="fixup"):
        WgConfig(bm=16, bn=64, fixup=1)
    assert WgConfig(bm=16, bn=64, fixup=True).fixup
    WgConfig(bm=16, bn=64, exc_tile=True, exc_chunk=64, exc_xt=True, exc_pre=True)
    for bad in (dict(exc_chunk=8), dict(exc_chunk=48), dict(exc_chunk=64.0), dict(exc_xt=1), dict(exc_pre="yes"),
                dict(exc_vals=1), dict(exc_pre=True, exc_vals=True), dict(exc_rows=1)):
        with pytest.raises(ValueError, match="exc_"):
            WgConfig(**{**dict(bm=16, bn=64), **bad})
    WgConfig(bm=16, bn=64, exc_tile=True, exc_rows=True)


@pytest.mark.gpu
@pytest.mark.gpu_sample(every=24)
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("bm,bn,warps", [(8, 64, 4), (16, 64, 4), (32, 64, 4), (64, 64, 4), (64, 128, 4),
                                         (64, 128, 8), (32, 128, 8)])
@pytest.mark.parametrize("m", [1, 17, 64, 100])
@pytest.mark.parametrize("split", [1, 5])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("pipe,exc", [(False, True), (True, True), (False, False), (True, False)])
def test_wg_matches_reference_gpu(bm, bn, warps, m, split, bias, pipe, exc):
    from glyd import kernels
    from glyd.kernels import WgConfig

    w = random_weights(1000, 3584, "normal", "cuda")  # with exceptions (values far below the window)
    p = glyd.pack(w, "fixed12")
    assert p.arrays["exc_idx"].numel() > 0
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    b = torch.randn(1000, device="cuda").to(torch.bfloat16) if bias else None
    # split 5 leaves the last program of each tile fewer K steps than the others
    # exc: the exceptions inside the tile kernel (Config.exc_tile), else the separate pass; pipe:
    # one MMA in flight across K steps
    y = kernels.linear(x, p, b, WgConfig(bm=bm, bn=bn, warps=warps, split=split, exc_tile=exc, pipe=pipe))
    _check(y, x, w, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("bm,bn,chunk,split", [(16, 64, 64, 1), (64, 64, 32, 5), (8, 64, 64, 2)])
def test_wg_exception_step_options_gpu(bm, bn, chunk, split):
    # WgConfig.exc_chunk / exc_xt / exc_pre with 0.1% of weights exceptions (real weights' rate), ragged M and N:
    # within the float64 bound, and x transposed and the prepared values give the strided gather's bits
    from glyd import kernels
    from glyd.kernels import WgConfig

    w = random_weights(1000, 3584, "normal", "cuda")
    w.view(-1)[torch.randint(0, w.numel(), (w.numel() // 1000,), device="cuda")] = torch.tensor(
        1e-30, device="cuda").to(torch.bfloat16)
    p = glyd.pack(w, "fixed12")
    # a whole x tile and a ragged one (exc_rows' two paths: x's rows a constant apart, and clamped past M)
    x = torch.randn(2 * bm - 3, 3584, device="cuda").to(torch.bfloat16)
    cfg = WgConfig(bm=bm, bn=bn, split=split, exc_tile=True, exc_chunk=chunk)
    y = kernels.linear(x, p, None, cfg)
    _check(y, x, w, None)
    for extra in (dict(exc_xt=True), dict(exc_xt=True, exc_pre=True), dict(exc_pre=True), dict(exc_vals=True),
                  dict(exc_xt=True, exc_vals=True)):
        assert torch.equal(kernels.linear(x, p, None, cfg.replace(**extra)).view(torch.int16), y.view(torch.int16))
    # by the accumulator's own threads (exc_rows): fp32 FMAs, another order of the sums; the same bits twice
    yr = kernels.linear(x, p, None, cfg.replace(exc_rows=True))
    _check(yr, x, w, None)
    assert torch.equal(kernels.linear(x, p, None, cfg.replace(exc_rows=True)).view(torch.int16), yr.view(torch.int16))
    # ... their x columns from x itself or from a transposed copy (exc_xt): the same FMAs, the same bits
    yrt = kernels.linear(x, p, None, cfg.replace(exc_rows=True, exc_xt=not cfg.exc_xt))
    assert torch.equal(yrt.view(torch.int16), yr.view(torch.int16))
    # ... each round's x columns and values loaded a round ahead (exc_pre): the same FMAs, the same bits
    for xt in (False, True):
        yra = kernels.linear(x, p, None, cfg.replace(exc_rows=True, exc_pre=True, exc_xt=xt))
        assert torch.equal(yra.view(torch.int16), yr.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("m", [4, 64])
def test_wg_one_split_without_exceptions_stores_bf16_gpu(m):
    # no exceptions and one split: the kernel writes the bf16 result (+ bias) itself
    from glyd import kernels
    from glyd.kernels import WgConfig
    from glyd.kernels import _common as C

    w = torch.randn(256, 1024, device="cuda") * 0.02
    w = torch.where(w.abs() < 1e-3, 1e-3, w).to(torch.bfloat16)  # every exponent in the window
    p = glyd.pack(w, "fixed12")
    assert p.arrays["exc_idx"].numel() == 0
    x = torch.randn(m, 1024, device="cuda").to(torch.bfloat16)
    bias = torch.randn(256, device="cuda").to(torch.bfloat16)
    calls = []
    real = C.finalize_launch  # the split-K reduce, as the launcher plans it
    C.finalize_launch = lambda *a: calls.append(a) or real(*a)
    try:
        y = kernels.linear(x, p, bias, WgConfig(bm=64, bn=64, split=1))
    finally:
        C.finalize_launch = real
    assert not calls
    _check(y, x, w, bias)
    # a strided x (a column slice) is read correctly too
    xw = torch.randn(m, 1024 + 8, device="cuda").to(torch.bfloat16)[:, 8:]
    _check(kernels.linear(xw, p, bias, WgConfig(bm=64, bn=64)), xw, w, bias)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
@pytest.mark.parametrize("m,split,bias,rows", [(64, 4, True, True), (17, 3, False, False), (100, 5, True, False)])
def test_wg_fixup_gives_the_finalize_bits_gpu(m, split, bias, rows):
    # WgConfig.fixup: each tile's last split program sums the partials in the kernel, in the finalize's order: the
    # bits of the launch with the finalize kernel, with the exceptions in the tile (0.1% of weights) and no
    # finalize launched; twice in a row (the counters left zeroed for the next launch)
    from glyd import kernels
    from glyd.kernels import WgConfig
    from glyd.kernels import _common as C

    w = random_weights(1000, 3584, "normal", "cuda")
    w.view(-1)[torch.randint(0, w.numel(), (w.numel() // 1000,), device="cuda")] = torch.tensor(
        1e-30, device="cuda").to(torch.bfloat16)
    p = glyd.pack(w, "fixed12")
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    b = torch.randn(1000, device="cuda").to(torch.bfloat16) if bias else None
    cfg = WgConfig(bm=64, bn=64, split=split, exc_tile=True, exc_rows=rows)
    y = kernels.linear(x, p, b, cfg)
    calls = []
    real = C.finalize_launch
    C.finalize_launch = lambda *a: calls.append(a) or real(*a)
    try:
        for _ in range(2):
            yf = kernels.linear(x, p, b, cfg.replace(fixup=True))
            assert torch.equal(yf.view(torch.int16), y.view(torch.int16))
    finally:
        C.finalize_launch = real
    assert not calls
    _check(yf, x, w, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs a Hopper GPU")
def test_wg_rejects_odd_k_steps_gpu():
    from glyd import kernels
    from glyd.kernels import WgConfig

    p = glyd.pack(random_weights(64, 1152, "normal", "cuda"), "fixed12")  # 9 steps of 128
    with pytest.raises(ValueError, match="multiple of 256"):
        kernels.linear(torch.randn(2, 1152, device="cuda").to(torch.bfloat16), p, None,
                       WgConfig(bm=16, bn=64))
