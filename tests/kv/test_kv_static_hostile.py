"""Hostile inputs to GlydStaticCache and its pool: every refusal is one named error and leaves the cache as it
was (or says what it did), never a deep IndexError or a moved ``lens``."""

from __future__ import annotations

import pytest
import torch

from .conftest import bits_equal, tiny_llama

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402

from glyd.errors import FormatError, UnsupportedError  # noqa: E402
from glyd.kv import GlydStaticCache, KVCapacityError, enable_fused  # noqa: E402
from glyd.kv.pool import FixedPagePool  # noqa: E402

PAGE = 8


def ids_of(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 320, (batch, length), generator=torch.Generator().manual_seed(seed))


def held(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [tuple(t.clone() for t in cache.pool.to_bf16(i)) for i in range(len(cache.layers))]


def same_bits(a, b) -> bool:
    return all(bits_equal(x, y) for pa, pb in zip(a, b, strict=True) for x, y in zip(pa, pb, strict=True))


@pytest.mark.parametrize("fused", [False, True])
@torch.no_grad()
def test_an_eager_step_past_the_context_is_refused_before_lens_moves(fused):
    # a one-token step into a full pool advanced lens past the context, wrote, and only then raised (from the
    # attention twin or to_bf16): lens stayed one past the context, so crop() and to_bf16() raised ever after
    model = tiny_llama(seed=7)
    if fused:
        enable_fused(model)
    cache = GlydStaticCache(model.config, max_cache_len=16, page_size=PAGE, fused=fused)
    ids = ids_of(2, 16)
    model(ids, past_key_values=cache, use_cache=True)
    before = held(cache)
    with pytest.raises(KVCapacityError, match="17 tokens do not fit the pool's context of 16"):
        model(ids[:, :1], past_key_values=cache, use_cache=True)
    assert cache.pool.lens.tolist() == [16, 16] and cache.pool.held() == 16
    assert same_bits(held(cache), before)
    cache.crop(-1)  # the cache is still usable: the step fits once a token is gone
    ref = DynamicCache()
    model(ids, past_key_values=ref, use_cache=True)
    ref.crop(-1)
    if fused:
        return  # (the fused step's reference is another attention: test_kv_static_cache covers it)
    got = model(ids[:, 15:], past_key_values=cache, use_cache=True).logits
    want = model(ids[:, 15:], past_key_values=ref, use_cache=True).logits
    assert bits_equal(got, want)


@torch.no_grad()
def test_a_model_with_more_layers_than_the_cache_is_named_and_the_cache_emptied():
    # the 3-layer model's first two layers were written into the 2-layer cache, then transformers' Cache.update
    # raised a bare IndexError, leaving the cache holding two models' tokens mixed
    small, big = tiny_llama(seed=3, layers=2), tiny_llama(seed=4, layers=3)
    cache = GlydStaticCache(small.config, max_cache_len=32, page_size=PAGE, fused=False)
    ids = ids_of(2, 10)
    small(ids, past_key_values=cache, use_cache=True)
    with pytest.raises(FormatError, match=r"made for 2 layers; layer 2 is not one of them.*emptied"):
        big(ids, past_key_values=cache, use_cache=True)
    assert cache.pool.lens.tolist() == [0, 0] and cache.pool.held() == 0
    got = small(ids, past_key_values=cache, use_cache=True).logits  # the emptied cache serves its model again
    assert bits_equal(got, small(ids, past_key_values=DynamicCache(), use_cache=True).logits)


@pytest.mark.parametrize("beam_idx, why", [
    (torch.tensor([0, 5]), r"indices must be in 0\.\.1, got \[0, 5\]"),
    (torch.tensor([-1, 0]), r"indices must be in 0\.\.1, got \[-1, 0\]"),
    (torch.tensor([1.0, 0.0]), "integer tensor"),
    (torch.tensor([True, False]), "integer tensor"),
    ([1, 0], "integer tensor"),
    (torch.tensor([[1, 0]]), r"1-D, got shape \(1, 2\)"),
])
@torch.no_grad()
def test_a_bad_beam_index_is_named_and_keeps_the_cache(beam_idx, why):
    model = tiny_llama(seed=5)
    cache = GlydStaticCache(model.config, max_cache_len=32, page_size=PAGE, fused=False)
    model(ids_of(2, 10), past_key_values=cache, use_cache=True)
    before = held(cache)
    with pytest.raises(FormatError, match=f"reorder_cache.*{why}"):
        cache.reorder_cache(beam_idx)
    assert cache.pool.lens.tolist() == [10, 10] and same_bits(held(cache), before)
    cache.reorder_cache(torch.tensor([1, 0], dtype=torch.int32))  # a good one still works
    assert same_bits(held(cache), [(k.flip(0), v.flip(0)) for k, v in before])


@pytest.mark.parametrize("bad", [-0.5, -2.0, None, "1"])
@torch.no_grad()
def test_a_bad_crop_count_is_named_and_keeps_the_cache(bad):
    model = tiny_llama(seed=6)
    cache = GlydStaticCache(model.config, max_cache_len=32, page_size=PAGE, fused=False)
    model(ids_of(2, 10), past_key_values=cache, use_cache=True)
    before = held(cache)
    with pytest.raises(FormatError, match=r"crop\(.*\): tokens_to_remove must be an int"):
        cache.crop(bad)
    assert cache.pool.lens.tolist() == [10, 10] and same_bits(held(cache), before)
    cache.crop(torch.tensor(-2))  # a 0-d integer tensor is an int
    assert same_bits(held(cache), [(k[:, :, :8], v[:, :, :8]) for k, v in before])


@pytest.mark.parametrize("page", [16.0, "16"])
def test_a_page_that_is_not_an_int_is_named(page):
    with pytest.raises(FormatError, match="page must be a positive int"):
        FixedPagePool(1, 1, 1, 16, 64, page=page)
    with pytest.raises(FormatError, match="head_dim must be a positive int"):
        FixedPagePool(1, 1, 1, 16.0, 64, page=16)


@torch.no_grad()
def test_a_fused_step_whose_attention_never_ran_is_not_read_by_another_cache():
    # a model with SDPA stepping into a fused cache made from another model's config fails in SDPA, after the
    # cache's update had left its layer for the "glyd_kv" attention; the next one-token call of a "glyd_kv" model
    # with another cache (here a DynamicCache) took that layer and attended the static pool's tokens instead
    fused_model, sdpa_model = tiny_llama(seed=1), tiny_llama(seed=2)
    enable_fused(fused_model)
    ids = ids_of(2, 9)
    want = fused_model(ids[:, :1], past_key_values=DynamicCache(), use_cache=True).logits
    cache = GlydStaticCache(fused_model.config, max_cache_len=32, page_size=PAGE)
    fused_model(ids, past_key_values=cache, use_cache=True)
    with pytest.raises(RuntimeError):
        sdpa_model(ids[:, :1], past_key_values=cache, use_cache=True)
    got = fused_model(ids[:, :1], past_key_values=DynamicCache(), use_cache=True).logits
    assert bits_equal(got, want)


def test_a_pool_write_before_advance_is_refused_and_writes_nothing():
    # FixedPagePool.write without advance() put a prompt at position -T (pages clamped to the sequence's first):
    # silently written over nothing or over held tokens, and to_bf16 later read other bits
    x = torch.randn(1, 2, 12, 16).to(torch.bfloat16)
    pool = FixedPagePool(1, 1, 2, 16, 64, page=PAGE)
    for t in (5, 1):
        with pytest.raises(FormatError, match=rf"holds 0 tokens a sequence, fewer than the {t} written; call advance"):
            pool.write(0, x[:, :, :t], x[:, :, :t])
    assert pool.lens.tolist() == [0] and pool.k.used_counts() == [0] and not pool.k.raw[0].view(torch.int16).any()
    pool.advance(12)
    pool.write(0, x, x)
    with pytest.raises(FormatError, match=r"advance\(-13\): the pool holds 12 tokens"):
        pool.advance(-13)
    with pytest.raises(FormatError, match=r"advance\(1\.5\): tokens must be an int"):
        pool.advance(1.5)
    assert pool.lens.tolist() == [12] and bits_equal(pool.to_bf16(0)[0], x)


@torch.no_grad()
def test_a_reorder_that_would_overflow_the_exception_arena_is_refused_and_keeps_the_cache():
    # beam search repeats a sequence: a rewrite repeating the one whose keys hold the exceptions overflowed the
    # arena; reorder_cache returned, and the cache's pages were lost (the next read or check raised)
    model = tiny_llama(seed=1, layers=1)

    def wild(module, args, out):  # sequence 0's keys: 40 values far outside their windows
        out = out.clone()
        flat = out[0].reshape(-1)
        flat[:: flat.numel() // 40][:40] = 1e30
        return out

    model.model.layers[0].self_attn.k_proj.register_forward_hook(wild)
    cache = GlydStaticCache(model.config, max_cache_len=16, page_size=PAGE, fused=False, exc_fraction=0.1)
    model(ids_of(2, 16), past_key_values=cache, use_cache=True)
    used, arena = cache.pool.k.used_counts()[0], cache.pool.k.arena
    assert used <= arena < 2 * used  # (the case: it fits once, not twice)
    before = held(cache)
    with pytest.raises(KVCapacityError, match=rf"layer 0 keys take {2 * used} exception entries, more than the "
                                              rf"{arena} reserved .*unchanged"):
        cache.reorder_cache(torch.tensor([0, 0]))
    assert cache.pool.lens.tolist() == [16, 16] and cache.pool.k.used_counts() == [used]
    assert same_bits(held(cache), before)
    cache.reorder_cache(torch.tensor([1, 1]))  # the tame sequence repeated fits
    cache.check()


def test_the_exception_count_before_a_rewrite_is_the_writes():
    from .conftest import all_bf16_patterns

    x = all_bf16_patterns()[torch.randperm(65536, generator=torch.Generator().manual_seed(0))[:2 * 2 * 37 * 16]]
    x = x.reshape(2, 2, 37, 16)
    pool = FixedPagePool(1, 2, 2, 16, 64, page=PAGE, exc_fraction=1.0)
    pool.advance(37)
    pool.write(0, x, x)
    assert pool.exceptions(x) == pool.k.used_counts()[0] > 0


@pytest.mark.parametrize("device", ["cuda:3", "meta", torch.device("cuda")])
@torch.no_grad()
def test_a_device_other_than_the_prompts_is_refused_by_name(device):
    # with max_cache_len, device= was dropped: the pool went silently to the keys' device (the CPU here)
    model = tiny_llama(seed=1)
    cache = GlydStaticCache(model.config, max_cache_len=32, page_size=PAGE, fused=False, device=device)
    want = str(torch.device(device))
    with pytest.raises(UnsupportedError, match=rf"made for device {want}; key_states are on cpu \(pass device='cpu'"):
        model(ids_of(1, 4), past_key_values=cache, use_cache=True)
    assert cache.pool is None  # nothing was made
    cache = GlydStaticCache(model.config, max_cache_len=32, page_size=PAGE, fused=False, device="cpu")
    model(ids_of(1, 4), past_key_values=cache, use_cache=True)  # the device asked for: taken
    assert cache.pool.device == torch.device("cpu") and cache.pool.lens.tolist() == [4]


@pytest.mark.parametrize("device", ["nvidia", "cuda:x", 1.5, True])
def test_a_device_that_is_not_one_is_named_when_the_cache_is_made(device):
    model = tiny_llama(seed=1)
    with pytest.raises(FormatError, match=r"GlydStaticCache device .*"):
        GlydStaticCache(model.config, max_cache_len=32, page_size=PAGE, fused=False, device=device)


@pytest.mark.parametrize("bad", [True, False, float("nan"), float("inf"), 0, 0.0, -0.1, 1.5, "0.1", None])
def test_a_bad_exc_fraction_is_named_when_the_cache_is_made(bad):
    # True was taken as 1.0 (a bool is an int), and every bad value was refused only at the first prompt
    model = tiny_llama(seed=1)
    with pytest.raises(FormatError, match=r"GlydStaticCache exc_fraction must be (a number )?in \(0, 1\], got "):
        GlydStaticCache(model.config, max_cache_len=32, page_size=PAGE, fused=False, exc_fraction=bad)
    with pytest.raises(FormatError, match=r"^exc_fraction must be (a number )?in \(0, 1\]"):
        FixedPagePool(1, 1, 1, 16, 64, page=16, exc_fraction=bad)


@pytest.mark.parametrize("bad", [True, float("nan"), 0, 1.5, "0.5"])
def test_a_bad_memory_fraction_is_named_when_the_cache_is_made(bad):
    model = tiny_llama(seed=1)
    with pytest.raises(FormatError, match=r"GlydStaticCache memory_fraction must be (a number )?in \(0, 1\], got "):
        GlydStaticCache(model.config, memory_fraction=bad, batch_size=1, device="cuda", fused=False)


def test_a_good_exc_fraction_is_kept():
    model = tiny_llama(seed=1)
    cache = GlydStaticCache(model.config, max_cache_len=32, page_size=PAGE, fused=False, exc_fraction=1)
    with torch.no_grad():
        model(ids_of(1, 4), past_key_values=cache, use_cache=True)
    assert cache.pool.exc_fraction == 1 and cache.pool.k.arena == cache.pool.n_pages * cache.pool.heads * PAGE * 16
