"""The fixed12 Gluon kernel (explicit layouts, CUDA only): static layout checks on any machine,
products on the GPU (against float64 and against the `tc` kernel it can replace)."""

from __future__ import annotations

import functools
import re

import pytest
import torch

import glyd

from .conftest import needs_triton, random_weights
from .test_linear import _check

pytestmark = needs_triton


def _gluon():
    try:
        from glyd.kernels.fixed12 import mma_v2 as fixed12_gluon
    except ImportError as exc:  # a Triton without Gluon
        pytest.skip(f"no Gluon in this Triton: {exc}")
    return fixed12_gluon


@pytest.mark.cpu_sample(every=2)  # compiles for sm_90: half the configs in the default run
@pytest.mark.parametrize("bn,bk,mt,pf,warps", [(64, 256, 1, False, 4), (32, 128, 1, False, 4), (32, 64, 1, True, 4),
                                               (64, 128, 4, True, 4), (32, 256, 2, False, 4), (64, 64, 1, True, 1),
                                               (16, 128, 2, False, 1), (64, 128, 1, True, 2), (64, 64, 4, False, 2),
                                               (32, 128, 1, 2, 4)])
@pytest.mark.parametrize("stages,xasync", [(1, False), (3, False), (4, True)])
def test_gluon_tile_stays_in_registers_sm90(bn, bk, mt, pf, warps, stages, xasync):
    # Compiled for sm_90 on the CPU: the decoded tile and x reach the MMA without shared memory,
    # i.e. the load layouts are the operand layouts (the point of the kernel).
    if stages > 1 and pf != 1:
        pytest.skip("the async ring comes with prefetch one step ahead (of x, in registers)")
    k = _compile_sm90(bn, bk, mt, pf, warps, stages, xasync)
    ttgir = k.asm["ttgir"]
    assert "mma" in ttgir
    if stages == 1:
        assert "local_alloc" not in ttgir and "local_load" not in ttgir
        assert k.metadata.shared == 0
    else:  # the plane words' ring is the only shared memory: two buffers of stages x bk/4 x bn words
        assert "async_copy_global_to_local" in ttgir
        assert k.metadata.shared == stages * (2 * (bk // 4) * bn * 4 + (16 * mt * bk * 2 if xasync else 0))
        assert "LDGSTS.E.BYPASS.128" in _sass(k)  # 16-byte async copies


def _compile_sm90(bn, bk, mt, pf, warps, stages=1, xasync=False, exc=False, xahead=True, x8=False, maxnreg=None,
                  pdl=0, out=0, bias=False, xe=16, rows=False):
    g = _gluon()
    words, xl, mma, a_op, b_op = g.layouts(bn, bk, warps)
    ptrs = {"x_ptr": "*bf16", "code_ptr": "*i32", "lo_ptr": "*i32", "base_ptr": "*u8", "part_ptr": "*fp32",
            "rowptr_ptr": "*i32", "eidx_ptr": "*i32", "ehi_ptr": "*u8", "lo8_ptr": "*i16" if rows else "*u8",
            "out_ptr": "*bf16",
            "bias_ptr": "*bf16", "cnt_ptr": "*i32"}
    const = {"BN": bn, "BK": bk, "WL": words, "XL": xl, "ML": mma, "AL": a_op, "BL": b_op, "MT": mt, "PREFETCH": pf,
             "STAGES": stages, "SL": g.ring_layout(bn, bk, warps, stages) if stages > 1 else None,
             "XASYNC": xasync, "EXC": exc, "EE": g.EXC_E, "XAHEAD": xahead, "X8": x8,
             "X8L": g.x8_layout(bk, warps) if x8 else None, "PDL": pdl, "OUT": out, "HAS_BIAS": bias,
             "CS": 32, "XE": xe, "ROWS": rows}
    const["EL"], const["EXL"] = g.exc_layouts(warps) if exc else (None, None)
    if xasync:
        const["XCL"], const["XSL"] = g.x_ring_layouts(bk, warps)
    return compile_gluon_sm90(g._gl_kernel, const, ptrs, num_warps=warps, maxnreg=maxnreg)


def compile_gluon_sm90(kernel, const: dict, ptrs: dict, descs: dict | None = None, num_warps: int = 4,
                       maxnreg: int | None = None):
    """``kernel`` compiled for sm_90 with Triton's own ptxas (no GPU needed): ``const`` its
    constexpr arguments, ``ptrs`` its pointer arguments' types, ``descs`` its TMA descriptors'
    types; the rest are i32, pointers, strides and K_SPLIT / KP divisible by 16. Skips where
    this Triton has no ptxas for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    descs = descs or {}
    names = kernel.arg_names
    sig = {a: "constexpr" if a in const else descs.get(a) or ptrs.get(a, "i32") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names
             if a in ptrs or a.startswith("stride") or a in ("K_SPLIT", "KP")}
    try:
        return triton.compile(GluonASTSource(kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=num_warps, maxnreg=maxnreg))
    except Exception as exc:  # no ptxas for sm_90 in this Triton install
        if "ptxas" in str(exc).lower():
            pytest.skip(f"cannot compile for sm_90 here: {exc}")
        raise


@pytest.mark.parametrize("bn,bk,mt,warps,stages,xasync", [(32, 128, 1, 4, 1, False), (64, 128, 1, 2, 1, False),
                                                          (32, 128, 2, 4, 3, True), (64, 128, 4, 4, 2, True),
                                                          (16, 64, 1, 1, 1, False)])
def test_gluon_in_tile_exceptions_compile_sm90(bn, bk, mt, warps, stages, xasync):
    # GluonConfig.exc_tile: the first split program adds its rows' exceptions after the K loop; the
    # K loop itself is unchanged (still no shared memory without the ring) and nothing spills
    base = _compile_sm90(bn, bk, mt, 1, warps, stages, xasync)
    k = _compile_sm90(bn, bk, mt, 1, warps, stages, xasync, exc=True)
    sass = _sass(k)
    assert "STL" not in sass  # no spill stores
    assert k.metadata.shared >= base.metadata.shared
    # the exception step's one-hot product: two more MMAs (hi and lo parts) a 16-row x tile
    assert sass.count("HMMA") > _sass(base).count("HMMA")


@pytest.mark.parametrize("bn,mt,warps,xahead,x8", [(64, 1, 4, True, False), (32, 1, 4, False, True),
                                                  (64, 2, 4, True, False)])
def test_gluon_exception_chunk_compile_sm90(bn, mt, warps, xahead, x8):
    # GluonConfig.exc_chunk: the rounds after the K loop 32 or 64 exceptions at a time (one-hot MMAs of K 32 / 64):
    # more MMAs in the exception step and no spill; registers (sm_90a, 2026-12-06): bn 64 132 -> 138 at 32 and 64,
    # bn 32 with x rows 0-7 58 -> 61 / 72 (fewer programs an SM: the table decides), bm 32 200 at every chunk
    base = _compile_sm90(bn, 128, mt, 1, warps, exc=True, xahead=xahead, x8=x8)
    for xe in (32, 64):
        k = _compile_sm90(bn, 128, mt, 1, warps, exc=True, xahead=xahead, x8=x8, xe=xe)
        assert "STL" not in _sass(k)
        assert _sass(k).count("HMMA") > _sass(base).count("HMMA")
        assert _res_usage(k)["REG"] <= _res_usage(base)["REG"] + 16, (xe, _res_usage(k), _res_usage(base))


@pytest.mark.parametrize("bn,stages,xahead,x8", [(32, 1, False, True), (64, 2, True, False)])
def test_gluon_row_exceptions_compile_sm90(bn, stages, xahead, x8):
    # GluonConfig.exc_rows: nothing loaded before the K loop and no one-hot MMA, the accumulator's threads add their
    # rows' exceptions with FMAs: fewer registers (sm_90a, 2026-12-06: the H200 table's M = 2 row, bn 32 with x rows
    # 0-7, 57 -> 50, so 9 programs an SM at 56 allocated; bn 64 150 -> 128) and no spill
    base = _compile_sm90(bn, 128, 1, 1, 4, stages=stages, exc=True, xahead=xahead, x8=x8)
    k = _compile_sm90(bn, 128, 1, 1, 4, stages=stages, exc=True, xahead=xahead, x8=x8, rows=True)
    assert "STL" not in _sass(k)
    assert _res_usage(k)["REG"] < _res_usage(base)["REG"], (_res_usage(k), _res_usage(base))
    assert _sass(k).count("HMMA") < _sass(base).count("HMMA")  # the K loop's MMAs only
    if (bn, x8) == (32, True):
        assert _res_usage(k)["REG"] <= 56


def _res_usage(k) -> dict:
    import os
    import re
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return {key: int(v) for key, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", out)}


@pytest.mark.parametrize("stages,xasync", [(1, False), (2, True)])
def test_gluon_pdl_loads_weights_before_waiting_sm90(stages, xasync):
    # programmatic dependent launch (C.PDL): the kernel waits for the one before it
    # (griddepcontrol.wait) before any x load or store; with the register prefetch the first
    # step's plane words load before the wait
    ptx = _compile_sm90(64, 128, 1, 1, 4, stages, xasync, exc=True, pdl=3).asm["ptx"]
    plain = _compile_sm90(64, 128, 1, 1, 4, stages, xasync, exc=True).asm["ptx"]
    assert "griddepcontrol" not in plain
    trigger = _compile_sm90(64, 128, 1, 1, 4, stages, xasync, exc=True, pdl=2).asm["ptx"]  # mode "reduce"
    assert "griddepcontrol.launch_dependents" in trigger and "griddepcontrol.wait" not in trigger
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("griddepcontrol.launch_dependents") > wait
    assert "st.global" not in ptx[:wait] and "cp.async" not in ptx[:wait]
    before = ptx[:wait].count("ld.global")
    if stages == 1:  # the two 16-byte plane-word loads a thread (lo and code), nothing else but the base
        assert before >= 2 and ".v4" in ptx[:wait]
    else:
        assert before <= 1  # the window base only


@pytest.mark.parametrize("bn,warps", [(64, 4), (64, 2), (32, 4)])
def test_gluon_x_in_step_frees_registers_sm90(bn, warps):
    # GluonConfig.x_ahead=False: the next step's x tile is not held in registers while this step's
    # decodes (ncu, run 50: bm 16 bn 64 4 warps took 136 registers, three programs an SM)
    ahead = _res_usage(_compile_sm90(bn, 128, 1, 1, warps, exc=True))
    step = _compile_sm90(bn, 128, 1, 1, warps, exc=True, xahead=False)
    rows8 = _compile_sm90(bn, 128, 1, 1, warps, exc=True, xahead=False, x8=True)
    assert _res_usage(step)["REG"] < ahead["REG"] - 24
    assert _res_usage(step)["STACK"] == 0 and "STL" not in _sass(step)
    # rows 8-15 not loaded: fewer global loads in the loop, and nothing spills
    assert _sass(rows8).count("LDG") < _sass(step).count("LDG")
    assert "STL" not in _sass(rows8)
    # a register cap holds (bm 16 bn 64 4 warps at 96: five programs an SM)
    capped = _compile_sm90(bn, 128, 1, 1, warps, exc=True, xahead=False, maxnreg=96 if warps == 4 else 168)
    assert _res_usage(capped)["REG"] <= (96 if warps == 4 else 168)


def _sass(k) -> str:
    return _sass_of(bytes(k.asm["cubin"]))


@functools.lru_cache(maxsize=16)
def _sass_of(cubin: bytes) -> str:
    # cuobjdump takes over a second a kernel and tests read a kernel's SASS more than once: the
    # same cubin disassembles to the same text
    import os
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("mt,stages,xasync,xahead,x8", [(1, 1, False, False, True), (1, 1, False, True, False),
                                                        (2, 2, True, True, False)])
def test_gluon_split_fixup_compile_sm90(mt, stages, xasync, xahead, x8):
    # OUT 2 (GluonConfig.fixup): the partners count in with a releasing atomic; the last split program
    # polls with relaxed loads, never an acquire (on sm_90 that invalidates the SM's whole L1,
    # where the other programs read x), and reads the partials from L2; OUT 1 (one split) has
    # no atomics at all. Nothing spills.
    fix = _compile_sm90(32, 128, mt, 1, 4, stages, xasync, exc=True, xahead=xahead, x8=x8, out=2, bias=True)
    one = _compile_sm90(32, 128, mt, 1, 4, stages, xasync, exc=True, xahead=xahead, x8=x8, out=1, bias=True)
    ptx, ptx1 = fix.asm["ptx"], one.asm["ptx"]
    assert "atom.global.gpu.release.add" in ptx and "ld.global.gpu.relaxed" in ptx
    assert "acquire" not in ptx and "ld.global.cg" in ptx
    assert not re.search(r"\b(atom|red)\.global", ptx1)
    for k in (fix, one):
        assert "STL" not in _sass(k)


def test_gluon_config_validation():
    from glyd.kernels import GluonConfig, TcConfig  # noqa: F401

    GluonConfig(bm=16, bn=32, bk=128)
    GluonConfig(bm=64, bn=32, bk=128)
    GluonConfig(bm=16, bn=64, bk=256, prefetch=True)
    GluonConfig(bm=16, bn=16, bk=64, warps=1)
    for bad in (dict(bm=128), dict(bn=16, warps=4), dict(bn=16, bm=64, warps=4), dict(bk=32), dict(warps=8)):
        with pytest.raises(ValueError, match="GluonConfig"):
            GluonConfig(**{**dict(bm=16, bn=32, bk=128), **bad})


def test_x_in_step_config_is_checked():
    from glyd.kernels import GluonConfig, TcConfig  # noqa: F401

    base = dict(bm=16, bn=64, bk=128, prefetch=True)
    cfg = GluonConfig(**base, x_ahead=False, x_rows8=True, maxnreg=96)
    assert (cfg.x_ahead, cfg.x_rows8, cfg.maxnreg) == (False, True, 96)
    for bad in (dict(prefetch=False), dict(ring=2, ring_x=True)):  # x must be a prefetched register tile
        with pytest.raises(ValueError, match="x_ahead"):
            GluonConfig(**{**base, **bad, "x_ahead": False})
    with pytest.raises(ValueError, match="x_rows8"):
        GluonConfig(**{**base, "bm": 32, "x_rows8": True})
    for bad in (dict(maxnreg=16), dict(maxnreg=300)):
        with pytest.raises(ValueError, match="maxnreg"):
            GluonConfig(**{**base, **bad})
    with pytest.raises(TypeError, match="maxnreg"):  # the tc kernel has no register cap
        TcConfig(bm=16, bn=64, bk=128, stages=1, maxnreg=96)


def test_ring_config_is_checked():
    # the async-copy ring exists only in the Gluon kernel with prefetch
    from glyd.kernels import GluonConfig, TcConfig  # noqa: F401

    ok = GluonConfig(bm=16, bn=32, bk=128, prefetch=True, ring=3, ring_x=True)
    assert (ok.ring, ok.ring_x) == (3, True)
    with pytest.raises(ValueError, match="ring"):
        GluonConfig(bm=16, bn=32, bk=128, ring=3)  # no prefetch
    with pytest.raises(TypeError, match="ring"):
        TcConfig(bm=16, bn=32, bk=128, prefetch=True, stages=1, ring=3)  # not gluon
    with pytest.raises(ValueError, match="ring"):
        GluonConfig(bm=16, bn=32, bk=128, prefetch=True, ring=0)
    with pytest.raises(ValueError, match="ring_x"):
        GluonConfig(bm=16, bn=32, bk=128, prefetch=True, ring_x=True)  # no ring
    assert GluonConfig(bm=64, bn=32, bk=128, prefetch=True, ring=3, ring_x=True).ring_x  # four x tiles
    assert GluonConfig(bm=16, bn=32, bk=128, exc_tile=True).exc_tile
    with pytest.raises(ValueError, match="exc_tile"):
        GluonConfig(bm=16, bn=32, bk=128, exc_tile=True, exc_after=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_gluon_needs_a_gpu():
    from glyd import kernels
    from glyd.kernels import GluonConfig, TcConfig  # noqa: F401

    _gluon()
    p = glyd.pack(random_weights(32, 128, "normal"), "fixed12")
    with pytest.raises(ValueError, match="Gluon on a CUDA GPU"):
        kernels.linear(torch.randn(2, 128).to(torch.bfloat16), p, None, GluonConfig(bm=16, bn=32, bk=128))


@pytest.mark.gpu
@pytest.mark.gpu_sample(every=10)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("bm,bn,warps,ring", [(16, 32, 4, 1), (16, 32, 4, 2), (16, 64, 2, 1), (16, 64, 4, 1),
                                              (32, 64, 2, 3), (64, 32, 4, 2), (64, 64, 4, 2)])
@pytest.mark.parametrize("m", [1, 7, 16, 40, 64])
@pytest.mark.parametrize("split", [0, 5])
def test_gluon_exc_tile_many_exceptions_gpu(bm, bn, warps, ring, m, split):
    # rows with far more exceptions than the 16 loaded before the K loop: the step after the loop
    # walks the rest, 16 at a time (every exc_tile default tile, and the ring's wait before it)
    from glyd import kernels
    from glyd.kernels import GluonConfig, TcConfig  # noqa: F401

    w = random_weights(300, 1024, "normal", "cuda")
    tiny = torch.full((1,), 1e-30, device="cuda").to(torch.bfloat16)
    w[3, ::13] = tiny  # 79 exceptions in one row
    w[40:44, 100:130] = -tiny  # 120 in four rows of one tile
    w[299, :20] = tiny  # the last row, a partial tile at bn 64
    p = glyd.pack(w, "fixed12")
    assert p.arrays["exc_idx"].numel() > 200
    x = torch.randn(m, 1024, device="cuda").to(torch.bfloat16)
    bias = torch.randn(300, device="cuda").to(torch.bfloat16)
    cfg = GluonConfig(bm=bm, bn=bn, bk=128, warps=warps, prefetch=True, split=split, ring=ring, ring_x=ring > 1, exc_tile=True)
    _check(kernels.linear(x, p, bias, cfg), x, w, bias)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("bm,bn,chunk,split,m", [(16, 64, 64, 0, 8), (16, 32, 32, 5, 2), (32, 64, 64, 3, 30),
                                                 (64, 64, 32, 0, 64)])
def test_gluon_exception_chunk_gpu(bm, bn, chunk, split, m):
    # GluonConfig.exc_chunk with 0.1% of weights exceptions (real weights' rate) and rows of far more, shared among
    # split programs (round j past the preloaded ones by split j mod splits): within the float64 bound of
    # chunk 16's, the same bits twice
    from glyd import kernels
    from glyd.kernels import GluonConfig

    w = random_weights(1000, 3584, "normal", "cuda")
    w.view(-1)[torch.randint(0, w.numel(), (w.numel() // 1000,), device="cuda")] = torch.tensor(
        1e-30, device="cuda").to(torch.bfloat16)
    w[7, ::11] = torch.tensor(-1e-30, device="cuda").to(torch.bfloat16)  # 326 in one row
    p = glyd.pack(w, "fixed12")
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    bias = torch.randn(1000, device="cuda").to(torch.bfloat16)
    cfg = GluonConfig(bm=bm, bn=bn, bk=128, prefetch=True, split=split, exc_tile=True, exc_chunk=chunk)
    y = kernels.linear(x, p, bias, cfg)
    _check(y, x, w, bias)
    assert torch.equal(kernels.linear(x, p, bias, cfg).view(torch.int16), y.view(torch.int16))
    # by the accumulators' own threads (exc_rows), with and without x rows 8-15 (x_rows8 at M <= 8): fp32 FMAs,
    # another order of the sums; the same bits twice
    for extra in (dict(exc_rows=True), dict(exc_rows=True, x_ahead=False, x_rows8=bm == 16)):
        yr = kernels.linear(x, p, bias, cfg.replace(**extra))
        _check(yr, x, w, bias)
        assert torch.equal(kernels.linear(x, p, bias, cfg.replace(**extra)).view(torch.int16), yr.view(torch.int16))
    with pytest.raises(ValueError, match="exc_chunk"):
        GluonConfig(exc_chunk=48)
    with pytest.raises(ValueError, match="exc_rows"):
        GluonConfig(exc_rows=1)


@pytest.mark.gpu
@pytest.mark.gpu_sample(every=24)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("bm,bn,bk,warps", [(16, 64, 256, 4), (16, 32, 128, 4), (16, 32, 256, 4), (16, 64, 64, 4),
                                            (32, 32, 128, 4), (64, 64, 128, 4), (16, 64, 64, 1), (32, 16, 128, 1),
                                            (16, 64, 128, 2), (64, 64, 64, 2)])
@pytest.mark.parametrize("m", [1, 5, 16, 33, 64])
@pytest.mark.parametrize("prefetch,split", [(0, 0), (1, 0), (1, 5), (2, 0), (2, 5), (3, 0), (3, 5), (4, 0), (4, 5)])
def test_gluon_matches_reference_gpu(bm, bn, bk, warps, m, prefetch, split):
    from glyd import kernels
    from glyd.kernels import GluonConfig, TcConfig  # noqa: F401

    # prefetch 2: two steps ahead (bm 16 only); 3: the async-copy ring of 4 steps (ring);
    # 4: the same with x in the ring (ring_x: all 1, 2 or 4 x tiles)
    _gluon()
    depth = 2 if prefetch == 2 else 1
    w = random_weights(1000, 3584, "normal", "cuda")  # with exceptions (values far below the window)
    p = glyd.pack(w, "fixed12")
    assert p.arrays["exc_idx"].numel() > 0
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    bias = torch.randn(1000, device="cuda").to(torch.bfloat16)
    # split 5 leaves the last program of each tile fewer steps than the others (and one, at bk 64)
    y = kernels.linear(x, p, bias, GluonConfig(bm=bm, bn=bn, bk=bk, warps=warps, prefetch=prefetch > 0, prefetch_depth=depth,
                                                split=split, ring=4 if prefetch >= 3 else 1, ring_x=prefetch == 4))
    _check(y, x, w, bias)
    if prefetch == 1 and split == 0:  # the exception pass after the tile kernel instead of beside it
        y2 = kernels.linear(x, p, bias, GluonConfig(bm=bm, bn=bn, bk=bk, warps=warps, prefetch=True, exc_after=True))
        torch.cuda.synchronize()
        _check(y2, x, w, bias)
    if prefetch in (1, 4):  # the exceptions inside the tile kernel (exc_tile), split or not
        y3 = kernels.linear(x, p, bias, GluonConfig(bm=bm, bn=bn, bk=bk, warps=warps, prefetch=True, split=split, ring=4 if prefetch == 4 else 1, ring_x=prefetch == 4, exc_tile=True))
        _check(y3, x, w, bias)
    tc = kernels.linear(x, p, bias, TcConfig(bm=16, bn=max(bn, 16), bk=bk, stages=1))
    # same products, other summation order: within bf16 rounding of each other
    assert ((y.float() - tc.float()).abs() <= 2**-7 * tc.float().abs() + 1e-3 * tc.float().abs().max()).all()


@pytest.mark.gpu
@pytest.mark.gpu_sample(every=24)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("bm,bn,warps", [(16, 64, 4), (16, 64, 2), (16, 32, 4), (16, 16, 1), (32, 64, 4),
                                         (64, 32, 4)])
@pytest.mark.parametrize("m", [1, 5, 8, 9, 33])
@pytest.mark.parametrize("split", [0, 5])
@pytest.mark.parametrize("xahead,x8,maxnreg", [(False, False, 0), (False, True, 0), (True, True, 0),
                                               (False, True, 96)])
def test_gluon_x_in_step_gpu(bm, bn, warps, m, split, xahead, x8, maxnreg):
    # x rows loaded in their own step (x_ahead=False), only 8 of them at M <= 8 (x_rows8), a
    # register cap: the same products as the reference, with the exceptions in the tile
    from glyd import kernels
    from glyd.kernels import GluonConfig, TcConfig  # noqa: F401

    if x8 and bm != 16:
        pytest.skip("x_rows8 needs bm 16")
    w = random_weights(1000, 3584, "normal", "cuda")
    p = glyd.pack(w, "fixed12")
    x = torch.randn(m, 3584, device="cuda").to(torch.bfloat16)
    bias = torch.randn(1000, device="cuda").to(torch.bfloat16)
    cfg = GluonConfig(bm=bm, bn=bn, bk=128, warps=warps, prefetch=True, split=split, exc_tile=True, x_ahead=xahead, x_rows8=x8, maxnreg=maxnreg)
    _check(kernels.linear(x, p, bias, cfg), x, w, bias)


@pytest.mark.gpu
@pytest.mark.gpu_sample(every=18)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cfg", [dict(bm=16, bn=32, warps=4, x_ahead=False, x_rows8=True),
                                 dict(bm=16, bn=64, warps=4), dict(bm=16, bn=32, warps=4, ring=2),
                                 dict(bm=32, bn=64, warps=4, ring=2, ring_x=True),
                                 dict(bm=64, bn=32, warps=4, ring=2, ring_x=True), dict(bm=16, bn=16, warps=1)])
@pytest.mark.parametrize("m", [1, 5, 16, 40])
@pytest.mark.parametrize("split", [2, 3, 7])
@pytest.mark.parametrize("weights", ["exceptions", "none"])
def test_gluon_split_fixup_same_bits_gpu(cfg, m, split, weights):
    # GluonConfig.fixup: the last split program of each tile sums the partials in the kernel, in
    # finalize's order: the same bits as the two-kernel split-K, twice in a row (the counters are
    # left at zero), with and without exceptions (in the tile, or none at all) and bias
    from glyd import kernels
    from glyd.kernels import GluonConfig
    from glyd.kernels._common import counters

    n, k = 1000, 3584
    if weights == "none":  # one binade: no exceptions, so no exception step either
        w = (torch.rand(n, k, device="cuda") * 0.5 + 0.5).to(torch.bfloat16)
    else:
        w = random_weights(n, k, "normal", "cuda")
    p = glyd.pack(w, "fixed12")
    assert (p.arrays["exc_idx"].numel() == 0) == (weights == "none")
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    base = GluonConfig(bk=128, prefetch=True, split=split, exc_tile=weights != "none", **cfg)
    for b in (None, bias):
        y0 = kernels.linear(x, p, b, base)
        for _ in range(2):
            y = kernels.linear(x, p, b, base.replace(fixup=True))
            torch.cuda.synchronize()
            assert int(counters(torch.device("cuda"), 1).abs().sum()) == 0
            assert torch.equal(y.view(torch.int16), y0.view(torch.int16))
    _check(y, x, w, bias)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 9, 64])
def test_gluon_one_split_stores_bf16_gpu(m):
    # one split (and no exception pass): the tile kernel writes the bf16 result itself
    from glyd import kernels
    from glyd.kernels import GluonConfig
    from glyd.kernels import _common as C

    w = random_weights(256, 1024, "normal", "cuda")
    p = glyd.pack(w, "fixed12")
    x = torch.randn(m, 1024, device="cuda").to(torch.bfloat16)
    bias = torch.randn(256, device="cuda").to(torch.bfloat16)
    calls = []
    real = C.finalize_launch  # the split-K reduce, as the launcher plans it
    C.finalize_launch = lambda *a: calls.append(a) or real(*a)
    try:
        y = kernels.linear(x, p, bias, GluonConfig(bm=16, bn=32, bk=128, prefetch=True, split=1, exc_tile=True))
    finally:
        C.finalize_launch = real
    assert not calls
    _check(y, x, w, bias)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gluon_rejects_padded_columns_gpu():
    from glyd import kernels
    from glyd.kernels import GluonConfig, TcConfig  # noqa: F401

    _gluon()
    p = glyd.pack(random_weights(64, 1000, "normal", "cuda"), "fixed12")  # K = 1000: padded to 1024
    with pytest.raises(ValueError, match="multiple of bk"):
        kernels.linear(torch.randn(2, 1000, device="cuda").to(torch.bfloat16), p, None,
                       GluonConfig(bm=16, bn=32, bk=128))
