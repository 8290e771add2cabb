"""glyd.kv.generate: ``glyd.from_pretrained(..., kv="lossless")`` hands ``generate`` a GlydStaticCache sized as
transformers sizes its own static cache, whose tokens equal a bf16 DynamicCache's read by the same attention
(greedy with left padding, beam search, sampling with several sequences a prompt, inputs_embeds, prompt
lookup), on the CPU (the torch twins) and on a GPU (the Triton kernels); what the pool cannot do is refused
on one line that names the option and the growing cache."""

from __future__ import annotations

import math

import pytest
import torch

import glyd
from glyd.errors import UnsupportedError

from .conftest import tiny_llama, use_reference

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, DynamicCache, StaticCache  # noqa: E402

from glyd.kv import GlydCache, GlydStaticCache, KVCapacityError, enable_fused  # noqa: E402
from glyd.kv import generate as kv_generate  # noqa: E402

PAGE = 64  # GlydStaticCache's default page: what from_pretrained's pool takes
NEW = 20  # new tokens: a 50-token prompt's pool crosses its first page (64) while decoding


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _folder(tmp_path_factory, head_dim=16)


def _folder(tmp_path_factory, head_dim):
    path = tmp_path_factory.mktemp(f"tiny-llama-{head_dim}") / "model"
    tiny_llama(seed=5, head_dim=head_dim).save_pretrained(path)
    return path


def load(folder, device="cpu", **kw):
    return glyd.from_pretrained(folder, device=device, progress=False, **kw)


def prompt(device="cpu", batch=3, length=50):
    gen = torch.Generator().manual_seed(length + batch)
    ids = torch.randint(3, 320, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    for i in range(1, batch):
        mask[i, : 5 * i + 2] = 0  # left padding
        ids[i, : 5 * i + 2] = 0
    return ids.to(device), mask.to(device)


def run(model, seed=0, **kw):
    torch.manual_seed(seed)  # the same draws for sampling
    return model.generate(pad_token_id=0, return_dict_in_generate=True, **kw)


def check_against_reference(model, **kw):
    """generate through the pool kv="lossless" made, then through a bf16 DynamicCache read by the same
    attention (a fresh pool of the same context packed from it each step): the same tokens, bit for bit."""
    out = run(model, **kw)
    cache = out.past_key_values
    assert type(cache) is GlydStaticCache and cache.fused
    use_reference(model, PAGE, cache.context)
    try:
        ref = run(model, past_key_values=DynamicCache(), **kw)
    finally:
        enable_fused(model)
    assert torch.equal(out.sequences, ref.sequences)
    return out


CASES = {
    "greedy, left padding": dict(max_new_tokens=NEW, do_sample=False),
    "beam search, 2 beams": dict(max_new_tokens=NEW, num_beams=2, do_sample=False),
    "sampling, 2 sequences a prompt": dict(max_new_tokens=NEW, do_sample=True, num_return_sequences=2, top_k=0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tokens_equal_a_bf16_cache_read_by_the_same_attention(folder, case):
    model = load(folder, kv="lossless")
    ids, mask = prompt(batch=3 if case.startswith("greedy") else 2)
    out = check_against_reference(model, input_ids=ids, attention_mask=mask, **CASES[case])
    expand = max(CASES[case].get("num_beams", 1), CASES[case].get("num_return_sequences", 1))
    pool = out.past_key_values.pool
    assert pool.batch == expand * ids.shape[0] and out.sequences.shape[1] == ids.shape[1] + NEW
    assert pool.context == PAGE * math.ceil((ids.shape[1] + NEW - 1) / PAGE) == 128  # its pages were packed


def test_exact_weights_and_inputs_embeds(folder):
    # a prompt given as embeddings: the pool also holds its positions (transformers adds them to max_length)
    model = load(folder, kv="lossless", exact=True)
    ids, mask = prompt(batch=2, length=30)
    embeds = model.get_input_embeddings()(ids)
    out = check_against_reference(model, inputs_embeds=embeds, attention_mask=mask, max_new_tokens=NEW,
                                  do_sample=False)
    assert out.sequences.shape == (2, NEW) and out.past_key_values.context == PAGE * math.ceil((30 + NEW - 1) / PAGE)


def test_prompt_lookup_decoding(folder):
    # assisted decoding (prompt lookup): several tokens a step into the pool, then crop
    model = load(folder, kv="lossless")
    ids, _ = prompt(batch=1, length=40)
    ids = torch.cat([ids, ids[:, 10:30]], 1)  # a repeat for the lookup to find
    check_against_reference(model, input_ids=ids, max_new_tokens=NEW, do_sample=False, prompt_lookup_num_tokens=4)


def test_an_assistant_model_gets_the_growing_cache(folder):
    # the assistant's cache comes back to its generate call after call, each longer than it was sized
    # for: it gets the growing GlydCache (same kvf12 pages); the main model's tokens equal the reference's
    model, assistant = load(folder, kv="lossless"), load(folder, kv="lossless")
    made = []
    prepare = assistant._prepare_cache_for_generation

    def spy(*args, **kwargs):
        out = prepare(*args, **kwargs)
        model_kwargs = args[1] if len(args) > 1 else kwargs["model_kwargs"]
        made.append(type(model_kwargs["past_key_values"]))
        return out

    assistant.__dict__["_prepare_cache_for_generation"] = spy
    ids, _ = prompt(batch=1, length=40)
    check_against_reference(model, input_ids=ids, max_new_tokens=12, do_sample=False, assistant_model=assistant)
    assert made and set(made) == {GlydCache}


def test_sized_as_transformers_static_cache(folder):
    # the same calls on the same model with cache_implementation="static": transformers' StaticCache has
    # the pool's sequences and, rounded up to whole pages, its positions (call after call: a pool never
    # shrinks below the longest one made for the model, so a compiled step is not compiled again)
    model, plain = load(folder, kv="lossless"), AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    ids, mask = prompt(batch=2, length=30)
    calls = [dict(max_new_tokens=40), dict(max_new_tokens=3, num_beams=3),
             dict(max_new_tokens=3, do_sample=True, num_return_sequences=3), dict(max_new_tokens=3, max_cache_len=200)]
    for kw in calls:
        ours = run(model, input_ids=ids, attention_mask=mask, **kw).past_key_values
        theirs = run(plain, input_ids=ids, attention_mask=mask, cache_implementation="static", **kw).past_key_values
        assert type(theirs) is StaticCache, kw
        assert ours.pool.batch == theirs.batch_size and ours.context == PAGE * math.ceil(theirs.max_cache_len / PAGE), kw
    assert ours.context == 256


def test_a_callers_cache_stays_theirs(folder):
    model = load(folder, kv="lossless")
    ids, mask = prompt(batch=2, length=10)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=3)
    for cache in (DynamicCache(), GlydStaticCache(model.config, max_cache_len=64), GlydCache(model.config)):
        assert run(model, past_key_values=cache, **kw).past_key_values is cache
    assert type(run(model, cache_implementation="static", **kw).past_key_values) is StaticCache
    assert run(model, use_cache=False, **kw).past_key_values is None


def test_the_pool_is_checked_when_generate_returns(folder, monkeypatch):
    # under torch.compile or a CUDA graph a decode step cannot check: generate's end does (one host sync)
    checked = []
    monkeypatch.setattr(GlydStaticCache, "check", lambda self: checked.append(self))
    model = load(folder, kv="lossless")
    ids, mask = prompt(batch=1, length=10)
    out = run(model, input_ids=ids, attention_mask=mask, max_new_tokens=3)
    assert checked == [out.past_key_values]


def test_lossless_tiered_keeps_the_growing_cache(folder):
    model = load(folder, kv="lossless-tiered")
    assert model.config._attn_implementation == "sdpa"  # not switched: GlydCache's reference path
    ids, mask = prompt(batch=2, length=10)
    cache = run(model, input_ids=ids, attention_mask=mask, max_new_tokens=3).past_key_values
    assert type(cache) is GlydCache and cache.code == "kvtiered" and cache.get_seq_length() == 12
    assert model.glyd_make_cache().code == model.glyd_make_growing_cache().code == "kvtiered"


def test_wired_again_with_another_code(folder):
    model = load(folder, kv="lossless")
    kv_generate.wire(model, "kvtiered")  # wraps transformers' methods, not glyd's wrappers
    ids, mask = prompt(batch=2, length=10)
    cache = run(model, input_ids=ids, attention_mask=mask, max_new_tokens=3).past_key_values
    assert type(cache) is GlydCache and cache.code == "kvtiered"


def test_make_cache_on_the_model(folder):
    model = load(folder, kv="lossless")
    cache = model.glyd_make_cache(max_cache_len=100)  # what generate gets, sized by the caller
    assert type(cache) is GlydStaticCache and cache.fused and cache.code == "kvf12"
    growing = model.glyd_make_growing_cache()  # the cache kv="lossless" gave before the static pool
    assert type(growing) is GlydCache and growing.code == "kvf12" and not growing.fused
    ids, mask = prompt(batch=2, length=10)
    assert run(model, input_ids=ids, attention_mask=mask, max_new_tokens=3, past_key_values=cache).sequences.shape[1] == 13
    assert cache.context == 128


# -- refusals: one line, naming the option --------------------------------------------------------------


def test_contrastive_search_is_refused(folder):
    model = load(folder, kv="lossless")
    ids, _ = prompt(batch=1, length=10)
    never = []
    with pytest.raises(UnsupportedError, match=r"penalty_alpha with top_k > 1 .*past_key_values=glyd\.kv\.make_cache"):
        # transformers 5.17 runs contrastive search from the Hub; a custom_generate callable takes its place here
        model.generate(ids, penalty_alpha=0.6, top_k=4, max_new_tokens=3, pad_token_id=0,
                       custom_generate=lambda *a, **k: never.append(1))
    assert never == []


def test_a_method_that_changes_the_batch_is_refused(folder):
    def repeat(model, input_ids, past_key_values=None, **kwargs):
        model(input_ids, past_key_values=past_key_values, use_cache=True)
        past_key_values.batch_repeat_interleave(2)  # what contrastive search does to the cache

    model = load(folder, kv="lossless")
    ids, _ = prompt(batch=1, length=10)
    with pytest.raises(UnsupportedError, match=r"batch_repeat_interleave\(2\): .*glyd\.kv\.make_cache\(model\.config\)"):
        model.generate(ids, max_new_tokens=3, pad_token_id=0, custom_generate=repeat)


def test_prompts_longer_than_the_context_are_refused(folder):
    model = load(folder, kv="lossless")
    ids, mask = prompt(batch=1, length=30)
    with pytest.raises(ValueError, match="max_length"):  # transformers' own check, before any cache is made
        model.generate(ids, max_length=20, pad_token_id=0)
    with pytest.raises(KVCapacityError, match="30 tokens do not fit the pool's context of 16"):  # the caller's pool
        model.generate(ids, max_new_tokens=2, pad_token_id=0,
                       past_key_values=GlydStaticCache(model.config, max_cache_len=16, page_size=16))


def test_other_attention_is_refused(folder):
    with pytest.raises(UnsupportedError, match="attn_implementation='eager'"):
        load(folder, kv="lossless", attn_implementation="eager")
    assert load(folder, kv="lossless-tiered", attn_implementation="eager").config._attn_implementation == "eager"


def test_a_model_whose_attention_cannot_be_swapped_is_refused(folder, monkeypatch):
    # such a model would never call the "glyd_kv" attention: its one-token steps would attend to themselves
    monkeypatch.setattr(transformers.LlamaForCausalLM, "_supports_attention_backend", False)
    with pytest.raises(UnsupportedError, match="LlamaForCausalLM does not take"):
        load(folder, kv="lossless")


def test_soft_capping_and_sinks_are_refused_in_a_fused_step():
    # Gemma 2's soft-capping and gpt-oss's sinks come to the attention as arguments the fused decode has not
    from glyd.kv import hf_attention

    module = torch.nn.Module()
    module.layer_idx = 0
    q = torch.zeros(1, 2, 1, 16, dtype=torch.bfloat16)
    for name, value in (("softcap", 50.0), ("s_aux", torch.zeros(2))):
        hf_attention._LIVE[0] = (q, object())  # a fused step's entry (its key, its layer): the layer never reached
        with pytest.raises(UnsupportedError, match=f"layer 0\\) has no {name}; this model passes one"):
            hf_attention.glyd_kv_attention(module, q, q, q, None, **{name: value})
    assert hf_attention._LIVE == {}


def test_a_model_on_several_devices_is_refused(folder):
    model = load(folder, kv="lossless")
    model.hf_device_map = {"model.layers.0": 0, "model.layers.1": 1}  # as device_map="auto" over two GPUs says
    ids, _ = prompt(batch=1, length=10)
    with pytest.raises(UnsupportedError, match=r"spans \['0', '1'\] \(device_map\): pass past_key_values="):
        model.generate(ids, max_new_tokens=2, pad_token_id=0)


def test_other_cache_layouts_are_refused():
    from transformers.cache_utils import EncoderDecoderCache

    made = {"past_key_values": EncoderDecoderCache(DynamicCache(), DynamicCache())}
    with pytest.raises(UnsupportedError, match="EncoderDecoderCache.*an encoder-decoder"):
        kv_generate._one(["past_key_values"], made)


def test_an_unknown_generate_is_refused_at_load():
    model = tiny_llama(seed=1)
    model.__dict__["_prepare_cache_for_generation"] = lambda generation_config, model_kwargs: None
    with pytest.raises(UnsupportedError, match="names no batch_size, max_cache_length: load without kv="):
        kv_generate.wire(model, "kvf12")
    with pytest.raises(ValueError, match="code must be one of"):
        kv_generate.wire(tiny_llama(seed=1), "kv4")


# -- on a GPU --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder64(tmp_path_factory):
    return _folder(tmp_path_factory, head_dim=64)  # the Triton kernels take head dims >= 32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", list(CASES))
def test_tokens_equal_a_bf16_cache_read_by_the_same_attention_gpu(folder64, case):
    # packed weights on the GPU (fixed12 kernels), the pool's Triton writer and attention, eager steps
    model = load(folder64, device="cuda", kv="lossless")
    ids, mask = prompt("cuda", batch=3 if case.startswith("greedy") else 2)
    out = check_against_reference(model, input_ids=ids, attention_mask=mask, disable_compile=True,
                                  **{**CASES[case], "max_new_tokens": 60})
    assert out.past_key_values.context == 128 and out.past_key_values.pool.device.type == "cuda"


@pytest.mark.gpu
@pytest.mark.slow  # inductor compiles the model
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_generate_compiles_the_decode_step_gpu(folder64):
    # generate's default on CUDA: the pool is compileable, so the decode steps run under torch.compile
    # (CUDA graphs) with the packed weights' ops; inductor rounds other ops differently from eager, so
    # each token must be a greedy choice of one uncached forward, within rounding (as the static cache's test)
    from .test_kv_static_cache import greedy_gaps

    model = load(folder64, device="cuda", kv="lossless")
    ids, mask = prompt("cuda")
    out = run(model, input_ids=ids, attention_mask=mask, max_new_tokens=60, do_sample=False)
    assert type(out.past_key_values) is GlydStaticCache and hasattr(model, "_compiled_call")
    gaps = greedy_gaps(model, out.sequences, mask, ids.shape[1])
    assert float(gaps.max()) <= 0.1, gaps
