"""GlydStaticCache (a static pool of kvf12 pages) under transformers: the tokens and every cached bit of a
bf16 cache read the same way, on the CPU (the torch twins) and on a GPU (the Triton kernels, the decode
steps replayed from one CUDA graph); the reference path bit for bit SDPA's; torch.compile's one graph."""

from __future__ import annotations

import pytest
import torch

from glyd.errors import FormatError, UnsupportedError

from .conftest import bits_equal, tiny_llama, use_reference

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402

from glyd.kv import GlydStaticCache, enable_fused  # noqa: E402

PAGE, CONTEXT = 16, 96


def prompt(device="cpu", batch=3, length=29):
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(3, 320, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    for i in range(1, batch):
        mask[i, : 4 * i + 1] = 0  # left padding
        ids[i, : 4 * i + 1] = 0
    return ids.to(device), mask.to(device)


def reference_run(model, ids, mask, steps, page=PAGE):
    """Greedy tokens and logits through a bf16 DynamicCache (every layer's keys and values kept)."""
    use_reference(model, page, CONTEXT)
    dyn = DynamicCache()
    out = model.generate(ids, attention_mask=mask, past_key_values=dyn, max_new_tokens=steps, do_sample=False,
                         pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1), dyn


@torch.no_grad()
def pool_run(model, cache, ids, mask, steps, graph=False):
    """Greedy decoding through ``cache``: a prompt, then one-token steps that read only static buffers
    (input ids, position ids, a 4-D mask of the whole context), replayed from one CUDA graph when ``graph``."""
    b, t = ids.shape
    first = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # position ids as generate makes them
    out = model(ids, attention_mask=mask, position_ids=first, past_key_values=cache, use_cache=True)
    logits, toks = [out.logits[:, -1].float()], [out.logits[:, -1:].argmax(-1)]
    tok = toks[0].clone()
    pos = mask.sum(1, keepdim=True)  # each row's next position (left padding: its real tokens so far)
    m4 = torch.full((b, 1, 1, cache.context), torch.finfo(torch.bfloat16).min, dtype=torch.bfloat16, device=ids.device)
    m4[..., :t] = torch.where(mask.bool(), 0.0, torch.finfo(torch.bfloat16).min)[:, None, None, :].to(torch.bfloat16)

    def step():
        return model(input_ids=tok, attention_mask=m4, position_ids=pos, past_key_values=cache, use_cache=True).logits

    run = step
    if graph:
        pool = cache.pool
        counters = [pool.lens, *pool.k.used, *pool.v.used]
        saved = [x.clone() for x in counters]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()  # warm-up (it writes a token: put the pool's counters back)
        torch.cuda.current_stream().wait_stream(stream)
        for x, s in zip(counters, saved):
            x.copy_(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            captured = step()

        def run():
            g.replay()
            return captured

    for i in range(steps - 1):
        m4[..., t + i] = 0
        lg = run()[:, -1]
        logits.append(lg.float())
        toks.append(lg.argmax(-1, keepdim=True))
        tok.copy_(toks[-1])
        pos.add_(1)
    return torch.cat(toks, 1), torch.stack(logits, 1)


def check_against_reference(device, graph, steps=24, head_dim=16, page=PAGE):
    model = tiny_llama(seed=3, head_dim=head_dim).to(device)
    ids, mask = prompt(device)
    ref_toks, ref_logits, dyn = reference_run(model, ids, mask, steps, page)
    enable_fused(model)
    cache = GlydStaticCache(model.config, max_cache_len=CONTEXT, page_size=page, exc_fraction=1 / 64)
    toks, logits = pool_run(model, cache, ids, mask, steps, graph=graph)
    assert torch.equal(toks, ref_toks)  # the tokens, bit for bit
    assert bits_equal(logits.to(torch.bfloat16), ref_logits.float().to(torch.bfloat16))
    cache.check()
    for i, layer in enumerate(dyn.layers):  # every cached bit of every layer
        k, v = cache.pool.to_bf16(i)
        assert bits_equal(k, layer.keys[:, :, : k.shape[2]]) and bits_equal(v, layer.values[:, :, : v.shape[2]]), i
    assert cache.pool.lens.tolist() == [ids.shape[1] + steps - 1] * ids.shape[0]
    return cache


def test_tokens_and_bits_of_a_bf16_cache_cpu():
    cache = check_against_reference("cpu", graph=False)
    assert 0 < cache.nbytes < cache.bf16_nbytes


def test_generate_through_the_pool():
    model = tiny_llama(seed=3)
    ids, mask = prompt()
    ref_toks, _, _ = reference_run(model, ids, mask, 24)
    enable_fused(model)
    cache = GlydStaticCache(model.config, max_cache_len=CONTEXT, page_size=PAGE)
    out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=24, do_sample=False,
                         pad_token_id=0)
    assert torch.equal(out[:, ids.shape[1]:], ref_toks)
    assert cache.is_compileable and cache.get_seq_length() == ids.shape[1] + 23


def test_reference_path_is_sdpa_bit_for_bit():
    model = tiny_llama(seed=4)
    ids, mask = prompt()
    kw = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    dyn = DynamicCache()
    ref = model.generate(ids, past_key_values=dyn, **kw)
    cache = GlydStaticCache(model.config, max_cache_len=CONTEXT, page_size=PAGE, fused=False)
    assert torch.equal(model.generate(ids, past_key_values=cache, **kw), ref)
    assert not cache.is_compileable
    for i, layer in enumerate(dyn.layers):
        k, v = cache.pool.to_bf16(i)
        assert bits_equal(k, layer.keys) and bits_equal(v, layer.values), i
    cache.crop(-5)  # surgery through the whole cache
    assert bits_equal(cache.pool.to_bf16(1)[0], dyn.layers[1].keys[:, :, :-5])
    cache.reorder_cache(torch.tensor([2, 0, 1]))
    assert bits_equal(cache.pool.to_bf16(0)[1], dyn.layers[0].values[[2, 0, 1], :, :-5])
    with pytest.raises(UnsupportedError, match=r"batch_select_indices: .*past_key_values=glyd\.kv\.make_cache"):
        cache.batch_select_indices(torch.tensor([0]))
    with pytest.raises(UnsupportedError, match=r"batch_repeat_interleave\(2\): .*the growing cache"):
        cache.batch_repeat_interleave(2)


def test_refusals():
    model = tiny_llama(seed=1)
    with pytest.raises(FormatError, match="glyd_kv"):
        GlydStaticCache(model.config, max_cache_len=64)  # fused needs the attention
    with pytest.raises(FormatError, match="max_cache_len or memory_fraction"):
        GlydStaticCache(model.config, fused=False)
    with pytest.raises(FormatError, match="batch_size and device"):
        GlydStaticCache(model.config, fused=False, memory_fraction=0.5)
    with pytest.raises(FormatError, match="batch_size must be a positive int"):
        GlydStaticCache(model.config, max_cache_len=32, fused=False, batch_size=0)
    cache = GlydStaticCache(model.config, max_cache_len=32, page_size=16, fused=False, batch_size=2)
    with torch.no_grad(), pytest.raises(FormatError, match="made for 2 sequences; key_states hold 1"):
        model(torch.ones(1, 4, dtype=torch.long), past_key_values=cache, use_cache=True)  # not silently a pool of 1
    cache = GlydStaticCache(model.config, max_cache_len=32, page_size=16, fused=False)
    with torch.no_grad(), pytest.raises(FormatError, match="bf16"):
        model.float()(torch.ones(1, 4, dtype=torch.long), past_key_values=cache, use_cache=True)


def test_decode_step_compiles_to_one_graph():
    # torch.compile traces the whole decode step, the cache and both ops included, with no graph break
    # and no recompilation from step to step (the shapes are static).
    torch._dynamo.reset()
    model = tiny_llama(seed=2, layers=1)
    enable_fused(model)
    cache = GlydStaticCache(model.config, max_cache_len=48, page_size=16)
    ids, mask = prompt(batch=2, length=13)
    eager_model = tiny_llama(seed=2, layers=1)
    enable_fused(eager_model)
    eager = GlydStaticCache(eager_model.config, max_cache_len=48, page_size=16)
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm.forward

    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)  # the prompt: eager
        eager_model(ids, attention_mask=mask, past_key_values=eager, use_cache=True)
        tok = torch.full((2, 1), 7)
        m4 = torch.zeros(2, 1, 1, 48, dtype=torch.bfloat16)
        m4[..., 13:] = torch.finfo(torch.bfloat16).min
        m4[1, ..., :5] = torch.finfo(torch.bfloat16).min
        pos = mask.sum(1, keepdim=True)
        for i in range(4):  # across a page boundary (token 16)
            m4[..., 13 + i] = 0
            kw = dict(input_ids=tok, attention_mask=m4, position_ids=pos + i, use_cache=True)
            got = compiled(past_key_values=cache, **kw).logits
            want = eager_model(past_key_values=eager, **kw).logits
            assert bits_equal(got, want)
    assert len(frames) == 1  # one graph, compiled once
    assert cache.pool.lens.tolist() == [17, 17] and bits_equal(cache.pool.to_bf16(0)[0], eager.pool.to_bf16(0)[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graph", [False, True])
def test_tokens_and_bits_of_a_bf16_cache_gpu(graph):
    # the Triton page writer and decode kernel (head dim 64: the kernels take head dims >= 32), the decode
    # steps replayed from one CUDA graph; pages of 16 run only under the interpreter: pages of 32 here
    check_against_reference("cuda", graph=graph, steps=60, head_dim=64, page=32)


def test_a_model_switched_back_to_sdpa_is_refused():
    # fused decode steps hand the model's attention the new token only: any attention but "glyd_kv"
    # would attend to that token alone, so the cache refuses the step
    model = tiny_llama(seed=1)
    enable_fused(model)
    cache = GlydStaticCache(model.config, max_cache_len=48, page_size=16)
    ids, mask = prompt(batch=1, length=9)
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True)
        model.set_attn_implementation("sdpa")
        with pytest.raises(FormatError, match="glyd_kv"):
            model(ids[:, :1], past_key_values=cache, use_cache=True)


def test_generate_past_the_context_raises():
    from glyd.kv import KVCapacityError

    model = tiny_llama(seed=1)
    enable_fused(model)
    cache = GlydStaticCache(model.config, max_cache_len=32, page_size=16)
    ids = torch.randint(3, 320, (1, 28), generator=torch.Generator().manual_seed(1))
    with pytest.raises(KVCapacityError, match="context"):
        model.generate(ids, past_key_values=cache, max_new_tokens=10, do_sample=False, pad_token_id=0)
    with pytest.raises(KVCapacityError, match="context"):  # a prompt that does not fit: refused before writing
        model.generate(ids, past_key_values=GlydStaticCache(model.config, max_cache_len=16, page_size=16),
                       max_new_tokens=2, do_sample=False, pad_token_id=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_eager_steps_raise_on_overflow_gpu():
    # past the pool's context, eager decode steps raise within a few steps (no host wait a step)
    from glyd.kv import KVCapacityError

    model = tiny_llama(seed=1, head_dim=64).cuda()
    enable_fused(model)
    cache = GlydStaticCache(model.config, max_cache_len=64, page_size=32)
    ids = torch.randint(3, 320, (1, 60), generator=torch.Generator().manual_seed(1)).cuda()
    with pytest.raises(KVCapacityError, match="context"):
        model.generate(ids, past_key_values=cache, max_new_tokens=20, do_sample=False, pad_token_id=0,
                       disable_compile=True)


@pytest.mark.gpu
@pytest.mark.slow  # inductor compiles the model
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_generate_compiles_the_decode_step_gpu():
    # the cache is compileable, so generate on CUDA runs its decode steps under torch.compile
    # (mode="reduce-overhead": CUDA graphs). Inductor rounds the other ops differently from eager and a
    # random tiny model has many near ties, so the two runs may part; each run's every token must be a
    # greedy choice of one bf16 forward over the whole sequence (no cache), within rounding
    model = tiny_llama(seed=3, head_dim=64).cuda()
    enable_fused(model)
    ids, mask = prompt("cuda")
    kw = dict(attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=0)
    for compiled in (False, True):
        cache = GlydStaticCache(model.config, max_cache_len=128, page_size=32)
        out = model.generate(ids, past_key_values=cache, disable_compile=not compiled, **kw)
        cache.check()
        assert cache.pool.lens.tolist() == [ids.shape[1] + 39] * 3
        gaps = greedy_gaps(model, out, mask, ids.shape[1])
        # a wrong cache gives tokens about 2 below the best logit (a random token's median gap)
        assert float(gaps.max()) <= 0.1, (compiled, gaps)
    assert hasattr(model, "_compiled_call")  # generate did compile


def greedy_gaps(model, out, mask, start):
    """How far below the best logit each generated token of `out` lies, the logits from one forward of
    the whole sequence with transformers' own attention and no cache."""
    full = torch.cat([mask, torch.ones_like(out[:, start:])], 1)
    model.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            logits = model(out, attention_mask=full, use_cache=False).logits.float()[:, start - 1:-1]
    finally:
        enable_fused(model)
    return logits.max(-1).values - logits.gather(-1, out[:, start:, None])[..., 0]


@pytest.mark.parametrize("bad", [0, -5, 40.0, True])
def test_a_bad_max_cache_len_is_refused_by_name_when_the_cache_is_made(bad):
    # it was taken and refused only at the first prompt, as the pool's "max_len"
    model = tiny_llama(seed=1)
    with pytest.raises(FormatError, match=rf"GlydStaticCache max_cache_len must be a positive int, got {bad!r}"):
        GlydStaticCache(model.config, max_cache_len=bad, fused=False)


def test_memory_fraction_off_cuda_says_what_to_pass():
    # it said "pass free_bytes=", which GlydStaticCache does not take
    model = tiny_llama(seed=1)
    with pytest.raises(FormatError, match="memory_fraction measures free GPU memory.*max_cache_len"):
        GlydStaticCache(model.config, memory_fraction=0.5, batch_size=1, device="cpu", fused=False)


def test_a_reorder_to_another_batch_is_refused_and_keeps_the_cache():
    # index_select with fewer (or more) indices than sequences would change the pool's batch: it emptied the
    # pool and then failed on the write (lens and the exception counters no longer said what the pages held)
    model = tiny_llama(seed=2)
    cache = GlydStaticCache(model.config, max_cache_len=CONTEXT, page_size=PAGE, fused=False)
    ids, mask = prompt(batch=3, length=37)
    with torch.no_grad():
        model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    before = [cache.pool.to_bf16(i) for i in range(2)]
    nbytes = cache.nbytes
    with pytest.raises(UnsupportedError, match=r"reorder_cache: 2 indices for 3 sequences.*fixed number of sequences"):
        cache.reorder_cache(torch.tensor([0, 1]))
    assert cache.pool.lens.tolist() == [37, 37, 37] and cache.nbytes == nbytes
    for i, (k, v) in enumerate(before):
        kd, vd = cache.pool.to_bf16(i)
        assert bits_equal(kd, k) and bits_equal(vd, v), i
