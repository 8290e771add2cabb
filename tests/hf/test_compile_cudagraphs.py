"""Packed models under ``torch.compile(mode="reduce-overhead")`` (CUDA graph trees, issue 38): the
first compiled call (the warm-up) builds glyd's per-matrix state (exception indices, scratch and
counter buffers) outside the graphs' pool, and the replays give the same bits as the same code run
without CUDA graphs. Needs a GPU (CUDA graphs)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import glyd
from glyd.nn.modules import GlydLinear

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA graphs")]

#: Prompt lengths: a short one (the fused kernels) and a long one (unpack into the scratch + cuBLAS).
LENGTHS = (7, 512)


def _packed_linear(n: int, k: int, seed: int) -> GlydLinear:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    w[1, 2] = 1e-30  # an exception: the per-matrix index is built on the first call
    bias = (torch.randn(n, generator=g) * 0.02).to(torch.bfloat16)
    return GlydLinear(glyd.pack(w.cuda(), layout="fixed12"), bias.cuda())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def test_packed_linears_under_cudagraph_trees_equal_eager_bit_for_bit_gpu():
    # glyd's ops alone (extern calls in the compiled graph): the replays' bits are eager's
    model = nn.Sequential(_packed_linear(384, 256, 1), _packed_linear(256, 384, 2)).cuda()
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    g = torch.Generator(device="cuda").manual_seed(5)
    with torch.no_grad():
        for m in LENGTHS:
            for step in range(4):  # warm-up, recording, replays
                x = torch.randn(1, m, 256, device="cuda", generator=g).to(torch.bfloat16)
                want = model(x)
                torch.compiler.cudagraph_mark_step_begin()
                got = compiled(x).clone()
                assert torch.equal(_bits(got), _bits(want)), (m, step)


@pytest.mark.slow  # inductor compiles a model twice
def test_a_packed_causal_lm_under_cudagraph_trees_gpu():
    # the whole model: inductor fuses the norms and rotary differently from eager, so the replays are
    # compared with the same compiled code run without CUDA graphs (mode="default"), bit for bit
    transformers = pytest.importorskip("transformers")
    from tiny_models import tiny_config

    torch.manual_seed(0)
    cfg = tiny_config("qwen2", hidden_size=128, intermediate_size=256)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda().eval()
    glyd.compress(model, layout="fixed12", progress=False)
    graphs = torch.compile(model, mode="reduce-overhead", dynamic=False)
    plain = torch.compile(model, dynamic=False)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in (16, 200):
            for step in range(4):
                ids = torch.randint(3, cfg.vocab_size, (1, m), generator=g).cuda()
                want = plain(ids, use_cache=False).logits
                torch.compiler.cudagraph_mark_step_begin()
                got = graphs(ids, use_cache=False).logits.clone()
                assert torch.equal(_bits(got), _bits(want)), (m, step)
                eager = model(ids, use_cache=False).logits
                assert float((got.float() - eager.float()).abs().max()) < 0.1, (m, step)  # the same model (rounding apart)
