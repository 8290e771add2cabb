"""Tiny bf16 causal LMs built from configs with random weights (shared by tests/hf)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

TINY_FAMILIES = ("llama", "qwen2", "mistral", "gemma")
VOCAB = 320


def tiny_config(family: str, **overrides):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if family == "llama":
        cfg = transformers.LlamaConfig(**common, tie_word_embeddings=True)
    elif family == "qwen2":  # biases on q, k, v; untied lm_head
        cfg = transformers.Qwen2Config(**common, tie_word_embeddings=False)
    elif family == "mistral":
        cfg = transformers.MistralConfig(**common, tie_word_embeddings=False, sliding_window=None)
    elif family == "gemma":
        cfg = transformers.GemmaConfig(**common, head_dim=16, tie_word_embeddings=True)
    elif family == "mixtral":  # mixture of experts: fused 3-D experts, stored one matrix per expert
        cfg = transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)
    elif family == "gemma3":  # a scaled embedding module (embed_scale), sliding-window layers
        cfg = transformers.Gemma3TextConfig(**common, head_dim=16, sliding_window=8, tie_word_embeddings=True)
    else:
        raise ValueError(family)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def build_tiny_model(family: str, dst: Path, *, dtype=torch.bfloat16, seed: int = 0, **overrides) -> Path:
    """Save a random tiny ``family`` model in ``dtype`` to ``dst`` (a transformers folder)."""
    torch.manual_seed(seed)
    cfg = tiny_config(family, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # matrices, and experts [E, N, K]
                p.normal_(0.0, 0.02)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.02)
            else:  # norms: around 1 (Gemma stores weight - 1: around 0)
                p.copy_((0.1 if family.startswith("gemma") else 1.0) + 0.05 * torch.randn_like(p))
    model = model.to(dtype)
    model.save_pretrained(dst, safe_serialization=True)
    (dst / "tokenizer_config.json").write_text('{"model_max_length": 256}\n')
    return dst
