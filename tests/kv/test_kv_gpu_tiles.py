"""The KV decode kernels at the sub-tiles and pages the GPU runs (>= 32 tokens), under the interpreter.

The other CPU tests mostly take 16-token pages, which the GPU refuses; these launches are the ones
``benchmarks/compile_sm90.py`` records and compiles for sm_90 (kvtiered and kvf12, pages of 32 and 64,
head dims 64 and 128), checked against the torch twin."""

from __future__ import annotations

import pytest
import torch

from glyd.kernels.registry import Device
from glyd.kv import PageStore, decode_attention
from glyd.kv.attention import BACKENDS
from glyd.kv.fixed import FixedPageStore
from glyd.kv.registry import KVProblem, by_name

from .test_kv_fixed_attention import TOL, rel_err

H200 = Device("cuda", "NVIDIA H200", (9, 0), 132)


@pytest.mark.parametrize("code", ["kvtiered", "kvf12"])
@pytest.mark.parametrize("page", [32, 64])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_sized_pages_match_the_twin(code, page, d):
    g = 3
    gen = torch.Generator().manual_seed(page + d)
    k = torch.randn(1, 1, page + 5, d, generator=gen).to(torch.bfloat16)  # a full page and a raw tail
    v = torch.randn(1, 1, page + 5, d, generator=gen).to(torch.bfloat16)
    q = (torch.randn(1, g, d, generator=gen) * 2).to(torch.bfloat16)
    make = FixedPageStore.from_bf16 if code == "kvf12" else PageStore.from_bf16
    ks, vs = make(k, page=page), make(v, page=page)
    # the launch exists on the GPU: the H200 takes the Triton kernel's default config at this shape
    by_name(BACKENDS["triton"][code], KVProblem(code, "attention", page, d, d, g, "store"), H200)
    valid = torch.ones(1, page + 5, dtype=torch.bool)
    valid[0, 2:20] = False  # masked positions inside the first sub-tile
    for mask in (None, valid):
        out = decode_attention(q, ks, vs, backend="triton", valid=mask)
        ref = decode_attention(q, ks, vs, backend="torch", valid=mask)
        assert rel_err(out, ref) <= TOL, mask is not None
    assert rel_err(decode_attention(q, ks, vs, backend="triton"), ref) > 3 * TOL  # the mask mattered
