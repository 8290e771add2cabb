"""The configs ``glyd fit`` and ``glyd eval --random`` know by name, so they work offline.

Each is the model's public ``config.json`` reduced to the fields that decide its shapes (and a
few whose class default differs from the real model, such as Mistral-7B-v0.3's
``sliding_window``). They go through the same path as a
config.json: ``AutoConfig.for_model`` then ``AutoModelForCausalLM.from_config`` on the meta
device. The published parameter counts are in ``tests/apps/test_fit.py``.
"""

from __future__ import annotations

from typing import Any

KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    # HuggingFaceTB/SmolLM2-135M
    "smollm2-135m": dict(
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
        tie_word_embeddings=True, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
    ),
    # Qwen/Qwen2.5-0.5B-Instruct
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        use_sliding_window=False,
    ),
    # Qwen/Qwen2.5-7B-Instruct
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        use_sliding_window=False,
    ),
    # Qwen/Qwen2.5-14B-Instruct
    "qwen2.5-14b": dict(
        model_type="qwen2", hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
        num_attention_heads=40, num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        use_sliding_window=False,
    ),
    # Qwen/Qwen2.5-32B-Instruct
    "qwen2.5-32b": dict(
        model_type="qwen2", hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
        num_attention_heads=40, num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        use_sliding_window=False,
    ),
    # meta-llama/Llama-3.2-1B
    "llama-3.2-1b": dict(
        model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
        tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
    ),
    # meta-llama/Llama-3.1-8B
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
        tie_word_embeddings=False, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
    ),
    # meta-llama/Llama-3.1-70B (its rope_scaling changes no shape and is left out)
    "llama-3.1-70b": dict(
        model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, head_dim=128, vocab_size=128256,
        tie_word_embeddings=False, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
    ),
    # mistralai/Mistral-7B-Instruct-v0.3 (v0.3: vocabulary 32768, no sliding window)
    "mistral-7b": dict(
        model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=32768,
        tie_word_embeddings=False, max_position_embeddings=32768, rms_norm_eps=1e-5,
        rope_theta=1000000.0, sliding_window=None,
    ),
    # mistralai/Mixtral-8x7B-v0.1: 8 experts a layer, 2 active a token
    "mixtral-8x7b": dict(
        model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, num_local_experts=8,
        num_experts_per_tok=2, tie_word_embeddings=False, max_position_embeddings=32768,
        rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None,
    ),
    # google/gemma-2-9b: its config.json names no tie_word_embeddings, so the class default
    # (tied) holds; every other layer attends to a 4096-token window.
    "gemma-2-9b": dict(
        model_type="gemma2", hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, vocab_size=256000,
        max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=4096,
        query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh",
    ),
    # Qwen/Qwen3-30B-A3B: 128 experts a layer of width 768, 8 active a token
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        vocab_size=151936, num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1,
        mlp_only_layers=[], norm_topk_prob=True, tie_word_embeddings=False,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
        use_sliding_window=False, sliding_window=None, max_window_layers=48,
    ),
}
