"""dense11 version 3's wgmma tile (``dense11_wgmma``; Hopper only): its slot order mirrored in torch, its config
and ``can_implement``, static checks compiled for sm_90 on any machine, products on the GPU against float64."""

from __future__ import annotations

import pytest
import torch

import glyd

from .conftest import needs_triton, random_weights
from .test_gluon import _res_usage, _sass, compile_gluon_sm90
from .test_linear import _check

pytestmark = needs_triton

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _wg():
    try:
        from glyd.kernels.dense11 import wgmma
    except ImportError as exc:  # a Triton without Gluon's Hopper module
        pytest.skip(f"no Gluon wgmma in this Triton: {exc}")
    return wgmma


def test_decoded_words_and_x_share_one_k_order():
    # the decoded words (gl.join as torch.stack on a new last dimension, as the kernel builds them) and the x tile
    # reach the MMA in the same permutation of a step's 128 columns, every column once, and each thread's k pairs
    # (2c, 2c + 1) and (2c + 8, 2c + 9) of a 16-wide chunk are 4 consecutive columns of its own run c
    _wg()
    from glyd.kernels.dense11 import wgmma_decode as wd

    def join(a, b):
        return torch.stack([a, b], -1)

    cq = torch.arange(16)
    c, q = cq // 4, cq % 4

    def half(h):  # weight i of lane word (c, q) of half h: column 32 c + 16 h + 4 q + i
        e = [32 * c + 16 * h + 4 * q + i for i in range(4)]
        return join(join(e[0], e[1]), join(e[2], e[3]))

    cols_w = join(half(0), half(1)).reshape([2] * 7)
    slots_w = cols_w.permute([d - 1 for d in wd.DECODE_ORDER.value[1:]]).reshape(-1)
    slots_x = torch.arange(128).reshape([2] * 7).permute([d - 1 for d in wd.X_ORDER.value[1:]]).reshape(-1)
    assert sorted(slots_w.tolist()) == list(range(128))
    assert torch.equal(slots_w, slots_x)
    # the ring copies x by slot pairs (4 bytes): slot pair p holds column pair _pair_column(p), the same order
    from glyd.kernels.dense11 import wgmma_ring

    cols = wgmma_ring._pair_column.fn(torch.arange(64))
    assert torch.equal(torch.stack([2 * cols, 2 * cols + 1], -1).reshape(-1), slots_x)
    # and with xperm, x permuted once a call into the same order (every step of K alike)
    assert wgmma_ring.slot_columns() == slots_x.tolist()
    x = torch.randn(3, 384).to(torch.bfloat16)
    xp = wgmma_ring.permute_x(x)
    assert xp.is_contiguous() and torch.equal(xp.view(3, 3, 128), x.view(3, 3, 128)[:, :, slots_x])
    with pytest.raises(ValueError, match="permute_x.*multiple of 128"):
        wgmma_ring.permute_x(x[:, :200])
    chunk = slots_w[:16].reshape(2, 4, 2)  # k = 8 T + 2 c + j of chunk (h 0, q 0)
    for lane in range(4):
        assert chunk[:, lane, :].reshape(-1).tolist() == [32 * lane + i for i in (0, 1, 2, 3)]


def test_run_words_give_each_lane_words_selectors():
    # _half reads each lane word's selectors from run words shifted by its nibble half (prmt reads a selector's low
    # 16 bits): they equal the lane word's own (the codes' low 3 bits; 0x3210 plus 4 at an escape; the rank in the
    # run, the word's escapes before each nibble plus the run's before the word clamped at 8) on random words
    import random

    rng = random.Random(0)
    for _ in range(2000):
        x = rng.getrandbits(32)
        f = x & (x >> 1) & (x >> 2) & 0x11111111  # _nib_esc
        before = rng.randrange(0, 33)
        sel_w, rank_w = (f * 4 + 0x32103210) & 0xFFFFFFFF, (f * 0x11111110 + min(before, 8) * 0x11111111) & 0xFFFFFFFF
        for h in (0, 16):
            nib = [(x >> (h + 4 * t)) & 0xF for t in range(4)]
            flags = [(f >> (h + 4 * t)) & 1 for t in range(4)]
            prior = bin(f & ((1 << h) - 1)).count("1")
            assert [((x & 0x77777777) >> (h + 4 * t)) & 0xF for t in range(4)] == [v & 7 for v in nib]
            assert [(sel_w >> (h + 4 * t)) & 0xF for t in range(4)] == [t + 4 * flags[t] for t in range(4)]
            assert [(rank_w >> (h + 4 * t)) & 0xF for t in range(4)] == [
                prior + sum(flags[:t]) + min(before, 8) for t in range(4)]


def test_config_checks():
    from glyd.kernels import Dense11WgConfig

    assert Dense11WgConfig().bm == 64 and Dense11WgConfig().prefetch
    for bad in (dict(bm=8), dict(bm=128), dict(bm=256, stages=3), dict(bm=512, stages=3, xperm=True),
                dict(xperm=True), dict(warps=8), dict(maxnreg=16), dict(ahead=True, prefetch=False),
                dict(after_mma=True, prefetch=False), dict(ahead=True, after_mma=True), dict(stages=1),
                dict(stages=2, pipe=True), dict(stages=3, ahead=True), dict(stages=2, after_mma=True), dict(stages=9)):
        with pytest.raises(ValueError, match="Dense11WgConfig"):
            Dense11WgConfig(**bad)
    for bad in (dict(prefetch=1), dict(fixup="yes"), dict(pipe=1), dict(ahead=1), dict(wave_split=1), dict(after_mma=1),
                dict(stages=3, xperm=1)):
        with pytest.raises(ValueError, match="prefetch|fixup|pipe|ahead|wave_split|after_mma|xperm"):
            Dense11WgConfig(**bad)
    assert Dense11WgConfig(stages=3, prefetch=False).stages == 3  # the ring places its own loads: prefetch moot
    assert Dense11WgConfig(stages=3, pipe=True).pipe
    with pytest.raises(TypeError):
        Dense11WgConfig(bn=32)  # one warpgroup: 64 rows, not a field
    assert [_wg().x_rows(m, 64) for m in (1, 16, 17, 33, 64, 65)] == [16, 16, 32, 64, 64, 64]
    assert _wg().x_rows(40, 16) == 16
    assert [_wg().x_rows(m, 256) for m in (65, 128, 129, 4608)] == [128, 128, 256, 256]
    assert Dense11WgConfig(bm=256, stages=2, xperm=True).xperm


def test_wave_split_takes_the_fewest_block_waves():
    # the split count against brute force over every count of splits that K's blocks allow (n splits of per blocks):
    # the fewest waves times blocks, the fewest splits among equals; bad sizes refused
    w = _wg()
    for tiles in (1, 7, 56, 72, 131, 592, 2376):
        for k in (128, 1024, 1152, 3584, 18944):
            for slots in (132, 264, 396):
                nb = -(-k // 1024)
                cost = {}
                for s in range(1, nb + 1):
                    per = -(-nb // s)
                    n = -(-nb // per)  # the splits made
                    cost[n] = -(-tiles * n // slots) * per
                best = min(cost.values())
                assert w.wave_split(tiles, k, slots) == min(n for n, c in cost.items() if c == best), (tiles, k, slots)
    with pytest.raises(ValueError, match="wave_split"):
        w.wave_split(0, 3584, 396)


def test_can_implement():
    from glyd.kernels import Dense11WgConfig
    from glyd.kernels.registry import Device, Problem

    k = _wg().Dense11WgKernel
    cfg = Dense11WgConfig()
    hopper = Device("cuda", "NVIDIA H200", (9, 0), 132, features=frozenset({"gluon", "wgmma", "tma"}))
    ampere = Device("cuda", "NVIDIA A100", (8, 0), 108, features=frozenset({"gluon"}))
    assert k.can_implement(Problem("dense11", 32, 4608, 3584, 3584, 3), hopper, cfg) == (True, "")
    ok, why = k.can_implement(Problem("dense11", 32, 4608, 3584, 3584, 3), ampere, cfg)
    assert not ok and "Hopper" in why
    ok, why = k.can_implement(Problem("dense11", 32, 4608, 3584, 3584, 2), hopper, cfg)
    assert not ok and "version 3" in why
    ok, why = k.can_implement(Problem("dense11", 32, 4608, 1100, 1120, 3), hopper, cfg)
    assert not ok and "multiple of 128" in why
    ok, why = k.can_implement(Problem("fixed12", 32, 4608, 3584, 3584, 1), hopper, cfg)
    assert not ok


def test_needs_a_cuda_gpu():
    from glyd import kernels
    from glyd.kernels import Dense11WgConfig

    p = glyd.pack(random_weights(64, 256, "normal"), "dense11")
    with pytest.raises(ValueError, match="Hopper|Gluon|dense11_wgmma"):
        kernels.linear(torch.randn(2, 256).to(torch.bfloat16), p, None, Dense11WgConfig())


def _compile_sm90(bt, out=1, exc=False, pf=True, bias=False, pipe=False, ea=False, maxnreg=None, stages=0, xp=False):
    # the register tile, or with stages the ring (pipe: its MMA in flight beside the next decode; xp: x in slot order)
    w = _wg()
    words, xl, mma, a_op, xsl, ol = w.layouts(64, bt, 4)
    ptrs = {"x_ptr": "*bf16", "code_ptr": "*i32", "sm_ptr": "*i32", "esc_ptr": "*i32", "ebase_ptr": "*i32",
            "eoff_ptr": "*u16", "rowptr_ptr": "*i32", "eidx_ptr": "*i64", "vals_ptr": "*i16", "part_ptr": "*fp32",
            "out_ptr": "*bf16", "bias_ptr": "*bf16", **({"cnt_ptr": "*i32"} if out == 2 else {})}
    const = dict(BT=bt, WL=words, RL=w.run_layout(4), ML=mma, AL=a_op, XSL=xsl, OL=ol, OUT=out, HAS_BIAS=bias,
                 EXC=exc, CS=32, **({} if out == 2 else {"cnt_ptr": None}))
    if stages:
        from glyd.kernels.dense11 import wgmma_ring

        ring = dict(const, XL=xl if xp else wgmma_ring.pair_layout(bt), S=stages, PIPE=pipe, LEAD=stages - pipe, XP=xp)
        ptrs = {"x_ptr": "*bf16", "xp_ptr": "*bf16", **ptrs}
        return compile_gluon_sm90(wgmma_ring._d11_wg_ring_kernel, ring, ptrs, num_warps=4, maxnreg=maxnreg)
    const.update(XL=xl, PF=pf, PIPE=pipe, EA=ea)
    return compile_gluon_sm90(w._d11_wg_kernel, const, ptrs, num_warps=4, maxnreg=maxnreg)


_WORDS_OPTIONS = [(1, False, True, False, False), (0, True, True, False, False), (2, True, False, False, False),
                  (1, True, True, True, False), (0, True, True, False, 1), (1, True, True, True, 1),
                  (0, True, True, False, 2), (1, True, True, True, 2)]  # (out, exc, pf, pipe, ea)
_WORDS_BT = [16, 32, 64]


# compiles for sm_90: in the default run each option row once, at each x-row count in turn (every row and every bt,
# 8 compiles; cpu_sample(every=2) ran 13 of the 24, each row at one to three of them); the rest are slow
@pytest.mark.parametrize("bt,out,exc,pf,pipe,ea", [
    pytest.param(bt, *row, marks=() if bt == _WORDS_BT[i % len(_WORDS_BT)] else pytest.mark.slow)
    for i, row in enumerate(_WORDS_OPTIONS) for bt in _WORDS_BT])
def test_decoded_words_are_the_register_operand_sm90(bt, out, exc, pf, pipe, ea):
    # the decoded words reach wgmma from registers: in the K loop no shared loads (wgmma reads x itself), only x's
    # stores, 8 wgmmas a step (one a 16-wide k chunk), the row's escape ranks by 2 + 1 shuffles a row of the thread
    # (two rows), one popcount a code plane and row, and nothing spills; the windows ahead or after the MMA (ea 1, 2):
    # still one step's shuffles a step
    from .test_ws import _loops

    k = _compile_sm90(bt, out=out, exc=exc, pf=pf, bias=out == 1, pipe=pipe, ea=ea)
    assert "warp_group_dot" in k.asm["ttgir"]
    res = _res_usage(k)
    assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, res
    loops = [lp for lp in _loops(_sass(k)) if any("GMMA" in o for o in lp)]
    assert len(loops) == 1
    ops = [o.split(".")[0] for o in loops[0]]
    assert ops.count("HGMMA") == 8 and ops.count("LDS") == 0 and ops.count("STS") > 0
    assert ops.count("SHFL") == 6 and ops.count("POPC") >= 8
    assert "STL" not in ops and "LDL" not in ops


@pytest.mark.cpu_sample(every=2)  # compiles for sm_90: half the configs in the default run
@pytest.mark.parametrize("bt,stages,out,exc,pipe,xp", [(16, 3, 1, False, False, False), (16, 2, 0, True, False, False),
                                                       (32, 4, 2, True, False, False), (64, 3, 0, True, False, False),
                                                       (16, 3, 0, True, True, False), (64, 4, 1, True, True, False),
                                                       (64, 3, 0, True, False, True), (16, 3, 1, False, True, True),
                                                       (128, 3, 0, True, False, True), (128, 2, 1, False, False, True),
                                                       (128, 3, 1, True, True, True)])
def test_ring_copies_words_and_x_by_cp_async_sm90(bt, stages, out, exc, pipe, xp):
    # the ring (stages): in the K loop the words and x arrive by cp.async (LDGSTS), x never through registers (no
    # STS), the words read back from shared memory (each thread its own copies), 8 wgmmas a step, one
    # step's shuffles, the escape windows the only global loads (two words a run of two rows, 4 with the block
    # start's), no spill; 3 barriers a step (x's, the stage's free, the pass's after the copies). xp (xperm): x's
    # copies 16 bytes each, 128 registers at 64 x rows (168 with 4-byte copies), 168 at 128
    from .test_ws import _loops

    k = _compile_sm90(bt, out=out, exc=exc, bias=out == 1, stages=stages, pipe=pipe, xp=xp)
    res = _res_usage(k)
    assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, res
    cap = (168 if bt == 128 else 128) if xp else 232 if pipe else 168
    assert res["REG"] <= cap, res  # 3 programs an SM at bm 64 (pipe: 2), 4-5 at 16 x rows
    loops = [lp for lp in _loops(_sass(k)) if any("GMMA" in o for o in lp)]
    assert len(loops) == 1
    ops = [o.split(".")[0] for o in loops[0]]
    assert ops.count("HGMMA") == 8 and ops.count("STS") == 0 and ops.count("SHFL") == 6
    # codes: 3 planes x 2 rows; sm: 2 halves x 2 rows of 16 bytes; x: bt / 2 pairs (4 bytes) or bt / 8 16-byte pieces
    assert ops.count("LDGSTS") == 6 + 4 + (bt // 8 if xp else bt // 2)
    assert ops.count("LDG") <= 8 and ops.count("BAR") == 3
    assert "STL" not in ops and "LDL" not in ops


def _gpu_weights(n, k, kind, seed):
    torch.manual_seed(seed)
    w = random_weights(n, k, kind, "cuda")
    p = glyd.pack(w, "dense11")
    assert p.version == 3
    return w, p


REF_SHAPES = [(1000, 3584, "normal"), (70, 1152, "wide"), (4608, 3584, "normal")]
REF_CONFIGS = [(64, 1, False), (16, 0, True), (32, 3, False)]  # (bm, split, bias)


def _reference_inputs(n, k, kind):
    # the weights (escapes in every run's ranks, a short last block at K 1152, many escapes and exceptions with "wide"
    # weights), their packing and a bias
    w, p = _gpu_weights(n, k, kind, n + k)
    from glyd.kernels.dense11.decode_v2 import prepare

    prep = prepare(p)
    assert prep.nescw > 0 and (prep.nexc > 0 or kind == "normal")
    return w, p, torch.randn(n, device="cuda").to(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("n,k,kind", REF_SHAPES)
def test_matches_reference_gpu(n, k, kind):
    # ragged N, M = 2-100 (one to two x tiles), splits (the rounds of exceptions shared), a bias, the fixup: within the
    # float64 bound; prefetch on and off, pipe on and off, the windows ahead or after the MMA, and the fixup and the
    # finalize, give the same bits (the same MMAs in the same order)
    from glyd import kernels
    from glyd.kernels import Dense11WgConfig

    w, p, b = _reference_inputs(n, k, kind)
    for m in (2, 16, 17, 33, 64, 100):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        for bm, split, bias in REF_CONFIGS:
            cfg = Dense11WgConfig(bm=bm, split=split)
            y = kernels.linear(x, p, b if bias else None, cfg)
            _check(y, x, w, b if bias else None)
            assert torch.equal(kernels.linear(x, p, b if bias else None, cfg.replace(prefetch=False)), y), (m, bm)
            assert torch.equal(kernels.linear(x, p, b if bias else None, cfg.replace(pipe=True)), y), (m, bm)
            for ahead in (cfg.replace(ahead=True), cfg.replace(ahead=True, pipe=True), cfg.replace(after_mma=True),
                          cfg.replace(after_mma=True, pipe=True)):
                assert torch.equal(kernels.linear(x, p, b if bias else None, ahead), y), (m, ahead)
            if split == 0:  # the split by waves: another summation order, the same bound
                _check(kernels.linear(x, p, b if bias else None, cfg.replace(wave_split=True, waves=3)), x, w,
                       b if bias else None)
            if split != 1:
                fix = kernels.linear(x, p, b if bias else None, cfg.replace(fixup=True))
                assert torch.equal(fix, y), (m, bm, split)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("bm,split,bias", REF_CONFIGS)
@pytest.mark.parametrize("n,k,kind", REF_SHAPES)
def test_ring_gives_the_register_tiles_bits_gpu(n, k, kind, bm, split, bias):
    # the ring (stages: x copied in slot pairs into an int32 view of the MMA's tile, or with xperm 16-byte pieces of x
    # permuted once) gives the register tile's bits at M = 2-100: 3 stages at every config, with and without xperm, 2 and 4 and 3 with pipe at bm 64 (each is a compile a x-row count; a test a
    # config spreads them over the GPU set's workers)
    from glyd import kernels
    from glyd.kernels import Dense11WgConfig

    _, p, b = _reference_inputs(n, k, kind)
    cfg = Dense11WgConfig(bm=bm, split=split)
    rings = [cfg.replace(stages=3), cfg.replace(stages=3, xperm=True)]
    if bm == 64:
        rings += [cfg.replace(stages=2), cfg.replace(stages=4), cfg.replace(stages=3, pipe=True)]
    for m in (2, 16, 17, 33, 64, 100):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        y = kernels.linear(x, p, b if bias else None, cfg)
        for ring in rings:
            assert torch.equal(kernels.linear(x, p, b if bias else None, ring), y), (m, ring)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("bm,stages,pipe", [(128, 3, False), (128, 3, True), (256, 2, False)])
def test_ring_of_128_and_256_x_rows_gpu(bm, stages, pipe):
    # prompts (xperm, bm 128 / 256: each weight decoded once for that many x rows): ragged N, escapes and exceptions,
    # M from one partial tile to three, a bias, splits: within the float64 bound; split 1 without the bias and the
    # same tile with split 2 and the finalize: the same bound
    from glyd import kernels
    from glyd.kernels import Dense11WgConfig

    w, p, b = _reference_inputs(70, 1152, "wide")
    cfg = Dense11WgConfig(bm=bm, stages=stages, pipe=pipe, xperm=True)
    for m in (3, 100, 129, 256, 300, 700):
        x = torch.randn(m, 1152, device="cuda").to(torch.bfloat16)
        _check(kernels.linear(x, p, b, cfg.replace(split=1)), x, w, b)
        _check(kernels.linear(x, p, None, cfg.replace(split=2)), x, w, None)
    w, p, b = _reference_inputs(1000, 3584, "normal")
    x = torch.randn(333, 3584, device="cuda").to(torch.bfloat16)
    _check(kernels.linear(x, p, b, cfg), x, w, b)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
def test_strided_x_and_exact_products_gpu():
    # x with a row stride not 16-byte aligned (copied first) gives the contiguous x's bits; one-hot x rows give
    # the weights themselves, bit for bit (each product is one weight times 1, summed with zeros)
    from glyd import kernels
    from glyd.kernels import Dense11WgConfig

    w, p = _gpu_weights(192, 2048, "wide", 7)
    x = torch.randn(40, 2048 + 3, device="cuda").to(torch.bfloat16)[:, :2048]
    assert x.stride(0) % 8
    cfg = Dense11WgConfig(bm=64, split=1)
    assert torch.equal(kernels.linear(x, p, None, cfg), kernels.linear(x.contiguous(), p, None, cfg))
    ring = cfg.replace(stages=3)
    assert torch.equal(kernels.linear(x, p, None, ring), kernels.linear(x.contiguous(), p, None, cfg))
    assert torch.equal(kernels.linear(x, p, None, ring.replace(xperm=True)), kernels.linear(x.contiguous(), p, None, cfg))
    cols = torch.randint(0, 2048, (64,), device="cuda")
    eye = torch.zeros(64, 2048, device="cuda", dtype=torch.bfloat16)
    eye[torch.arange(64), cols] = 1
    for c in (cfg, cfg.replace(bm=128, stages=2, xperm=True)):  # one-hot rows: exact at any tile
        y = kernels.linear(eye, p, None, c)
        assert torch.equal(y.view(torch.int16), w[:, cols].t().contiguous().view(torch.int16)), c
