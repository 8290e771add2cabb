"""glyd.hf.pack_plan: the model ``glyd pack`` builds from a source folder's config (a hostile input) to
decide what to pack. The command's own behaviour is tested in tests/apps/test_cli_store_loadable.py."""

from __future__ import annotations

import json

import pytest
import torch

from glyd.hf.pack_plan import _meta_model

pytest.importorskip("transformers")

MISTRAL = dict(model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=128, hidden_size=64,
               intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
SHAPES = [[128, 64]] * 21  # as many tensors as the tiny model stores


def _folder(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps({**MISTRAL, **config}))
    return tmp_path


def test_the_plans_model_holds_no_memory_whatever_sizes_the_config_claims(tmp_path):
    # was: init_empty_weights(include_buffers=False) made each parameter with torch.empty on the CPU
    # before moving it to meta, and computed the rotary tables for real: a head_dim of 2**33 asked the
    # allocator for 4 TiB (a size that fits in memory was allocated, and the tables filled)
    model = _meta_model(_folder(tmp_path, head_dim=2**33, vocab_size=2**40), SHAPES)
    assert model.model.embed_tokens.weight.shape == (2**40, 64)
    assert all(t.is_meta for t in [*model.parameters(), *model.buffers()])


@pytest.mark.parametrize("field", ["num_hidden_layers", "num_experts", "num_labels"])
def test_a_count_past_any_models_is_refused_before_building(tmp_path, field):
    # was: bounded only by the tensors stored (check_counts), which a header of empty tensors makes
    # cheap: 10^6 layers took over 2 minutes and 5 GB before it was stopped (about 1 ms and 17 kB a layer)
    from glyd.errors import FormatError
    from glyd.hf.pack_plan import MAX_MODULES

    n = MAX_MODULES + 1
    src = _folder(tmp_path, **{field: n}, **({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
                                             "num_experts_per_tok": 2} if field == "num_experts" else {}))
    with pytest.raises(FormatError, match=rf"config.json: {field} is {n}, more than the {MAX_MODULES} .* builds"):
        _meta_model(src, [[0, n]] * (n + 21))


def test_labels_named_in_id2label_are_built_however_many(tmp_path):
    # an image classifier of 21843 classes ships its id2label: its size is the file's, not a claim
    n = 5000
    labels = {str(i): f"class {i}" for i in range(n)}
    model = _meta_model(_folder(tmp_path, num_labels=n, id2label=labels), [[n, 64]] * 21)
    assert model.config.num_labels == n


@pytest.mark.parametrize("experts", [None, 4])
def test_a_top_k_past_the_experts_is_one_warning_and_the_plan_still_made(tmp_path, caplog, experts):
    # the loaders refuse a top-k past the class's default experts count (Mixtral's 8) where config.json
    # leaves the count out; glyd pack packed such a folder with no word that it would not load
    import logging

    config = dict(MISTRAL, model_type="mixtral", architectures=["MixtralForCausalLM"], num_experts_per_tok=9)
    if experts is not None:
        config["num_local_experts"] = experts
    with caplog.at_level(logging.WARNING, logger="glyd"):
        model = _meta_model(_folder(tmp_path, **config), SHAPES)
    said = [r.getMessage() for r in caplog.records if "num_experts_per_tok is 9" in r.getMessage()]
    assert len(said) == 1 and f"from 1 to {experts or 8} (num_local_experts)" in said[0], said
    assert "glyd.from_pretrained will refuse the packed folder" in said[0]
    assert model.config.num_local_experts == (experts or 8)
