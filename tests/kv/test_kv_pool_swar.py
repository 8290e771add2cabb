"""The pool attention's page decode on 32-bit words (``AttentionConfig(swar=True)``, ``glyd.kv._triton_words``):
its decoded tiles bit for bit ``glyd.kv.fixed.unpack_blocks``'s, and the attention (under TRITON_INTERPRET=1
without a GPU) within TOL of float64 SDPA on fresh random pages: GQA groups of 1, 2 and 7, sequences of
different lengths with partial last pages, left padding and masked positions."""

from __future__ import annotations

import pytest
import torch

from glyd.errors import FormatError
from glyd.kv.fixed import pack_blocks, unpack_blocks
from glyd.kv.pool import FixedPagePool

from .conftest import all_bf16_patterns, bits_equal
from .test_kv_pool import TOL, rel_err, sdpa64, states

triton = pytest.importorskip("triton")


import triton.language as tl  # noqa: E402

from glyd.kernels._interp import isolated  # noqa: E402
from glyd.kv._triton_words import PAIR_EVEN, PAIR_ODD, _pairs, decode_words, perm, word_bases, word_order  # noqa: E402,E501


@isolated
@triton.jit
def _unpack_words(lo_ptr, code_ptr, base_ptr, meta_ptr, exc_ptr, out_ptr, P: tl.constexpr, TS: tl.constexpr,
                  D: tl.constexpr, PRMT: tl.constexpr):
    # one program a block: its tiles in word order, stored back through perm (channel order)
    blk = tl.program_id(0).to(tl.int64)
    ba, bb, e0, ne = word_bases(base_ptr, meta_ptr, blk, D)
    cols = perm(tl.arange(0, D // 2))[None, :]
    for t0 in tl.static_range(0, P, TS):
        a, b = decode_words(lo_ptr, code_ptr, exc_ptr, blk, t0, ba, bb, e0, ne, P, TS, D, PRMT)
        op = out_ptr + blk * (P * D) + (t0 + tl.arange(0, TS))[:, None] * D + cols
        tl.store(op, a)
        tl.store(op + D // 2, b)


@isolated
@triton.jit
def _reorder(x_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr):
    offs = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    tl.store(out_ptr + offs, word_order(tl.load(x_ptr + offs), R, C))


@pytest.mark.parametrize("c", [16, 64])
def test_query_loaded_in_channel_order_is_put_in_word_order(c):
    # the kernel reads the query with whole-row loads and reorders it in registers: column n of the result is
    # channel perm(n), as the decoded key tiles hold them
    x = torch.randn(16, c).to(torch.bfloat16)
    out = torch.empty_like(x)
    _reorder[(1,)](x, out, R=16, C=c)
    n = torch.arange(c)
    assert bits_equal(out, x[:, (n & ~3) | ((n >> 1) & 1) | ((n & 1) << 1)])


@isolated
@triton.jit
def _pair_words(lo_ptr, hi_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    lo = tl.load(lo_ptr + offs).to(tl.uint32, bitcast=True)
    hi = tl.load(hi_ptr + offs).to(tl.uint32, bitcast=True)
    tl.store(out_ptr + offs, _pairs(lo, hi, False, False).to(tl.int32, bitcast=True))
    tl.store(out_ptr + N + offs, _pairs(lo, hi, True, False).to(tl.int32, bitcast=True))


def prmt(a: torch.Tensor, b: torch.Tensor, sel: int) -> torch.Tensor:
    """PTX ``prmt.b32 d, a, b, sel`` (default mode, selectors without the sign bit): byte t of d is byte
    (nibble t of sel) of the 8 bytes b:a."""
    pool = torch.stack([(x.to(torch.int64) >> (8 * i)) & 0xFF for x in (a, b) for i in range(4)])
    return sum(pool[(sel >> (4 * t)) & 7] << (8 * t) for t in range(4)).to(torch.int64)


def test_prmt_selectors_give_the_interpreters_byte_pairs():
    # the GPU takes the pairs by prmt with PAIR_EVEN / PAIR_ODD, the interpreter by shifts and masks: the same
    # bits for any words (the interpreter cannot run the inline PTX; this ties its selectors to the twin)
    gen = torch.Generator().manual_seed(7)
    lo = torch.randint(-2**31, 2**31, (256,), generator=gen, dtype=torch.int64).to(torch.int32)
    hi = torch.randint(-2**31, 2**31, (256,), generator=gen, dtype=torch.int64).to(torch.int32)
    out = torch.empty(512, dtype=torch.int32)
    _pair_words[(1,)](lo, hi, out, N=256)
    twin = out.to(torch.int64) & 0xFFFFFFFF
    assert torch.equal(twin[:256], prmt(lo, hi, PAIR_EVEN.value))
    assert torch.equal(twin[256:], prmt(lo, hi, PAIR_ODD.value))


def word_unpack(pk: dict, sub_tile: int) -> torch.Tensor:
    n, p, d = pk["lo"].shape
    out = torch.empty(n, p, d, dtype=torch.bfloat16, device=pk["lo"].device)
    exc = pk["exc"] if pk["exc"].numel() else torch.zeros(1, dtype=torch.int32, device=out.device)
    _unpack_words[(n,)](pk["lo"].view(torch.int32), pk["code"].view(torch.int32), pk["base"], pk["meta"], exc, out,
                        P=p, TS=min(sub_tile, p), D=d, PRMT=out.is_cuda)  # prmt on a GPU
    return out


def special_blocks(n: int, p: int, d: int, seed: int) -> torch.Tensor:
    """Random blocks with per-channel scales, a few of every kind of value a window misses (+-0, subnormals,
    +-inf, NaN payloads, the largest exponents) in every channel position of a 32-bit word and both halves."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, p, d, generator=gen) * torch.exp(2 * torch.randn(n, 1, d, generator=gen))).to(torch.bfloat16)
    pats = all_bf16_patterns()
    odd = torch.cat([pats[:40], pats[32768:32808], pats[0x7F00:0x7FC0], pats[0xFF70:0xFFB0]])
    flat = x.view(-1)
    where = torch.randperm(flat.numel(), generator=gen)[: odd.numel()]
    flat[where] = odd[torch.randperm(odd.numel(), generator=gen)]
    x[0, 1, :] = 0.0  # a whole row of exceptions
    x[-1, -1, : d // 2] = pats[0x7F80]  # +inf across half A of the last row
    return x


@pytest.mark.parametrize("n,p,d,ts", [(3, 16, 32, 16), (2, 32, 64, 16), (2, 64, 128, 32)])
def test_word_decode_gives_back_every_bit(n, p, d, ts):
    x = special_blocks(n, p, d, seed=p + d)
    pk = pack_blocks(x)
    assert pk["exc"].numel() > 100 and pk["meta"][:, 1].min() > 0  # every block patches exceptions
    ref = unpack_blocks(pk["lo"], pk["code"], pk["base"], pk["meta"], pk["exc"])
    assert bits_equal(ref, x)
    assert bits_equal(word_unpack(pk, ts), x)


@pytest.mark.parametrize("ts", [16, 32])
def test_word_patch_puts_each_exception_in_its_half_of_its_word(ts):
    # the patch works on the four word tiles (two channels a 32-bit word): exceptions at each of a word's four
    # channels, in both halves, at the first and last row of every sub-tile, next to each other in one word and
    # alone in a word whose other value stays decoded from its window
    gen = torch.Generator().manual_seed(ts)
    p, d = 64, 128
    x = (torch.rand(2, p, d, generator=gen) + 1.0).to(torch.bfloat16)  # one exponent: a window holds all
    rows = [r for t0 in range(0, p, ts) for r in (t0, t0 + ts - 1)]
    chans = [0, 1, 2, 3, 9, 14, 23, 64, 65, 66, 67, 77, 82, 127]
    for r in rows:
        x[0, r, chans] = float("inf")
        x[1, r, [c + (r % 4) for c in (4, 68)]] = 0.0
    pk = pack_blocks(x)
    assert pk["exc"].numel() == len(rows) * (len(chans) + 2)
    assert bits_equal(word_unpack(pk, ts), x)


@pytest.mark.parametrize("extra", [0, 1, 2])
def test_word_patch_takes_the_entries_in_arena_order(extra):
    # the patch loop takes two entries a trip (the second masked past the block's end): odd and even counts,
    # and an entry repeated with another value later in the block's range wins, as in one entry a trip
    x = (torch.rand(1, 64, 128, generator=torch.Generator().manual_seed(extra)) + 1.0).to(torch.bfloat16)
    x[0, 5, 7] = x[0, 40, 70] = x[0, 63, 127] = 0.0
    pk = pack_blocks(x)
    assert pk["exc"].numel() == 3
    more = [(5 * 128 + 7, 0x4049), (40 * 128 + 70, 0xC2F7)][:extra]  # 3.14, -123.5 over the same values
    ents = pk["exc"].tolist()
    for k, (i, w) in enumerate(more):  # right after the entry it repeats: the same trip of the loop
        ents.insert(2 * k + 1, i | (w << 16))
    pk["exc"] = torch.tensor(ents, dtype=torch.int64).to(torch.int32)
    pk["meta"][0, 1] += extra
    want = x.clone().view(torch.int16)
    for i, w in more:
        want[0, i // 128, i % 128] = torch.tensor(w, dtype=torch.int32).to(torch.int16)
    for ts in (16, 32, 64):
        assert bits_equal(word_unpack(pk, ts), want.view(torch.bfloat16))


def test_word_decode_of_every_bf16_pattern():
    # all 65,536 patterns (it took every 7th block of them: 10,240), over blocks whose windows sit at
    # every fourth base from the lowest (0) to the highest (120)
    pats = all_bf16_patterns().reshape(64, 16, 64)  # 64 blocks of 16 x 64 (1,024 patterns each)
    pk = pack_blocks(pats.contiguous())
    assert {0, 120} <= set(pk["base"].unique().tolist())
    assert bits_equal(word_unpack(pk, 16), pats)


def test_word_decode_of_every_code_at_every_base_in_every_byte_lane():
    # the word decode adds the base to four codes of a word at once (no carry between bytes while
    # base <= 120): every base 0..120, each of the 16 codes in each byte lane of the code word and
    # of both halves, every low byte; no exception, so the window arithmetic alone decides the bits
    blocks = []
    r, c = torch.arange(16)[:, None], torch.arange(64)[None, :]
    for base in range(121):
        code = (c + r) % 16  # row r: lane l of word k holds code (4k + l + r) % 16: all 16 a lane over the rows
        hi = (code >> 3) << 7 | (base + (code & 7))
        lo = (c * 37 + r * 11 + base * 5) % 256
        blocks.append((hi << 8 | lo).to(torch.int16))
    x = torch.stack(blocks).view(torch.bfloat16)
    pk = pack_blocks(x)
    assert pk["exc"].numel() == 0 and pk["base"].unique().tolist() == list(range(121))
    assert bits_equal(word_unpack(pk, 16), x)


def ragged_pool(b, h, d, p, lens, gen, steps=2, device="cpu"):
    """A one-layer pool whose sequence ``i`` holds ``lens[i]`` tokens (a prompt and ``steps`` one-token writes of
    the longest, then each shorter sequence cut back: its partial page copied to the raw page, as
    ``benchmarks/kv.py``'s ``static_pool`` does); returns the pool and the keys and values (on the CPU)."""
    t = max(lens)
    pool = FixedPagePool(layers=1, batch=b, heads=h, head_dim=d, max_len=t + p, page=p, exc_fraction=1 / 8,
                         device=device)
    ks, vs = [], []
    for n in [t - steps] + [1] * steps:
        k, v = states(gen, b, h, n, d)
        pool.advance(n)
        pool.write(0, k.to(device), v.to(device))
        ks.append(k)
        vs.append(v)
    k, v = torch.cat(ks, 2), torch.cat(vs, 2)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    first = (lens_t // p) * p
    idx = (first[:, None] + torch.arange(p)).clamp_max(t - 1)[:, None, :, None].expand(b, h, p, d)
    for x, raw in ((k, pool.k.raw[0]), (v, pool.v.raw[0])):
        raw.copy_(torch.gather(x.view(torch.int16), 2, idx).view(torch.bfloat16))
    pool.lens.copy_(lens_t)
    return pool, k, v


def attend(pool, q, swar, **kw):
    from glyd.kv._triton_fixed import attention_triton

    return attention_triton(q, pool.lens, kw.pop("starts", None), pool.block_index, pool.k.layer(0), pool.v.layer(0),
                            0.125, swar=swar, **kw)


def masked_ref(q, k, v, lens, starts=None, valid=None):
    """float64 SDPA over each sequence's first ``lens[i]`` tokens (and ``valid``/``starts`` where given)."""
    t = k.shape[2]
    mask = torch.arange(t)[None, :] < torch.tensor(lens)[:, None]
    if starts is not None:
        mask &= torch.arange(t)[None, :] >= starts[:, None]
    if valid is not None:
        mask &= valid[:, :t]
    return sdpa64(q, k, v, 0.125, mask=mask)


@pytest.mark.parametrize("h,g,d,p,ts,lens", [
    pytest.param(2, 1, 32, 16, 16, [45, 17, 32]),
    pytest.param(1, 2, 64, 32, 16, [70, 33, 64, 5]),
    pytest.param(2, 7, 64, 32, 32, [95, 40]),
    pytest.param(1, 7, 128, 64, 32, [130, 64, 70], marks=pytest.mark.slow),
])
def test_swar_attention_matches_sdpa_and_the_byte_kernel(h, g, d, p, ts, lens):
    gen = torch.Generator().manual_seed(h * 1000 + g * 100 + d)
    b = len(lens)
    pool, k, v = ragged_pool(b, h, d, p, lens, gen)
    assert int(pool.k.used[0]) > 0 and int(pool.v.used[0]) > 0  # the exception patch runs
    q = torch.randn(b, h * g, d, generator=gen).to(torch.bfloat16)
    starts = (torch.arange(b, dtype=torch.int32) * 3).clamp_max(min(lens) - 1)  # left padding (none in row 0)
    ref = masked_ref(q, k, v, lens, starts=starts)
    out = attend(pool, q, True, starts=starts, num_splits=2, sub_tile=ts)
    assert rel_err(out, ref) <= TOL
    byte = attend(pool, q, False, starts=starts, num_splits=2, sub_tile=ts)
    assert rel_err(out, byte) <= 1e-3  # the same values, dots summed in another channel order
    one = attend(pool, q, True, starts=starts, num_splits=1, sub_tile=ts)  # one split: the raw page in it
    assert rel_err(one, ref) <= TOL


def test_swar_attention_drops_masked_positions_and_marks_lost_pages():
    gen = torch.Generator().manual_seed(11)
    lens = [75, 50, 38]
    pool, k, v = ragged_pool(3, 2, 32, 16, lens, gen)
    q = torch.randn(3, 4, 32, generator=gen).to(torch.bfloat16)
    valid = torch.ones(3, 96, dtype=torch.bool)
    valid[0, 3:9] = False  # inside a packed page
    valid[0, 66:70] = False  # inside the raw page
    valid[1, 15:35] = False  # across page boundaries
    valid[2, :4] = False
    for m in (valid, valid[:, :60].to(torch.uint8)):  # a row shorter than the sequence masks what is past it
        full = torch.zeros(3, 96, dtype=torch.bool)
        full[:, : m.shape[1]] = m != 0
        ref = masked_ref(q, k, v, lens, valid=full)
        assert rel_err(attend(pool, q, True, num_splits=2, valid=m), ref) <= TOL
    # a page whose exceptions were lost: NaN for that sequence only, never a plausible value
    pool.k.meta[0][int(pool.block_index[2, 1, 0]), 1] = -1
    out = attend(pool, q, True, num_splits=2)
    assert torch.isnan(out[2, 2:]).all() and not torch.isnan(out[:2]).any() and not torch.isnan(out[2, :2]).any()


def test_swar_is_a_validated_config_field_the_registry_passes_on():
    from glyd.kernels.registry import Device
    from glyd.kv._triton_fixed import AttentionConfig
    from glyd.kv.registry import KVProblem, by_name

    assert AttentionConfig().swar is False and AttentionConfig(swar=True).swar is True
    with pytest.raises(ValueError, match="swar"):
        AttentionConfig(swar=1)
    with pytest.raises(ValueError, match="num_stages"):
        AttentionConfig(num_stages=9)
    gen = torch.Generator().manual_seed(4)
    pool, _, _ = ragged_pool(2, 1, 32, 16, [40, 21], gen)
    q = torch.randn(2, 2, 32, generator=gen).to(torch.bfloat16)
    with pytest.raises(FormatError, match="swar"):
        attend(pool, q, "yes")
    for stages in (0, True, 2.0):  # True == 1 and 2.0 == 2 passed a test of membership
        with pytest.raises(FormatError, match="num_stages"):
            attend(pool, q, True, num_stages=stages)
    kc, cfg = by_name("kvf12_attention_triton", KVProblem("kvf12", "attention", 16, 32, 32, 2, "pool"),
                      Device("cpu", "cpu", interpreting=True), swar=True, num_stages=2)
    assert cfg.swar is True and cfg.num_stages == 2  # a launch option: the interpreter ignores it
    via = kc.launch(q, pool.lens, None, pool.block_index, pool.k.layer(0), pool.v.layer(0), 0.125, config=cfg,
                    num_splits=2)
    assert bits_equal(via, attend(pool, q, True, num_splits=2))


def test_more_splits_than_the_grid_holds_is_refused_before_a_launch():
    from glyd.kv._triton_fixed import attention_triton

    gen = torch.Generator().manual_seed(5)
    pool, _, _ = ragged_pool(1, 1, 32, 32, [40], gen)  # pages of 32: a launch the GPU would make
    q = torch.randn(1, 1, 32, generator=gen).to(torch.bfloat16)
    bidx = torch.zeros(1, 1, 65536, dtype=torch.int32)  # a split a page: 65,536 splits (the grid's z holds 65,535)
    with pytest.raises(FormatError, match="65,535"):
        attention_triton(q, pool.lens, None, bidx, pool.k.layer(0), pool.v.layer(0), 0.125, num_splits=65536)


@pytest.mark.slow
def test_swar_kernel_compiles_for_sm90_with_safe_dots():
    # compiled ahead of time (no GPU), as test_kv_fixed_attention checks the byte-wise decode: every bf16
    # tensor-core dot reduces over >= 4 * kWidth values (Triton 3.6's K = 16 dots on sm_90: glyd.kv._triton._scores)
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    helper = Path(__file__).resolve().parent / "_fixed_compile_check.py"
    r = subprocess.run([sys.executable, str(helper), "64,3,64,1", "128,7,32,1"],
                       env=dict(os.environ, TRITON_INTERPRET="0"), capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and "ptxas" in r.stderr:
        pytest.skip("no sm_90 compiler tools in this triton build")
    assert r.returncode == 0, r.stderr[-2000:]
    dots = re.findall(r"DOT d=(\d+) sub_tile=\d+ swar=1 M=\d+ K=(\d+) kWidth=(\d+)", r.stdout)
    assert {int(d) for d, *_ in dots} == {64, 128} and len(re.findall("CUBIN .* swar=1", r.stdout)) == 2
    for d, k, kw in dots:
        assert int(k) >= 4 * int(kw), (d, k, kw)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("g", [1, 2, 7])
def test_swar_on_gpu(g):
    # the decode bit for bit on the GPU; the attention at the H200 table's launch shape within TOL of float64
    # SDPA, beside the byte-wise decode
    x = special_blocks(4, 64, 128, seed=g)
    pk = {name: t.cuda() for name, t in pack_blocks(x).items()}
    assert bits_equal(word_unpack(pk, 32).cpu(), x)
    gen = torch.Generator().manual_seed(g)
    lens = [700, 64, 333, 1]
    gpu, k, v = ragged_pool(4, 4, 128, 64, lens, gen, device="cuda")
    q = torch.randn(4, 4 * g, 128, generator=gen).to(torch.bfloat16)
    ref = masked_ref(q, k, v, lens)
    for maxnreg, stages in ((None, None), (128, None), (96, 2)):
        out = attend(gpu, q.cuda(), True, maxnreg=maxnreg, num_stages=stages).cpu()
        assert rel_err(out, ref) <= TOL
    # the H100 table's launch from 4 sequences: 2-warp programs, 8 an SM, 128 registers
    out = attend(gpu, q.cuda(), True, num_warps=2, programs_per_sm=8, maxnreg=128, num_stages=2, pdl="combine").cpu()
    assert rel_err(out, ref) <= TOL
    assert rel_err(attend(gpu, q.cuda(), False, maxnreg=128).cpu(), ref) <= TOL


@pytest.mark.parametrize("pdl", ["combine", "all"])
def test_programmatic_dependent_launch_gives_the_same_bits(pdl):
    # AttentionConfig.pdl only moves launches (ignored off a Hopper GPU and under the interpreter): the same bits
    gen = torch.Generator().manual_seed(9)
    pool, _, _ = ragged_pool(2, 2, 32, 32, [100, 7], gen)
    q = torch.randn(2, 6, 32, generator=gen).to(torch.bfloat16)
    assert bits_equal(attend(pool, q, True, pdl=pdl), attend(pool, q, True))


@pytest.mark.parametrize("pdl", [True, "reduce", None, 1])
def test_a_pdl_mode_the_attention_does_not_have_is_named(pdl):
    from glyd.kv._triton_fixed import attention_triton

    gen = torch.Generator().manual_seed(5)
    pool, _, _ = ragged_pool(2, 1, 32, 16, [40, 21], gen)
    q = torch.randn(2, 2, 32, generator=gen).to(torch.bfloat16)
    with pytest.raises(FormatError, match=r"^pdl must be one of"):
        attention_triton(q, pool.lens, None, pool.block_index, pool.k.layer(0), pool.v.layer(0), 0.125, pdl=pdl)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_programmatic_dependent_launch_on_gpu_gives_the_same_bits():
    # the combine launched while the split kernel runs waits for its state (griddepcontrol.wait): the same bits as
    # plain launches, eagerly and replayed in a CUDA graph, at several splits a sequence
    gen = torch.Generator().manual_seed(11)
    lens = [4000, 64, 333, 1]
    gpu, _, _ = ragged_pool(4, 4, 128, 64, lens, gen, device="cuda")
    q = torch.randn(4, 28, 128, generator=gen).to(torch.bfloat16).cuda()
    for pps in (4, 16):
        want = attend(gpu, q, True, programs_per_sm=pps)
        for pdl in ("combine", "all"):
            assert bits_equal(attend(gpu, q, True, programs_per_sm=pps, pdl=pdl), want), (pps, pdl)
            out = attend(gpu, q, True, programs_per_sm=pps, pdl=pdl)  # compiled and warm before the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = attend(gpu, q, True, programs_per_sm=pps, pdl=pdl)
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert bits_equal(out, want), (pps, pdl, "graph")


@pytest.mark.parametrize("bad", ["q-2d", "q-4d", "no-heads"])
def test_a_q_or_block_index_of_the_wrong_rank_or_no_heads_is_named(bad):
    # a 2-D q failed unpacking its shape ("not enough values to unpack"), a block index of 0 heads dividing by them
    # (ZeroDivisionError): each is named
    gen = torch.Generator().manual_seed(5)
    pool, _, _ = ragged_pool(2, 1, 32, 16, [40, 21], gen)
    q = torch.randn(2, 2, 32, generator=gen).to(torch.bfloat16)
    bidx = pool.block_index[:, :0] if bad == "no-heads" else pool.block_index
    q = {"q-2d": q[0], "q-4d": q[None]}.get(bad, q)
    from glyd.kv._triton_fixed import attention_triton

    with pytest.raises(FormatError, match=r"^q must be contiguous bf16 \[B, Hq, D\]" if bad != "no-heads"
                       else r"^block_index must be contiguous int32 \[2, H, J\] with H >= 1"):
        attention_triton(q, pool.lens, None, bidx, pool.k.layer(0), pool.v.layer(0), 0.125)


@pytest.mark.parametrize("kw", [{"sub_tile": 32.0}, {"sub_tile": "32"}, {"num_warps": 3}, {"num_warps": True},
                                {"num_warps": 4.0}], ids=str)
def test_a_sub_tile_or_warp_count_that_is_not_one_the_kernel_takes_is_named(kw):
    # AttentionConfig checks these; attention_triton (which the pool's op and Kernel.launch call) took a float
    # sub-tile to a TypeError ("unsupported operand type(s) for &") and ran 3 or True warps under the interpreter
    from glyd.kv._triton_fixed import attention_triton

    gen = torch.Generator().manual_seed(5)
    pool, _, _ = ragged_pool(2, 1, 32, 16, [40, 21], gen)
    q = torch.randn(2, 2, 32, generator=gen).to(torch.bfloat16)
    with pytest.raises(FormatError, match=rf"^{next(iter(kw))} .*must be"):
        attention_triton(q, pool.lens, None, pool.block_index, pool.k.layer(0), pool.v.layer(0), 0.125, **kw)


@pytest.mark.parametrize("bad", ["lens-float", "starts-float", "lens-bool", "capped-int", "capped-none"])
def test_float_lens_or_a_capped_that_is_not_a_bool_is_named(bad):
    # lens 3.7 went through .to(int32) as 3 (a silent wrong length); capped=0 or None picked a page count by truth
    from glyd.kv._triton_fixed import attention_triton

    gen = torch.Generator().manual_seed(5)
    pool, _, _ = ragged_pool(2, 1, 32, 16, [40, 21], gen)
    q = torch.randn(2, 2, 32, generator=gen).to(torch.bfloat16)
    lens, starts, kw = pool.lens, None, {}
    if bad == "lens-float":
        lens = pool.lens.float() + 0.5
    elif bad == "lens-bool":
        lens = pool.lens > 0
    elif bad == "starts-float":
        starts = torch.zeros(2)
    else:
        kw["capped"] = 0 if bad == "capped-int" else None
    name = bad.split("-")[0]
    with pytest.raises(FormatError, match=rf"^{name} must "):
        attention_triton(q, lens, starts, pool.block_index, pool.k.layer(0), pool.v.layer(0), 0.125, **kw)


@pytest.mark.parametrize("bad", ["k.code", "k.base", "k.meta", "v.code", "v-blocks", "k.lo-2d"])
def test_planes_that_do_not_match_their_lo_plane_are_named(bad):
    # the kernel reads every plane at a block's offset (block_index's block b: code[b], base[b], meta[b], the same b
    # on both sides): a plane of fewer blocks was read past its end (2.9 off under the interpreter, or a crash)
    from glyd.kv._triton_fixed import attention_triton

    gen = torch.Generator().manual_seed(5)
    pool, _, _ = ragged_pool(2, 1, 32, 16, [40, 21], gen)
    q = torch.randn(2, 2, 32, generator=gen).to(torch.bfloat16)
    k, v = list(pool.k.layer(0)), list(pool.v.layer(0))
    if bad == "v-blocks":
        v[:4] = [t[:1].clone() for t in v[:4]]
        why = "k and v must hold as many blocks, got 9 and 1"
    elif bad == "k.lo-2d":
        k[0] = k[0][0].clone()
        why = r"k.lo must be \[blocks, page, head dim\], got \(16, 32\)"
    else:
        side, plane = bad.split(".")
        i = ("code", "base", "meta").index(plane) + 1
        (k if side == "k" else v)[i] = (k if side == "k" else v)[i][:1].clone()
        why = rf"{side}.{plane} must be \[9, "
    with pytest.raises(FormatError, match=rf"^{why}"):
        attention_triton(q, pool.lens, None, pool.block_index, k, v, 0.125)


@pytest.mark.parametrize("p,d", [(512, 128), (256, 256)])
def test_word_patch_of_an_odd_count_on_pages_of_65536_values(p, d):
    # The patch loop takes two entries a trip; an odd count leaves the second of the last trip past the block's end.
    # It was padded with the entry 0xFFFF as "no row", but on a page of 65,536 values every 16-bit index is a
    # position (0xFFFF: row P-1, channel D-1), so that value decoded as 0 in every block with an odd count (1.8 read
    # as 0.0 here); the padding entry is now not applied at all
    gen = torch.Generator().manual_seed(p)
    x = (torch.rand(2, p, d, generator=gen) + 1.0).to(torch.bfloat16)  # one exponent: a window holds all
    x[0, 3, 5] = 0.0  # block 0: one exception (odd), block 1: none; both keep their last value decoded
    x[1, 7, 9] = x[1, 8, 10] = 0.0  # and an even count beside it
    x[0, p - 1, d - 1] = x[1, p - 1, d - 1] = 1.8
    pk = pack_blocks(x)
    assert pk["meta"][:, 1].tolist() == [1, 2]
    for ts in (16, 32):
        assert bits_equal(word_unpack(pk, ts), x)
