"""transformers' own ``model.save_pretrained`` on a packed model writes a glyd folder (glyd.hf.hooks).

It once wrote the packed buffers with no glyd.json and no quantization_config: a folder that
``AutoModelForCausalLM.from_pretrained`` loaded as a model with random weights."""

from __future__ import annotations

import json

import pytest
import torch

import glyd
from glyd.errors import DestinationExistsError
from glyd.store import MANIFEST, CheckpointReader

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from glyd.hf.quantizer import GlydConfig  # noqa: E402


def _bits(model):
    return {n: t.view(torch.int16) if t.dtype == torch.bfloat16 else t for n, t in model.state_dict().items()}


def _same_model(a, b):
    sa, sb = _bits(a), _bits(b)
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def _packed(how, src, tmp_path):
    if how == "from_pretrained":
        return glyd.from_pretrained(src, device="cpu", progress=False)
    if how == "compress":
        return glyd.compress(AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16), progress=False)
    folder = glyd.save_pretrained(glyd.from_pretrained(src, device="cpu", progress=False), tmp_path / "first",
                                  progress=False)
    return AutoModelForCausalLM.from_pretrained(folder)


@pytest.mark.parametrize("how", ["from_pretrained", "compress", "native"])
def test_hf_save_pretrained_writes_a_folder_that_loads_the_same_model(tiny_model_folder, input_ids, tmp_path, how):
    src = tiny_model_folder("qwen2")
    model = _packed(how, src, tmp_path)
    model.save_pretrained(tmp_path / "x")
    out = tmp_path / "x"
    assert (out / MANIFEST).is_file()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "glyd"
    assert glyd.verify(out, progress=False)["packed"] > 0
    again = AutoModelForCausalLM.from_pretrained(out)
    _same_model(model, again)
    again = AutoModelForCausalLM.from_pretrained(out, quantization_config=GlydConfig(exact=True))
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(again(input_ids).logits.view(torch.int16), ref(input_ids).logits.view(torch.int16))


def test_hf_save_pretrained_replaces_only_a_glyd_folder(tiny_model_folder, tmp_path):
    model = glyd.from_pretrained(tiny_model_folder("llama"), device="cpu", progress=False)
    model.save_pretrained(tmp_path / "x")
    model.save_pretrained(tmp_path / "x")  # a glyd folder: replaced, as transformers' call would
    assert len(CheckpointReader(tmp_path / "x")) > 0
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(DestinationExistsError):
        model.save_pretrained(other)
    assert (other / "notes.txt").read_text() == "keep me" and sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def test_hf_save_pretrained_refuses_what_it_cannot_honour(tiny_model_folder, tmp_path):
    model = glyd.from_pretrained(tiny_model_folder("llama"), device="cpu", progress=False)
    with pytest.raises(ValueError, match="state_dict"):
        model.save_pretrained(tmp_path / "a", state_dict=model.state_dict())
    with pytest.raises(NotImplementedError, match="push_to_hub"):
        model.save_pretrained(tmp_path / "b", push_to_hub=True)
    with pytest.raises(TypeError, match="safe_serialization"):
        model.save_pretrained(tmp_path / "c", safe_serialization=False)
    assert not any(tmp_path.iterdir())
    model.save_pretrained(tmp_path / "d", max_shard_size="20KB", safe_serialization=True)
    assert len({e["file"] for e in CheckpointReader(tmp_path / "d").manifest["tensors"].values()}) > 1
