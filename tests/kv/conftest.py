"""Shared helpers for the KV cache tests."""

from __future__ import annotations

import pytest
import torch
from kv_reference import bf16_pool_attention, use_reference  # noqa: F401 (shared with tests/hf)


@pytest.fixture(autouse=True)
def _one_thread():
    # These tests run many small tensor ops; on the 2-core CI machine torch's thread pool makes
    # them ~10x slower than one thread. Restored after each test.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def all_bf16_patterns() -> torch.Tensor:
    """Every one of the 65,536 bf16 bit patterns (+-0, subnormals, +-inf, every NaN payload)."""
    u = torch.arange(65536, dtype=torch.int32)
    return torch.where(u >= 32768, u - 65536, u).to(torch.int16).view(torch.bfloat16)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))


def tiny_llama(seed: int = 0, layers: int = 2, heads: int = 4, kv_heads: int = 2, head_dim: int = 16):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=320, hidden_size=heads * head_dim, intermediate_size=96, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.05)
    return model.to(torch.bfloat16).eval()

