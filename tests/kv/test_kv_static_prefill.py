"""GlydStaticCache's prefill (issue 34): a prompt is attended over its own bf16 keys and values by SDPA (as a
bf16 cache's would be), its pages written by one op a side, and its position taken from the pool's host count
(no wait on the device). Tokens bit for bit a bf16 cache's (``kv_reference``) for chunked prompts, a second
prompt after decode steps, left padding and lengths that are not whole pages."""

from __future__ import annotations

import pytest
import torch

from .conftest import bits_equal, tiny_llama, use_reference

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402

from glyd.kv import GlydCache, GlydStaticCache, enable_fused  # noqa: E402
from glyd.kv.pool import FixedPagePool  # noqa: E402

PAGE, CONTEXT = 16, 128


def page_for(device: str) -> int:
    """16 on the CPU (chunks then start inside pages); CUDA's pool kernels take pages of >= 32 and head
    dims of >= 32 (the twin cannot run inside the CUDA graph that generate captures)."""
    return 32 if device == "cuda" else PAGE


def model_for(seed: int, device: str):
    return tiny_llama(seed=seed, head_dim=64 if device == "cuda" else 16).to(device)
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                  reason="needs CUDA")])]


def ids_and_mask(batch: int, length: int, pad: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 320, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    if pad:
        for i in range(1, batch):
            mask[i, : 3 * i + 2] = 0
            ids[i, : 3 * i + 2] = 0
    return ids, mask


def greedy(model, cache, ids, mask, steps):
    # eager on CUDA too: inductor rounds the projections differently from the eager reference
    out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=steps, do_sample=False,
                         pad_token_id=0, disable_compile=True)
    return out


def turns(model, make_cache, prompts, steps):
    """Greedy generate turn after turn on one cache: each turn's input is the sequence so far plus a new
    prompt (generate prefills only the tokens the cache does not hold: a prompt after decode steps)."""
    cache = make_cache()
    seq, mask, outs = None, None, []
    for p_ids, p_mask in prompts:
        seq = p_ids if seq is None else torch.cat([seq, p_ids], 1)
        mask = p_mask if mask is None else torch.cat([mask, p_mask], 1)
        out = greedy(model, cache, seq, mask, steps)
        outs.append(out[:, seq.shape[1]:])
        mask = torch.cat([mask, torch.ones_like(out[:, seq.shape[1]:])], 1)
        seq = out
    return outs, cache


@pytest.mark.parametrize("length", [16, 29, 47, 64])
@pytest.mark.parametrize("pad", [False, True])
def test_prompt_tokens_bit_for_bit(length, pad):
    model = tiny_llama(seed=5)
    prompts = [ids_and_mask(3, length, pad, seed=length)]
    use_reference(model, PAGE, CONTEXT)
    ref, _ = turns(model, DynamicCache, prompts, 12)
    enable_fused(model)
    got, cache = turns(model, lambda: GlydStaticCache(model.config, max_cache_len=CONTEXT, page_size=PAGE,
                                                      exc_fraction=1 / 64), prompts, 12)
    assert torch.equal(got[0], ref[0])
    cache.check()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pad", [False, True])
def test_second_prompt_after_decode_steps(pad, device):
    model = model_for(6, device)
    first = tuple(x.to(device) for x in ids_and_mask(2, 21, pad, seed=1))
    second = (torch.randint(3, 320, (2, 13), generator=torch.Generator().manual_seed(2)).to(device),
              torch.ones(2, 13, dtype=torch.long, device=device))
    use_reference(model, page_for(device), CONTEXT)
    ref, dyn = turns(model, DynamicCache, [first, second], 7)
    enable_fused(model)
    got, cache = turns(model, lambda: GlydStaticCache(model.config, max_cache_len=CONTEXT, page_size=page_for(device),
                                                      exc_fraction=1 / 64), [first, second], 7)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    for i, layer in enumerate(dyn.layers):  # every cached bit, the second prompt's pages included
        k, v = cache.pool.to_bf16(i)
        assert bits_equal(k, layer.keys[:, :, : k.shape[2]]) and bits_equal(v, layer.values[:, :, : v.shape[2]]), i


@pytest.mark.parametrize("device", DEVICES)
@torch.no_grad()
def test_chunked_prefill_bit_for_bit(device):
    # a prompt in chunks that start inside a page (7 + 20 + 18 tokens), then decode steps
    model = model_for(7, device)
    ids, mask = (x.to(device) for x in ids_and_mask(2, 45, False, seed=3))
    # the reference is prefilled in the same chunks: a GEMM's rounding may depend on its rows (cuBLAS)
    def prefill(cache):
        for a, b in ((0, 7), (7, 27), (27, 44)):
            pos = torch.arange(a, b, device=device)[None].expand(2, -1)
            model(ids[:, a:b], position_ids=pos, past_key_values=cache, use_cache=True)
        return cache

    use_reference(model, page_for(device), CONTEXT)
    ref = greedy(model, prefill(DynamicCache()), ids, mask, 9)[:, 45:]
    enable_fused(model)
    cache = prefill(GlydStaticCache(model.config, max_cache_len=CONTEXT, page_size=page_for(device),
                                    exc_fraction=1 / 64))
    assert cache.pool.held() == 44 and cache.pool.lens.tolist() == [44, 44]
    got = greedy(model, cache, ids, mask, 9)[:, 45:]
    assert torch.equal(got, ref)


def test_a_prompt_write_reads_no_device_value(monkeypatch):
    # the position of a prompt comes from the pool's host count: no .item()/int()/tolist() of a tensor
    pool = FixedPagePool(layers=1, batch=2, heads=2, head_dim=32, max_len=128, page=16)
    k = torch.randn(2, 2, 37, 32).to(torch.bfloat16)
    v = torch.randn(2, 2, 37, 32).to(torch.bfloat16)
    pool.advance(37)
    pool.write(0, k[:, :, :37], v[:, :, :37])

    def boom(*a, **kw):
        raise AssertionError("a host sync in a prompt's write")

    k2, v2 = torch.randn(2, 2, 21, 32).to(torch.bfloat16), torch.randn(2, 2, 21, 32).to(torch.bfloat16)
    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__int__", "__index__", "__bool__"):
            m.setattr(torch.Tensor, name, boom)
        pool.advance(21)
        assert pool.write(0, k2, v2) == 37  # starts inside page 2 and fills it: two writes, still no sync
    kd, vd = pool.to_bf16(0)
    assert bits_equal(kd, torch.cat([k, k2], 2)) and bits_equal(vd, torch.cat([v, v2], 2))


def test_the_host_count_is_forgotten_when_lens_changes_elsewhere():
    pool = FixedPagePool(layers=1, batch=1, heads=1, head_dim=32, max_len=64, page=16)
    pool.advance(5)
    assert pool.held() == 5
    pool.lens.fill_(9)  # a replayed graph or a rewind
    pool.forget()
    assert pool.held() == 9
    pool.reset()
    assert pool.held() == 0


def test_a_refused_prompt_leaves_the_cache_as_it_was():
    # a prompt the pool refuses (too long for its context, or another number of sequences) must not count
    # its tokens: the next prompt on the same cache then runs as on a fresh one
    from glyd.errors import FormatError
    from glyd.kv import KVCapacityError

    model = tiny_llama(seed=8)
    short = ids_and_mask(2, 10, False, seed=9)
    use_reference(model, PAGE, 32)
    ref = greedy(model, DynamicCache(), *short, 5)
    enable_fused(model)
    cache = GlydStaticCache(model.config, max_cache_len=32, page_size=PAGE, exc_fraction=1 / 64)
    with pytest.raises(KVCapacityError, match="do not fit the pool's context of 32"):
        greedy(model, cache, *ids_and_mask(2, 40, False, seed=10), 2)
    assert cache.pool.lens.tolist() == [0, 0] and cache.pool.held() == 0
    assert torch.equal(greedy(model, cache, *short, 5), ref)
    cache.reset()
    with pytest.raises(FormatError, match="does not match the pool's"):
        greedy(model, cache, *ids_and_mask(3, 10, False, seed=9), 2)
    assert cache.pool.lens.tolist() == [0, 0] and cache.pool.held() == 0
    assert torch.equal(greedy(model, cache, *short, 5), ref)


@torch.no_grad()
def test_masked_positions_inside_the_sequence_do_not_reach_a_fused_step():
    # a second prompt left-padded on row 1 puts masked positions after real ones; what those positions hold
    # must not change any later output (as with a bf16 DynamicCache and SDPA: checked below too)
    model = tiny_llama(seed=11)
    ids, mask = ids_and_mask(2, 21, False, seed=11)
    second = torch.randint(3, 320, (2, 9), generator=torch.Generator().manual_seed(12))
    hole = torch.ones_like(second)
    hole[1, :5] = 0

    def step_logits(make_cache, filler):
        cache, p2 = make_cache(), second.clone()
        p2[1, :5] = filler
        model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        m = torch.cat([mask, hole], 1)
        model(p2, attention_mask=m, past_key_values=cache, use_cache=True)
        m = torch.cat([m, torch.ones(2, 1, dtype=torch.long)], 1)
        return model(torch.full((2, 1), 7), attention_mask=m, past_key_values=cache, use_cache=True).logits

    model.set_attn_implementation("sdpa")
    assert bits_equal(step_logits(DynamicCache, 0), step_logits(DynamicCache, 5))
    enable_fused(model)
    make = lambda: GlydStaticCache(model.config, max_cache_len=CONTEXT, page_size=PAGE, exc_fraction=1 / 64)  # noqa: E731
    assert bits_equal(step_logits(make, 0), step_logits(make, 5))
    for code in ("kvtiered", "kvf12"):  # GlydCache's fused step reads the same row of the mask
        make = lambda: GlydCache(model.config, page_size=PAGE, fused=True, code=code)  # noqa: E731
        assert bits_equal(step_logits(make, 0), step_logits(make, 5)), code


def test_max_cache_len_is_whole_pages_from_the_start():
    # max_cache_len=53 holds 64 tokens (pages of 16), but until the first prompt made the pool the cache
    # said 53: a fused prompt of 54..64 tokens got a 53-wide mask and failed inside SDPA
    model = tiny_llama(seed=12)
    ids, mask = ids_and_mask(2, 60, True, seed=12)
    use_reference(model, PAGE, 64)
    ref = greedy(model, DynamicCache(), ids, mask, 4)
    enable_fused(model)
    cache = GlydStaticCache(model.config, max_cache_len=53, page_size=PAGE, exc_fraction=1 / 64)
    assert cache.get_max_length() == 64
    assert torch.equal(greedy(model, cache, ids, mask, 4), ref)
