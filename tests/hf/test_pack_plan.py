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
