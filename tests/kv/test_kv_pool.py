"""The static kvf12 page pool (glyd.kv.pool): writes, reads, capacity, and its two kernels (under
TRITON_INTERPRET=1 without a GPU) against their torch twins: the cache's bits exact, attention within
TOL of float64 SDPA on the same bf16 keys and values."""

from __future__ import annotations

import pytest
import torch

from glyd.errors import FormatError
from glyd.kv import pool_twin
from glyd.kv.pool import FixedPagePool, KVCapacityError, pages_that_fit, pool_bytes

from .conftest import all_bf16_patterns, bits_equal

#: ||out - ref|| / ||ref|| against SDPA in float64 on the same bf16 keys and values (the kernel and the
#: twin round the softmax probabilities to bf16 before the value product; measured 2e-3 to 5e-3 here).
TOL = 1e-2


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def states(gen, b, h, t, d, exceptions=True):
    k = (torch.randn(b, h, t, d, generator=gen) * torch.exp(torch.randn(1, h, 1, d, generator=gen))).to(torch.bfloat16)
    v = torch.randn(b, h, t, d, generator=gen).to(torch.bfloat16)
    if exceptions:  # values far outside their window: exception entries
        k[:, :, 3::11, 5] = 1e-30
        v[:, :, 2::13, d - 3] = -1e-33
    return k, v


def fill(pool, runs, gen, layer=0):
    """Write runs of tokens (a prompt, then steps) to ``layer``; returns every key and value written."""
    ks, vs = [], []
    for t in runs:
        k, v = states(gen, pool.batch, pool.heads, t, pool.head_dim)
        pool.advance(t)
        pool.write(layer, k, v)
        ks.append(k)
        vs.append(v)
    return torch.cat(ks, 2), torch.cat(vs, 2)


def sdpa64(q, k, v, scale, starts=None, mask=None):
    """SDPA in float64; ``mask [B, T]`` (bool: attended) or ``starts [B]`` (left padding)."""
    g = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    if starts is not None:
        mask = torch.arange(k.shape[2])[None, :] >= starts[:, None]
    if mask is not None:
        mask = mask[:, None, None, :]
    return torch.nn.functional.scaled_dot_product_attention(q[:, :, None].double(), kk, vv, attn_mask=mask,
                                                            scale=scale)[:, :, 0]


@pytest.mark.parametrize("runs", [[45, 1, 1, 1, 40], [16, 16, 1, 15, 1], [1] * 20, [100]])
def test_writes_give_back_every_bit(runs):
    gen = torch.Generator().manual_seed(sum(runs))
    pool = FixedPagePool(layers=2, batch=2, heads=2, head_dim=16, max_len=112, page=16, exc_fraction=1 / 16)
    k, v = fill(pool, runs, gen, layer=1)
    kd, vd = pool.to_bf16(1)
    assert bits_equal(kd, k) and bits_equal(vd, v)
    assert pool.lens.tolist() == [sum(runs)] * 2
    pool.check()


def test_every_bf16_pattern():
    x = all_bf16_patterns().reshape(4, 2, 128, 64)
    pool = FixedPagePool(layers=1, batch=4, heads=2, head_dim=64, max_len=128, page=32, exc_fraction=1.0)
    pool.advance(100)
    pool.write(0, x[:, :, :100], x[:, :, :100])
    for i in range(100, 128):
        pool.advance(1)
        pool.write(0, x[:, :, i : i + 1], x[:, :, i : i + 1])
    kd, vd = pool.to_bf16(0)
    assert bits_equal(kd, x) and bits_equal(vd, x)


def test_sizes_and_memory():
    pool = FixedPagePool(layers=3, batch=2, heads=4, head_dim=32, max_len=100, page=32)
    assert pool.context == 128 and pool.block_table.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert pool.block_index[1, 2].tolist() == [(4 + j) * 4 + 2 for j in range(4)]
    assert pool.reserved_bytes == pool_bytes(3, 4, 32, 32, 32, 8, 2)
    small = FixedPagePool.from_memory(3, 2, 4, 32, page=32, device="cpu", free_bytes=pool.reserved_bytes + 10_000,
                                      fraction=1.0)
    assert small.context == 128  # the largest whole-page pool that fits
    with pytest.raises(KVCapacityError, match="no KV page"):
        FixedPagePool.from_memory(3, 2, 4, 32, page=32, device="cpu", free_bytes=1000)
    with pytest.raises(FormatError, match="free_bytes"):
        FixedPagePool.from_memory(3, 2, 4, 32, device="cpu")
    # a huge budget: capped where the planes' int32 block offsets end (the constructor refuses beyond)
    cap = pages_that_fit(10**15, 1, 2, 8, 128, 128, 64)
    assert (2 * cap + 1) * 8 * 64 * 128 < 2**31 <= (2 * (cap + 1) + 1) * 8 * 64 * 128
    with pytest.raises(FormatError, match="int32"):
        FixedPagePool(1, 2, 8, 128, (cap + 1) * 64, page=64)


@pytest.mark.parametrize("kw", [dict(layers=0), dict(batch=-1), dict(heads=1.0), dict(max_len=0), dict(page=6),
                                dict(head_dim=30), dict(exc_fraction=0.0), dict(exc_fraction=2)])
def test_bad_pool_arguments(kw):
    args = dict(layers=1, batch=1, heads=1, head_dim=32, max_len=64, page=16) | kw
    with pytest.raises(FormatError):
        FixedPagePool(**args)


def test_bad_states():
    pool = FixedPagePool(layers=1, batch=2, heads=2, head_dim=32, max_len=64, page=16)
    good = torch.zeros(2, 2, 1, 32, dtype=torch.bfloat16)
    for bad, match in ((good.float(), "bf16"), (good[:1], "shape"), (torch.zeros(2, 2, 1, 16, dtype=torch.bfloat16), "shape")):
        with pytest.raises(FormatError, match=match):
            pool.write(0, bad, good)
    with pytest.raises(FormatError, match="tokens"):
        pool.write(0, torch.zeros(2, 2, 2, 32, dtype=torch.bfloat16), good)
    with pytest.raises(FormatError, match="q must be"):
        pool.attend(0, torch.zeros(2, 3, 32, dtype=torch.bfloat16))



def test_a_bad_layer_or_an_empty_write_is_refused_by_name():
    # a layer past the pool's gave "list index out of range", -1 wrote the last layer, and a write of no
    # tokens failed inside the twin ("index -1 is out of bounds")
    pool = FixedPagePool(layers=2, batch=1, heads=1, head_dim=32, max_len=64, page=16)
    one = torch.zeros(1, 1, 1, 32, dtype=torch.bfloat16)
    for layer in (2, -1, 1.0):
        with pytest.raises(FormatError, match=rf"layer {layer!r} is not one of the pool's 2"):
            pool.write(layer, one, one)
        with pytest.raises(FormatError, match=rf"layer {layer!r} is not one of the pool's 2"):
            pool.attend(layer, torch.zeros(1, 1, 32, dtype=torch.bfloat16))
        with pytest.raises(FormatError, match=rf"layer {layer!r} is not one of the pool's 2"):
            pool.to_bf16(layer)
    empty = torch.zeros(1, 1, 0, 32, dtype=torch.bfloat16)
    with pytest.raises(FormatError, match="keys and values hold no tokens"):
        pool.write(0, empty, empty)
    assert pool.lens.tolist() == [0]

def test_context_overflow_is_never_silent():
    pool = FixedPagePool(layers=1, batch=1, heads=1, head_dim=32, max_len=32, page=16)
    gen = torch.Generator().manual_seed(1)
    fill(pool, [30], gen)
    with pytest.raises(KVCapacityError, match="context"):
        fill(pool, [5], gen)  # a prompt: refused before anything is written
    fill(pool, [1, 1, 1], gen)  # decode steps cannot stop on the host: the pool says so afterwards
    with pytest.raises(KVCapacityError, match="context"):
        pool.check()
    with pytest.raises(KVCapacityError):
        pool.attend(0, torch.ones(1, 1, 32, dtype=torch.bfloat16))


def test_exception_overflow_is_never_silent():
    pool = FixedPagePool(layers=1, batch=1, heads=1, head_dim=32, max_len=64, page=16, exc_fraction=1 / 4096)
    x = all_bf16_patterns()[::32].reshape(1, 1, 64, 32)  # 2048 patterns over every exponent: most are exceptions
    pool.advance(64)
    pool.write(0, x, x)
    assert int(pool.k.used[0]) > pool.k.arena
    with pytest.raises(KVCapacityError, match="overflowed"):
        pool.check()
    with pytest.raises(KVCapacityError, match="did not fit"):
        pool_twin.attention_torch(torch.ones(1, 1, 32, dtype=torch.bfloat16), pool.lens, None, pool.block_index,
                                  pool.k.layer(0), pool.v.layer(0), 0.1)
    pool.reset()
    assert pool.lens.tolist() == [0] and int(pool.k.used[0]) == 0


@pytest.mark.parametrize("b,h,g,d,p,runs", [
    pytest.param(2, 1, 4, 32, 16, [36, 1]),
    pytest.param(3, 2, 4, 32, 16, [37, 1, 1, 1], marks=pytest.mark.slow),
    pytest.param(2, 1, 7, 64, 32, [70, 1], marks=pytest.mark.slow),
])
def test_attention_twin_and_kernel(b, h, g, d, p, runs):
    from glyd.kv._triton_fixed import attention_triton

    gen = torch.Generator().manual_seed(b * 100 + d)
    pool = FixedPagePool(layers=1, batch=b, heads=h, head_dim=d, max_len=6 * p, page=p, exc_fraction=1 / 8)
    k, v = fill(pool, runs, gen)
    assert int(pool.k.used[0]) > 0 and int(pool.v.used[0]) > 0  # the kernel's exception patch runs
    q = torch.randn(b, h * g, d, generator=gen).to(torch.bfloat16)
    starts = torch.arange(b, dtype=torch.int32) * 5  # left padding
    ref = sdpa64(q, k, v, 0.125, starts)
    twin = pool.attend(0, q, scale=0.125, starts=starts)
    kern = attention_triton(q, pool.lens, starts, pool.block_index, pool.k.layer(0), pool.v.layer(0), 0.125,
                            num_splits=2)
    assert rel_err(twin, ref) <= TOL and rel_err(kern, ref) <= TOL
    # a page whose exceptions were lost: NaN for that sequence only, never a plausible value
    pool.k.meta[0][int(pool.block_index[b - 1, 0, 0]), 1] = -1
    kern = attention_triton(q, pool.lens, starts, pool.block_index, pool.k.layer(0), pool.v.layer(0), 0.125,
                            num_splits=1)
    assert torch.isnan(kern[b - 1, :g]).all() and not torch.isnan(kern[: b - 1]).any()


def test_attention_kernel_register_cap_is_checked_and_changes_nothing():
    # maxnreg is a launch option (the H200 sweep's): a cap outside 24..255 is refused by name; a valid one
    # leaves the result as it was (the interpreter ignores it; the GPU set compares on the H200)
    from glyd.errors import FormatError
    from glyd.kv._triton_fixed import AttentionConfig, attention_triton

    gen = torch.Generator().manual_seed(5)
    pool = FixedPagePool(layers=1, batch=2, heads=1, head_dim=32, max_len=96, page=16)
    fill(pool, [36, 1], gen)
    q = torch.randn(2, 4, 32, generator=gen).to(torch.bfloat16)
    args = (q, pool.lens, None, pool.block_index, pool.k.layer(0), pool.v.layer(0), 0.125)
    plain = attention_triton(*args, num_splits=2)
    capped = attention_triton(*args, num_splits=2, maxnreg=128)
    assert torch.equal(plain.view(torch.int16), capped.view(torch.int16))
    with pytest.raises(FormatError, match="maxnreg"):
        attention_triton(*args, maxnreg=8)
    assert AttentionConfig(maxnreg=128).maxnreg == 128


@pytest.mark.parametrize("b,h,g,d,p,runs", [
    pytest.param(2, 1, 4, 32, 16, [36, 1]),
    pytest.param(3, 2, 4, 32, 16, [37, 1, 1, 1], marks=pytest.mark.slow),
])
def test_attention_drops_masked_positions_inside_the_sequence(b, h, g, d, p, runs):
    # the attention mask's row (bool or uint8, a static cache's: the whole context wide) with masked positions
    # after a row's first attended one (a second prompt's left padding), in packed pages, across a page
    # boundary and in the raw page: the twin and the kernel drop exactly those positions, as SDPA does
    from glyd.kv._triton_fixed import attention_triton

    gen = torch.Generator().manual_seed(b * 100 + d + 1)
    pool = FixedPagePool(layers=1, batch=b, heads=h, head_dim=d, max_len=6 * p, page=p, exc_fraction=1 / 8)
    k, v = fill(pool, runs, gen)
    n = k.shape[2]
    q = torch.randn(b, h * g, d, generator=gen).to(torch.bfloat16)
    valid = torch.ones(b, 6 * p, dtype=torch.bool)
    valid[0, 3:9] = False  # inside a packed page
    valid[0, n - 4: n - 2] = False  # inside the raw page
    valid[-1, :5] = False  # left padding
    valid[-1, p + 1: 2 * p + 3] = False  # a second prompt's padding, across a page boundary into the raw page
    short = valid[:, : n - 6].to(torch.uint8)  # a row shorter than the sequence: the positions past it are masked
    for m in (valid, short):
        mask = torch.zeros(b, n, dtype=torch.bool)
        mask[:, : min(m.shape[1], n)] = m[:, :n] != 0
        ref = sdpa64(q, k, v, 0.125, mask=mask)
        twin = pool.attend(0, q, scale=0.125, valid=m)
        kern = attention_triton(q, pool.lens, None, pool.block_index, pool.k.layer(0), pool.v.layer(0), 0.125,
                                num_splits=2, valid=m)
        assert rel_err(twin, ref) <= TOL and rel_err(kern, ref) <= TOL
        # the positions dropped matter: reading each row's first attended position only would fail here
        first = mask.to(torch.int32).argmax(1)
        assert rel_err(pool.attend(0, q, scale=0.125, starts=first), ref) > 10 * TOL
    with pytest.raises(FormatError, match="valid must be"):
        attention_triton(q, pool.lens, None, pool.block_index, pool.k.layer(0), pool.v.layer(0), 0.125,
                         valid=valid[:1])


@pytest.mark.parametrize("runs", [[21, 1, 1, 9, 1, 30], [1, 1, 14, 16, 1]])
def test_write_kernel_matches_twin(runs):
    from glyd.kv._triton_pool import write_triton

    gen = torch.Generator().manual_seed(len(runs))
    twin, kern = (FixedPagePool(layers=1, batch=2, heads=2, head_dim=32, max_len=96, page=16, exc_fraction=1 / 8)
                  for _ in range(2))
    for t in runs:
        x, _ = states(gen, 2, 2, t, 32)
        x[0, 0, 0, :4] = torch.tensor([float("nan"), float("-inf"), -0.0, 1e-40])  # NaN payload, subnormal
        first = int(twin.lens[0])
        head = (-first) % 16
        parts = [(x[:, :, :head], t - head), (x[:, :, head:], 0)] if 0 < head < t else [(x, 0)]  # as pool.write
        for pool, fn in ((twin, pool_twin.write_torch), (kern, write_triton)):
            pool.advance(t)
            for part, after in parts:
                lo, code, base, meta, exc, raw = pool.k.layer(0)
                fn(part.contiguous(), pool.lens - after, pool.block_index, lo, code, base, meta, exc, pool.k.used[0], raw)
    n = int(twin.lens[0])
    blk = twin.block_index[:, :, : n // 16].reshape(-1).long()
    for i in range(3):  # lo, code, base: byte for byte
        assert torch.equal(twin.k.layer(0)[i][blk], kern.k.layer(0)[i][blk])
    assert torch.equal(twin.k.meta[0][blk][:, 1], kern.k.meta[0][blk][:, 1])
    assert int(twin.k.used[0]) == int(kern.k.used[0]) > 0
    assert bits_equal(twin.k.raw[0][:, :, : n % 16], kern.k.raw[0][:, :, : n % 16])
    assert bits_equal(twin.to_bf16(0)[0], kern.to_bf16(0)[0])


def _side_planes(pool, side):
    lo, code, base, meta, exc, raw = getattr(pool, side).layer(0)
    return lo, code, base, meta, exc, getattr(pool, side).used[0], raw


def _same_pages(a, b, n, page):
    """Both pools hold the same pages, byte for byte (the arenas' order of blocks may differ), and raw rows."""
    blk = a.block_index[:, :, : n // page].reshape(-1).long()
    for side in ("k", "v"):
        pa, pb = getattr(a, side), getattr(b, side)
        for i in range(3):  # lo, code, base
            assert torch.equal(pa.layer(0)[i][blk], pb.layer(0)[i][blk]), (side, i)
        assert torch.equal(pa.meta[0][blk][:, 1], pb.meta[0][blk][:, 1]) and int(pa.used[0]) == int(pb.used[0])
        assert bits_equal(pa.raw[0][:, :, : n % page], pb.raw[0][:, :, : n % page])
    for x, y in zip(a.to_bf16(0), b.to_bf16(0)):
        assert bits_equal(x, y)


@pytest.mark.parametrize("runs", [[21, 1, 1, 9, 1, 30], [1, 1, 14, 16, 1], [40]])
def test_write_pair_kernel_matches_the_twin_and_the_one_side_kernel(runs):
    # keys and values in one launch (grid axis 2): the twin's planes and the one-side kernel's, byte for byte
    from glyd.kv._triton_pool import write_pair_triton, write_triton

    gen = torch.Generator().manual_seed(7 + len(runs))
    twin, pair, single = (FixedPagePool(layers=1, batch=2, heads=2, head_dim=32, max_len=96, page=16,
                                        exc_fraction=1 / 8) for _ in range(3))
    for t in runs:
        k, v = states(gen, 2, 2, t, 32)
        k[0, 0, 0, :4] = torch.tensor([float("nan"), float("-inf"), -0.0, 1e-40])  # NaN payload, subnormal
        v[1, 1, -1, :2] = torch.tensor([float("inf"), -1e-41])
        first = int(twin.lens[0])
        head = (-first) % 16
        parts = [(k[:, :, :head], v[:, :, :head], t - head), (k[:, :, head:], v[:, :, head:], 0)] \
            if 0 < head < t else [(k, v, 0)]  # as pool.write
        for pool in (twin, pair, single):
            pool.advance(t)
            for pk, pv, after in parts:
                lens = pool.lens - after
                kp, vp = _side_planes(pool, "k"), _side_planes(pool, "v")
                if pool is twin:
                    pool_twin.write_torch(pk.contiguous(), lens, pool.block_index, *kp)
                    pool_twin.write_torch(pv.contiguous(), lens, pool.block_index, *vp)
                elif pool is pair:
                    write_pair_triton(pk.contiguous(), pv.contiguous(), lens, pool.block_index, kp, vp)
                else:
                    write_triton(pk.contiguous(), lens, pool.block_index, *kp)
                    write_triton(pv.contiguous(), lens, pool.block_index, *vp)
    n = int(twin.lens[0])
    assert int(twin.k.used[0]) > 0 and int(twin.v.used[0]) > 0
    _same_pages(twin, pair, n, 16)
    _same_pages(single, pair, n, 16)


def test_write_pair_refuses_mismatched_sides_by_name():
    from glyd.kv._triton_pool import write_pair_triton

    pool = FixedPagePool(layers=1, batch=1, heads=2, head_dim=32, max_len=64, page=16)
    k, v = states(torch.Generator().manual_seed(1), 1, 2, 3, 32)
    pool.advance(3)
    kp, vp = _side_planes(pool, "k"), _side_planes(pool, "v")
    with pytest.raises(FormatError, match="must match keys'"):
        write_pair_triton(k, v[:, :, :2].contiguous(), pool.lens, pool.block_index, kp, vp)
    with pytest.raises(FormatError, match="v.used must be a contiguous torch.int32"):
        write_pair_triton(k, v, pool.lens, pool.block_index, kp, (*vp[:5], vp[5].to(torch.int64), vp[6]))
    with pytest.raises(FormatError, match="values must be contiguous bf16"):
        write_pair_triton(k, v.float(), pool.lens, pool.block_index, kp, vp)
    assert int(pool.k.used[0]) == int(pool.v.used[0]) == 0 and not pool.k.raw[0].view(torch.int16).any()


def test_the_pool_writes_both_sides_with_one_op():
    # pool.write on equal head dims calls glyd::kvf12_write_pair once (one kernel on CUDA), else the one-side op twice
    pool = FixedPagePool(layers=1, batch=1, heads=1, head_dim=32, max_len=64, page=16)
    gen = torch.Generator().manual_seed(4)
    k, v = states(gen, 1, 1, 20, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        pool.advance(20)
        pool.write(0, k, v)
    names = [e.name for e in prof.events()]
    assert names.count("glyd::kvf12_write_pair") == 1 and "glyd::kvf12_write" not in names
    kd, vd = pool.to_bf16(0)
    assert bits_equal(kd, k) and bits_equal(vd, v)
    mixed = FixedPagePool(layers=1, batch=1, heads=1, head_dim=32, max_len=64, page=16, v_head_dim=64)
    v64 = states(gen, 1, 1, 20, 64)[1]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        mixed.advance(20)
        mixed.write(0, k, v64)
    names = [e.name for e in prof.events()]
    assert names.count("glyd::kvf12_write") == 2 and "glyd::kvf12_write_pair" not in names
    kd, vd = mixed.to_bf16(0)
    assert bits_equal(kd, k) and bits_equal(vd, v64)


def test_ops_trace_with_static_shapes():
    # torch.compile sees both ops as opaque calls (fake implementations), one graph for every step
    torch._dynamo.reset()
    pool = FixedPagePool(layers=1, batch=1, heads=1, head_dim=32, max_len=64, page=16)
    gen = torch.Generator().manual_seed(3)
    fill(pool, [15], gen)
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm.forward

    @torch.compile(backend=backend, fullgraph=True)
    def step(k, v, q):
        pool.advance(1)
        pool.write(0, k, v)
        return pool.attend(0, q)

    for _ in range(3):
        k, v = states(gen, 1, 1, 1, 32)
        out = step(k, v, torch.ones(1, 2, 32, dtype=torch.bfloat16))
    assert len(frames) == 1 and pool.lens.tolist() == [18] and torch.isfinite(out).all()
    assert "glyd.kvf12_write_pair" in str(frames[0].code) and "glyd.kvf12_attention" in str(frames[0].code)


@pytest.mark.slow
def test_write_kernel_compiles_for_sm90():
    # Compiled ahead of time (no GPU): the histogram, gathers, argmax and the arena's atomic lower for sm_90.
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    helper = Path(__file__).resolve().parent / "_pool_compile_check.py"
    r = subprocess.run([sys.executable, str(helper), "64,128", "32,64"], env=dict(os.environ, TRITON_INTERPRET="0"),
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and "ptxas" in r.stderr:
        pytest.skip("no sm_90 compiler tools in this triton build")
    assert r.returncode == 0, r.stderr[-2000:]
    found = re.findall(r"CUBIN P=(\d+) D=(\d+) bytes=(\d+) atomics=(\d+)", r.stdout)
    assert [(p, d) for p, d, _, _ in found] == [("64", "128"), ("32", "64")]
    assert all(int(n) > 0 and int(a) >= 1 for _, _, n, a in found)
    pairs = re.findall(r"PAIR P=(\d+) D=(\d+) bytes=(\d+) atomics=(\d+)", r.stdout)
    assert [(p, d) for p, d, _, _ in pairs] == [("64", "128"), ("32", "64")]
    assert all(int(n) > 0 and int(a) >= 2 for _, _, n, a in pairs)  # one arena counter a side


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("d", [64, 128])
def test_pool_kernels_on_gpu(d):
    # the Triton writer byte for byte the twin's, the decode kernel within TOL of float64 SDPA
    gen = torch.Generator().manual_seed(d)
    twin = FixedPagePool(layers=1, batch=4, heads=2, head_dim=d, max_len=512, page=64, exc_fraction=1 / 64)
    gpu = FixedPagePool(layers=1, batch=4, heads=2, head_dim=d, max_len=512, page=64, exc_fraction=1 / 64, device="cuda")
    ks, vs = [], []
    for t in [100, 1, 1, 27, 1, 130] + [1] * 70:
        k, v = states(gen, 4, 2, t, d)
        ks.append(k)
        vs.append(v)
        for pool in (twin, gpu):
            pool.advance(t)
            pool.write(0, k.to(pool.device), v.to(pool.device))
    n = int(twin.lens[0])
    blk = twin.block_index[:, :, : n // 64].reshape(-1).long()
    for i in range(3):
        assert torch.equal(twin.k.layer(0)[i][blk], gpu.k.layer(0)[i][blk].cpu())
        assert torch.equal(twin.v.layer(0)[i][blk], gpu.v.layer(0)[i][blk].cpu())
    k, v = torch.cat(ks, 2), torch.cat(vs, 2)
    kd, vd = gpu.to_bf16(0)
    assert bits_equal(kd.cpu(), k) and bits_equal(vd.cpu(), v)
    q = torch.randn(4, 14, d, generator=gen).to(torch.bfloat16)
    starts = torch.tensor([0, 3, 9, 40], dtype=torch.int32)
    ref = sdpa64(q, k, v, d ** -0.5, starts)
    out = gpu.attend(0, q.cuda(), starts=starts.cuda()).cpu()
    assert rel_err(out, ref) <= TOL
    # the attention mask's row, the pool's whole context wide: holes after each row's first attended position
    valid = torch.rand(4, 512, generator=gen) > 0.3
    valid[2, 64:200] = False  # a second prompt's padding over whole pages
    valid[:, n - 1] = True
    ref = sdpa64(q, k, v, d ** -0.5, mask=valid[:, :n])
    assert rel_err(gpu.attend(0, q.cuda(), valid=valid.cuda()).cpu(), ref) <= TOL
    assert rel_err(twin.attend(0, q, valid=valid), ref) <= TOL


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_twin_inside_a_cuda_graph_says_why():
    # pages of 16 and head dim 16 have no CUDA kernel: the twin (host reads) refuses a capture in one line
    from glyd.errors import UnsupportedError

    pool = FixedPagePool(layers=1, batch=2, heads=2, head_dim=16, max_len=64, page=16, device="cuda")
    k, v = states(torch.Generator().manual_seed(0), 2, 2, 20, 16)
    pool.advance(20)
    pool.write(0, k.cuda(), v.cuda())
    q = torch.randn(2, 2, 16, device="cuda").to(torch.bfloat16)
    pool.attend(0, q)  # eager: the twin answers
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(UnsupportedError, match="cannot run in a CUDA graph"):
        with torch.cuda.graph(graph):
            pool.attend(0, q)
