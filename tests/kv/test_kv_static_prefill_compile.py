"""GlydStaticCache's prompt under torch.compile (issue 38): one graph (``fullgraph=True``) whose logits and
pool bytes are the eager prompt's, the position taken from the pool's host count (a guarded int, no graph
break), and a prompt past the context refused with ``KVCapacityError`` before anything is written."""

from __future__ import annotations

import pytest
import torch

from .conftest import bits_equal, tiny_llama

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402

from glyd.kv import GlydStaticCache, KVCapacityError, enable_fused  # noqa: E402

PAGE, CONTEXT = 16, 64


def left_padded(batch: int, length: int, seed: int, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 320, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    for i in range(1, batch):
        mask[i, : 4 * i + 1] = 0
        ids[i, : 4 * i + 1] = 0
    return ids.to(device), mask.to(device)


def planes(cache) -> dict[str, torch.Tensor]:
    """Every tensor of the pool, as integers (an arena's last entry is the sink of masked writes: left out)."""
    pool, out = cache.pool, {"lens": cache.pool.lens.clone()}
    for name, side in (("k", pool.k), ("v", pool.v)):
        for part in ("lo", "code", "base", "meta", "exc", "used", "raw"):
            for i, t in enumerate(getattr(side, part)):
                t = t[:-1] if part == "exc" else t
                out[f"{name}.{part}[{i}]"] = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).clone()
    return out


def same_planes(a: dict, b: dict) -> list[str]:
    """The names of the planes that differ."""
    return [k for k in a if not torch.equal(a[k], b[k])]


class Counting:
    """A torch.compile backend that counts the graphs it is handed and runs them through aot_eager
    (functionalized: the ops' declared mutations decide what runs and in which order)."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def fused_pair(seed: int, context: int = CONTEXT):
    """A tiny model switched to the fused attention, and two empty caches of ``context`` tokens."""
    model = tiny_llama(seed=seed, layers=2)
    enable_fused(model)
    make = lambda: GlydStaticCache(model.config, max_cache_len=context, page_size=PAGE)  # noqa: E731
    return model, make(), make()


def test_advance_on_a_cuda_pool_is_one_graph_under_compile():
    # the CUDA capture query broke a compiled prompt on the GPU at every layer (2026-12-05, H100: the 0.5B's
    # compiled +kv first token 14.2x bf16, recompiles per layer); the CPU pool poses as a CUDA one here
    model, cache, _ = fused_pair(seed=25)
    ids, mask = left_padded(3, 5, seed=25)
    with torch.no_grad():
        model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)  # makes the pool
    cache.reset()
    cache.pool.device = torch.device("cuda", 0)
    backend = Counting()
    step = torch.compile(lambda pool, x: (pool.advance(5), x + 1)[1], backend=backend, fullgraph=True)
    step(cache.pool, torch.zeros(1))
    assert backend.graphs == 1 and int(cache.pool.lens.max()) == 5


@torch.no_grad()
def test_a_compiled_prompt_is_one_graph_with_the_eager_prompts_bits():
    torch._dynamo.reset()
    model, eager, cache = fused_pair(seed=21)
    ids, mask = left_padded(3, 37, seed=21)  # 37 tokens: two packed pages and a raw one, rows 1 and 2 padded
    want = model(ids, attention_mask=mask, past_key_values=eager, use_cache=True).logits
    model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)  # makes the pool (as compile_prefill)
    backend = Counting()
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
    for _ in range(3):  # the same graph each time: no recompilation after reset()
        cache.reset()
        got = compiled(ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits
        assert bits_equal(got, want)
        assert same_planes(planes(cache), planes(eager)) == []
        assert cache.pool.held() == 37  # the host count the graph's replayed store left
    assert backend.graphs == 1
    step = dict(input_ids=torch.full((3, 1), 7), position_ids=mask.sum(1, keepdim=True), use_cache=True,
                attention_mask=torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], 1))
    assert bits_equal(model(past_key_values=cache, **step).logits, model(past_key_values=eager, **step).logits)
    assert same_planes(planes(cache), planes(eager)) == []


@torch.no_grad()
@pytest.mark.parametrize("fullgraph", [True, False])
def test_a_compiled_prompt_past_the_context_is_refused_before_writing(fullgraph):
    # the check is decided while tracing (shapes and the host count are static); the graph raises it when it
    # runs, every time, and nothing moves: neither lens, nor the host count, nor a byte of the pool
    torch._dynamo.reset()
    model, eager, cache = fused_pair(seed=22)
    ids, mask = left_padded(3, 29, seed=22)
    want = model(ids, attention_mask=mask, past_key_values=eager, use_cache=True).logits
    model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    cache.reset()
    before = planes(cache)
    backend = Counting()
    compiled = torch.compile(model, backend=backend, fullgraph=fullgraph, dynamic=False)
    long_ids, long_mask = left_padded(3, CONTEXT + 6, seed=23)
    for _ in range(2):
        with pytest.raises(KVCapacityError, match=f"{CONTEXT + 6} tokens do not fit the pool's context of {CONTEXT}"):
            compiled(long_ids, attention_mask=long_mask, past_key_values=cache, use_cache=True)
        assert same_planes(planes(cache), before) == [] and cache.pool.held() == 0
    assert backend.graphs == 1  # traced whole: the refusal is an op in the graph, not a graph break
    got = compiled(ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits
    assert bits_equal(got, want) and same_planes(planes(cache), planes(eager)) == []


@torch.no_grad()
def test_a_prompt_after_the_held_tokens_past_the_context_is_refused_compiled():
    # 40 tokens held, 30 more do not fit 64: refused by the compiled graph (first > 0: the refusal does not
    # reach the unpacking of the held tokens, which would break the graph)
    torch._dynamo.reset()
    model, _, cache = fused_pair(seed=24)
    ids, mask = left_padded(3, 40, seed=24)
    model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    before = planes(cache)
    compiled = torch.compile(model, backend=Counting(), fullgraph=True, dynamic=False)
    more = torch.randint(3, 320, (3, 30), generator=torch.Generator().manual_seed(25))
    with pytest.raises(KVCapacityError, match="70 tokens do not fit"):
        compiled(more, past_key_values=cache, use_cache=True)
    assert same_planes(planes(cache), before) == [] and cache.pool.held() == 40


@pytest.mark.slow  # inductor compiles the model twice (about 35 s on 2 cores)
@torch.no_grad()
def test_an_inductor_prompt_holds_the_compiled_models_own_states():
    # inductor rounds the model's own arithmetic unlike eager, so the reference is the same compiled model
    # with a bf16 DynamicCache: its logits, and its keys and values as every bit the pool holds
    torch._dynamo.reset()
    model, _, cache = fused_pair(seed=26)
    ids, mask = left_padded(3, 37, seed=26)
    model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    cache.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    got = compiled(ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits
    dyn = DynamicCache()
    want = compiled(ids, attention_mask=mask, past_key_values=dyn, use_cache=True).logits
    assert bits_equal(got, want)
    for i, layer in enumerate(dyn.layers):
        k, v = cache.pool.to_bf16(i)
        assert bits_equal(k, layer.keys) and bits_equal(v, layer.values), i


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_a_reduce_overhead_prompt_gpu():
    # CUDA graphs (torch.compile(mode="reduce-overhead"), as benchmarks/scale.py --compile-prefill): replayed
    # prompts hold the compiled bf16 DynamicCache prompt's logits and states; a refusal raises on every call
    torch._dynamo.reset()
    model = tiny_llama(seed=27, layers=2, head_dim=64).cuda()
    enable_fused(model)
    cache = GlydStaticCache(model.config, max_cache_len=128, page_size=32)
    ids, mask = left_padded(3, 75, seed=27, device="cuda")
    model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)  # makes the pool outside the graphs
    cache.reset()
    backend = Counting()  # one graph on the GPU too (the CUDA-only branches of the pool included)
    torch.compile(model, backend=backend, fullgraph=True, dynamic=False)(ids, attention_mask=mask,
                                                                          past_key_values=cache, use_cache=True)
    assert backend.graphs == 1
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    dyn = DynamicCache()
    want = compiled(ids, attention_mask=mask, past_key_values=dyn, use_cache=True).logits.clone()
    states = [(layer.keys.clone(), layer.values.clone()) for layer in dyn.layers]  # before other graphs run
    for _ in range(4):  # the compile, CUDA graph trees' warm-up and recording, then replays
        cache.reset()
        got = compiled(ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits.clone()
        assert bits_equal(got, want) and cache.pool.held() == 75
    for i, (keys, values) in enumerate(states):
        k, v = cache.pool.to_bf16(i)
        assert bits_equal(k, keys) and bits_equal(v, values), i
    cache.reset()
    before = planes(cache)
    long_ids = torch.randint(3, 320, (3, 140), generator=torch.Generator().manual_seed(28)).cuda()
    for _ in range(3):
        with pytest.raises(KVCapacityError, match="140 tokens do not fit"):
            compiled(long_ids, past_key_values=cache, use_cache=True)
        assert same_planes(planes(cache), before) == [] and cache.pool.held() == 0
    got = compiled(ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits.clone()
    assert bits_equal(got, want)
