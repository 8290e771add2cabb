"""``model.dequantize()`` on a packed model: the plain bf16 model, every weight bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import glyd
from glyd.errors import UnsupportedError

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402


def _bits(model):
    return {n: t.view(torch.int16) for n, t in model.state_dict().items()}


def _packed(how, src, tmp_path, merge):
    if how == "from_pretrained":
        return glyd.from_pretrained(src, merge=merge, device="cpu", progress=False)
    if how == "compress":
        return glyd.compress(AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16), merge=merge,
                             progress=False)
    folder = glyd.save_pretrained(glyd.from_pretrained(src, merge=merge, device="cpu", progress=False),
                                  tmp_path / "packed", progress=False)
    return AutoModelForCausalLM.from_pretrained(folder)


def _assert_plain_bf16(model, ref):
    assert not any("Glyd" in type(m).__name__ for m in model.modules())
    assert {type(m) for m in model.modules() if isinstance(m, torch.nn.Linear)} == {torch.nn.Linear}
    want, got = _bits(ref), _bits(model)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert getattr(model, "hf_quantizer", None) is None
    assert getattr(model.config, "quantization_config", None) is None


@pytest.mark.parametrize("how", ["from_pretrained", "compress", "native"])
@pytest.mark.parametrize("family,merge", [("qwen2", True), ("llama", False), ("gemma3", False)])
def test_dequantize_gives_back_the_bf16_model_bit_for_bit(tiny_model_folder, input_ids, tmp_path, how, family, merge):
    src = tiny_model_folder(family)
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model = _packed(how, src, tmp_path, merge)
    assert model.dequantize() is model
    _assert_plain_bf16(model, ref)
    assert not model.training
    if family in ("llama", "gemma3"):  # tied: one parameter again, as transformers ties it
        assert model.lm_head.weight is model.get_input_embeddings().weight
        assert model.all_tied_weights_keys == ref.all_tied_weights_keys
    if family == "gemma3":
        emb = model.get_input_embeddings()
        assert type(emb) is type(ref.get_input_embeddings()) and float(emb.embed_scale) == 8.0
    with torch.no_grad():
        assert torch.equal(model(input_ids).logits.view(torch.int16), ref(input_ids).logits.view(torch.int16))


def test_a_dequantized_model_saves_a_plain_bf16_folder(tiny_model_folder, tmp_path):
    src = tiny_model_folder("llama")
    orig = load_file(src / "model.safetensors")
    outs = []
    for how in ("from_pretrained", "native"):
        (tmp_path / how).mkdir()
        model = _packed(how, src, tmp_path / how, False)
        model.dequantize()
        out = tmp_path / how / "plain"
        model.save_pretrained(out)  # transformers' own save_pretrained again
        assert not (out / "glyd.json").exists(), how
        assert "quantization_config" not in json.loads((out / "config.json").read_text()), how
        saved = load_file(out / "model.safetensors")
        assert saved.keys() == orig.keys(), how
        assert all(torch.equal(saved[k].view(torch.int16), orig[k].view(torch.int16)) for k in orig), how
        outs.append(str(out))
    # transformers alone (glyd never imported) loads each saved folder: bf16, the source's logits bit for
    # bit (one child for both folders: starting one takes seconds)
    code = f"""
import sys, torch
from transformers import AutoModelForCausalLM
b = AutoModelForCausalLM.from_pretrained({str(src)!r}, dtype=torch.bfloat16)
ids = torch.arange(3, 15).view(1, -1)
for out in sys.argv[1:]:
    a = AutoModelForCausalLM.from_pretrained(out)
    assert 'glyd' not in sys.modules and not getattr(a, 'is_quantized', False)
    with torch.no_grad():
        print(a.dtype, torch.equal(a(ids).logits.view(torch.int16), b(ids).logits.view(torch.int16)))
"""
    r = subprocess.run([sys.executable, "-c", code, *outs], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-4:] == ["torch.bfloat16", "True"] * 2, r.stdout


def test_dequantize_to_float32_is_exact_and_float16_is_refused(tiny_model_folder, tmp_path):
    src = tiny_model_folder("qwen2")
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model = _packed("native", src, tmp_path, True)
    with pytest.raises(UnsupportedError, match=r"^dequantize\(dtype=torch\.float16\)"):
        model.dequantize(dtype=torch.float16)
    assert model.is_quantized and any("Glyd" in type(m).__name__ for m in model.modules())  # untouched
    model.dequantize(dtype=torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    want = ref.state_dict()
    for k, t in model.state_dict().items():
        assert torch.equal(t.to(torch.bfloat16).view(torch.int16), want[k].view(torch.int16)), k
        assert torch.equal(t, want[k].float()), k


def test_a_refused_dequantize_changes_nothing(tiny_model_folder):
    # A tied head whose embedding is outside the module given was refused only after every other
    # packed module had been replaced: the error left the (shared) layers dequantized.
    model = glyd.from_pretrained(tiny_model_folder("llama"), device="cpu", progress=False)
    part = torch.nn.ModuleDict({"layer": model.model.layers[0], "head": model.lm_head})
    from glyd.hf.dequantize import dequantize

    with pytest.raises(UnsupportedError, match="head is tied to an embedding that is not part of the model"):
        dequantize(part)
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "GlydLinear"
