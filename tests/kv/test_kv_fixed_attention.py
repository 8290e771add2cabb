"""Decode attention over kvf12 pages: the Triton kernel (under TRITON_INTERPRET=1 without a GPU) and
the torch twin against SDPA on the same bf16 keys and values; the cache's choice of page code."""

from __future__ import annotations

import pytest
import torch

from glyd.errors import FormatError
from glyd.kv import decode_attention, decode_attention_reference
from glyd.kv.fixed import FixedPageStore
from glyd.kv.pages import PageStore

from .conftest import tiny_llama

#: ||out - ref|| / ||ref|| against SDPA in fp32 on the same bf16 keys and values (the kernels round
#: the softmax probabilities to bf16 before the value product; measured 1e-3 to 5e-3 here).
TOL = 1e-2


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def case(b, h, g, t, d, seed, exceptions=True, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    k = (torch.randn(b, h, t, d, generator=gen) * torch.exp(torch.randn(1, h, 1, d, generator=gen))).to(torch.bfloat16)
    v = torch.randn(b, h, t, d, generator=gen).to(torch.bfloat16)
    if exceptions:  # values far below their window: the kernel's patch loop runs
        k[:, :, 3::17, 5] = 1e-30
        v[:, :, 7::23, d // 2 + 3] = -1e-33
        k[0, 0, 1, d - 1] = 0.0
    lens = torch.randint(max(1, t // 3), t + 1, (b,), generator=gen)
    lens[0] = t
    q = torch.randn(b, h * g, d, generator=gen).to(torch.bfloat16)
    ks = FixedPageStore.from_bf16(k.to(device), lens.to(device))
    vs = FixedPageStore.from_bf16(v.to(device), lens.to(device))
    return q.to(device), ks, vs, lens


@pytest.mark.parametrize("b,h,g,t,d,seed", [
    pytest.param(2, 1, 4, 130, 64, 0),
    pytest.param(3, 2, 4, 150, 64, 3, marks=pytest.mark.slow),
    pytest.param(2, 1, 7, 200, 128, 1, marks=pytest.mark.slow),
    pytest.param(4, 2, 1, 64, 128, 2, marks=pytest.mark.slow),  # one query head a KV head, a page exactly
])
def test_triton_kernel_under_the_interpreter(b, h, g, t, d, seed):
    from glyd.kv._triton_fixed import decode_attention_fixed_triton

    q, ks, vs, lens = case(b, h, g, t, d, seed)
    assert ks.exc_len > 0 and vs.exc_len > 0
    ref = decode_attention_reference(q, ks, vs, upcast=True)
    starts = torch.tensor([0] + [5] * (b - 1))  # left padding in every row but the first
    ref_s = decode_attention_reference(q, ks, vs, upcast=True, starts=starts)
    assert rel_err(decode_attention(q, ks, vs, backend="triton"), ref) <= TOL
    assert rel_err(decode_attention_fixed_triton(q, ks, vs, lens, starts=starts, num_splits=2), ref_s) <= TOL


def test_torch_twin_and_errors():
    q, ks, vs, _ = case(2, 2, 3, 90, 32, 3)
    assert rel_err(decode_attention(q, ks, vs), decode_attention_reference(q, ks, vs, upcast=True)) <= TOL
    tiered = PageStore.from_bf16(ks.pages()[:, :, :64], page=64)
    with pytest.raises(FormatError, match="same page code"):
        decode_attention(q, ks, tiered)
    with pytest.raises(FormatError, match="Gluon"):
        decode_attention(q, ks, vs, backend="gluon")


@pytest.mark.slow
def test_kernel_compiles_for_sm90_with_safe_dots():
    # Compiled ahead of time (no GPU): every bf16 tensor-core dot reduces over >= 4 * kWidth values
    # (Triton 3.6 miscompiles K = 16 dots on sm_90: glyd.kv._triton._scores).
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    helper = Path(__file__).resolve().parent / "_fixed_compile_check.py"
    r = subprocess.run([sys.executable, str(helper), "64,3,64", "128,7,32"], env=dict(os.environ, TRITON_INTERPRET="0"),
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and "ptxas" in r.stderr:
        pytest.skip("no sm_90 compiler tools in this triton build")
    assert r.returncode == 0, r.stderr[-2000:]
    dots = re.findall(r"DOT d=(\d+) sub_tile=\d+ swar=0 M=\d+ K=(\d+) kWidth=(\d+)", r.stdout)
    assert {int(d) for d, *_ in dots} == {64, 128} and len(re.findall("CUBIN", r.stdout)) == 2
    for d, k, kw in dots:
        assert int(k) >= 4 * int(kw), (d, k, kw)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("b", [1, 4, 16, 64])
@pytest.mark.parametrize("d", [64, 128])
def test_triton_kernel_on_gpu(b, d):
    q, ks, vs, _ = case(b, 4, 7, 1000, d, 10 + b, device="cuda")
    assert rel_err(decode_attention(q, ks, vs), decode_attention_reference(q, ks, vs, upcast=True)) <= TOL


@pytest.mark.parametrize("code", ["kvf12", "kvtiered"])
def test_generate_same_tokens_either_code(code):
    transformers = pytest.importorskip("transformers")
    from glyd.kv import GlydCache

    model = tiny_llama(seed=7)
    ids = torch.randint(3, 320, (2, 30), generator=torch.Generator().manual_seed(7))
    kw = dict(max_new_tokens=40, do_sample=False, pad_token_id=0)
    ref = model.generate(ids, past_key_values=transformers.DynamicCache(), **kw)
    cache = GlydCache(model.config, page_size=16, code=code)
    assert torch.equal(model.generate(ids, past_key_values=cache, **kw), ref)
    want = FixedPageStore if code == "kvf12" else PageStore
    assert type(cache.layers[0].k_store) is want and cache.layers[0].k_store.n_pages == 69 // 16
    assert GlydCache().code == "kvf12"  # the default
    with pytest.raises(ValueError, match="code"):
        GlydCache(code="zip")


def test_stores_of_no_full_page_yet():
    # GlydCache(fused=True) on kvf12 pages after a prompt shorter than a page: the stores hold no page, and
    # reading them through a block table failed ("shape '[4, 16, 16]' is invalid for input of size 4096")
    gen = torch.Generator().manual_seed(3)
    k, v = torch.randn(2, 2, 7, 32, generator=gen).to(torch.bfloat16), torch.randn(2, 2, 7, 32, generator=gen).to(
        torch.bfloat16)
    q = torch.randn(2, 4, 32, generator=gen).to(torch.bfloat16)
    ks, vs = FixedPageStore.from_bf16(k, page=16), FixedPageStore.from_bf16(v, page=16)
    assert ks.n_pages == 0
    ref = torch.nn.functional.scaled_dot_product_attention(q[:, :, None].double(), k.double().repeat_interleave(2, 1),
                                                           v.double().repeat_interleave(2, 1))[:, :, 0]
    for backend in ("torch", "triton"):
        assert rel_err(decode_attention(q, ks, vs, backend=backend), ref) <= TOL, backend
