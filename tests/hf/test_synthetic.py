"""Random-weight models made a tensor at a time (``glyd.hf.synthetic``): packed bit for bit."""

from __future__ import annotations

import pytest
import torch

import glyd
from glyd import ops
from glyd.hf.synthetic import build_order, random_model, random_tensor
from glyd.nn.modules import GlydEmbedding, GlydLinear, GlydTiedLinear


def _config(tied: bool):
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=160, tie_word_embeddings=tied)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _parts(model, name: str, m: GlydLinear) -> list[str]:
    """The weight names a packed module holds (a merged one: its parts, in order)."""
    if not m.splits:
        return [f"{name}.weight"]
    parent = name.rpartition(".")[0]
    parts = ("q_proj", "k_proj", "v_proj") if name.endswith("qkv_proj") else ("gate_proj", "up_proj")
    return [f"{parent}.{p}.weight" for p in parts]


@pytest.mark.parametrize("layout,merge,tied", [("fixed12", True, True), ("tiered", True, False),
                                               ("fixed12", False, False)])
def test_packed_weights_are_the_seeded_bf16_bit_for_bit(layout, merge, tied):
    cfg = _config(tied)
    model = random_model(cfg, layout=layout, device="cpu", merge=merge, seed=3, progress=False)
    bf16 = random_model(cfg, layout=None, device="cpu", seed=3, progress=False)
    ref = dict(bf16.named_parameters())
    checked = 0
    for name, m in model.named_modules():
        if not isinstance(m, (GlydLinear, GlydEmbedding)) or isinstance(m, GlydTiedLinear):
            continue
        names = _parts(model, name, m) if isinstance(m, GlydLinear) else [f"{name}.weight"]
        want = torch.cat([random_tensor(n, tuple(ref[n].shape), device="cpu", std=0.02, seed=3) for n in names])
        assert torch.equal(_bits(ops.unpack(m.packed)), _bits(want)), name
        assert torch.equal(_bits(torch.cat([ref[n] for n in names])), _bits(want)), name
        assert m.packed.layout == layout and m.sha256 is None  # not hashed: made for timing
        checked += len(names)
    assert checked == 7 * 2 + 1 + (not tied)  # every matrix of both layers, the embedding, an untied head
    for name, p in model.named_parameters():  # norms and biases as made for the bf16 model
        parent, _, attr = name.rpartition(".")
        m = model.get_submodule(parent)
        names = [n.replace(".weight", ".bias") for n in _parts(model, parent, m)] if getattr(m, "splits", None) else [name]
        assert torch.equal(_bits(p), _bits(torch.cat([ref[n] for n in names]))), name
    assert (bf16.lm_head.weight is bf16.model.embed_tokens.weight) == tied
    assert isinstance(model.lm_head, GlydTiedLinear) == tied


def test_values_depend_on_seed_and_name():
    a = random_tensor("x.weight", (8, 16), device="cpu", seed=0)
    assert a.dtype == torch.bfloat16 and 0.01 < float(a.float().std()) < 0.03
    assert not torch.equal(a, random_tensor("x.weight", (8, 16), device="cpu", seed=1))
    assert not torch.equal(a, random_tensor("y.weight", (8, 16), device="cpu", seed=0))
    assert torch.equal(random_tensor("n.weight", (4,), device="cpu"), torch.ones(4, dtype=torch.bfloat16))
    assert torch.equal(random_tensor("n.bias", (4,), device="cpu"), torch.zeros(4, dtype=torch.bfloat16))


def test_a_tiny_share_gives_real_weights_exceptions_and_packs_bit_for_bit():
    # tiny_share: that share of each matrix's values 1e-30 (outside fixed12's window), the rest as without it
    plain = random_tensor("x.weight", (64, 512), device="cpu", seed=2)
    a = random_tensor("x.weight", (64, 512), device="cpu", seed=2, tiny_share=0.01)
    assert torch.equal(_bits(a), _bits(random_tensor("x.weight", (64, 512), device="cpu", seed=2, tiny_share=0.01)))
    changed = _bits(a) != _bits(plain)
    assert 0.008 * a.numel() <= int(changed.sum()) <= 0.01 * a.numel() and (a[changed] == 1e-30).all()
    assert glyd.pack(a, "fixed12").arrays["exc_idx"].numel() >= int(changed.sum())
    norm = random_tensor("n.weight", (4,), device="cpu", tiny_share=0.01)
    assert torch.equal(norm, torch.ones(4, dtype=torch.bfloat16))
    model = random_model(_config(False), layout="fixed12", device="cpu", seed=3, progress=False, tiny_share=0.01)
    m = model.model.layers[0].mlp.down_proj
    want = random_tensor("model.layers.0.mlp.down_proj.weight", (64, 96), device="cpu", std=0.02, seed=3,
                         tiny_share=0.01)
    assert torch.equal(_bits(ops.unpack(m.packed)), _bits(want)) and m.packed.arrays["exc_idx"].numel() > 0
    for bad in (-0.1, 0.6):
        with pytest.raises(ValueError, match="tiny_share"):
            random_tensor("x.weight", (4, 4), device="cpu", tiny_share=bad)
        with pytest.raises(ValueError, match="tiny_share"):
            random_model(_config(False), device="cpu", progress=False, tiny_share=bad)


def test_largest_tensors_made_first_then_model_order():
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(_config(False))
    names = [n for n, _ in build_order(model)]
    assert names[:2] == ["model.embed_tokens.weight", "lm_head.weight"]
    rest = [n for n, _ in model.named_parameters() if n not in names[:2]]
    assert names[2:] == rest


def test_packed_bytes_past_a_memory_limit_are_warned(caplog, monkeypatch):
    # as the loaders warn (glyd.hf.memory.check_packed), for a plan under what is packed: dense11
    # planned without its per-row tables (as before Layout.row_bytes: its escape offsets on 64-column
    # rows pass its planning bits)
    import dataclasses
    import logging

    from glyd.hf.memory import WeightsCount
    from glyd.hf.synthetic import _meta_model

    monkeypatch.setitem(glyd.LAYOUTS, "dense11", dataclasses.replace(glyd.LAYOUTS["dense11"], row_bytes=None))
    limit = WeightsCount.of(_meta_model(_config(False), None)).need("dense11")
    with caplog.at_level(logging.WARNING, logger="glyd.hf.memory"):
        random_model(_config(False), layout="dense11", device="cpu", progress=False, memory_limit=limit)
    assert any("memory_limit allows" in r.getMessage() for r in caplog.records if r.name == "glyd.hf.memory")


def test_a_bad_memory_limit_is_refused_for_a_bf16_model_too():
    from glyd.errors import GlydError

    with pytest.raises(GlydError, match="memory_limit='lots'"):  # it was not read: a typo passed silently
        random_model(_config(False), layout=None, device="cpu", progress=False, memory_limit="lots")
