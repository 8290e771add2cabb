"""A tiny chat model for the server tests: random bf16 weights and a one-character-a-token tokenizer.

Every token but the special ones decodes to one character of its own, so a decoded answer gives
its tokens back exactly (text equal <=> tokens equal). The chat template is ChatML's. The model is a
Mistral (no response parser in transformers' serving code: the text streams as decoded) whose
greedy answers vary from token to token.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIAL = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<unk>"]
VOCAB = 320
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def characters() -> list[str]:
    """The vocabulary after the special tokens: space, newline, printable ASCII, then Latin letters."""
    chars = [" ", "\n"] + [chr(c) for c in range(33, 127)]
    return chars + [chr(0xC0 + i) for i in range(VOCAB - len(SPECIAL) - len(chars))]


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL + characters())}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>", additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = TEMPLATE
    return tok


def build_chat_model(dst: Path, *, seed: int = 0, **overrides) -> Path:
    """Save the tiny chat model (bf16 safetensors, tokenizer, generation config) to ``dst``."""
    from transformers import AutoModelForCausalLM, GenerationConfig, MistralConfig

    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
               tie_word_embeddings=False, sliding_window=None)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(MistralConfig(**cfg), dtype=torch.float32)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
            else:
                p.copy_(1.0 + 0.05 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(dst, safe_serialization=True)
    build_tokenizer().save_pretrained(dst)
    return dst
