"""transformers' own ``model.save_pretrained`` on a packed model writes a glyd folder (glyd.hf.hooks),
and so does its ``model.push_to_hub(repo)``, which saves through it (the hub calls mocked here).

It once wrote the packed buffers with no glyd.json and no quantization_config: a folder that
``AutoModelForCausalLM.from_pretrained`` loaded as a model with random weights."""

from __future__ import annotations

import json
import shutil

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


def _capture_uploads(monkeypatch, into):
    """Mock the hub calls of transformers' ``push_to_hub`` (``HfApi.create_repo``, ``ModelCard.load``,
    ``HfApi.create_commit``): the files it would commit are copied to ``into``. Returns the calls."""
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError

    calls = []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id))
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id, operations, **kwargs):
        calls.append(("create_commit", repo_id))
        for op in operations:  # copied now: push_to_hub removes its temporary folder when it returns
            dst = into / op.path_in_repo
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(op.path_or_fileobj, dst)
        return f"https://huggingface.co/{repo_id}/commit/0"

    def no_card(cls, *args, **kwargs):
        raise EntryNotFoundError("no model card in the repo yet")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_commit", create_commit)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", None)  # not the path taken: fail loudly if it is
    monkeypatch.setattr(huggingface_hub.ModelCard, "load", classmethod(no_card))
    return calls


@pytest.mark.parametrize("how", ["from_pretrained", "compress", "native"])
def test_push_to_hub_uploads_a_glyd_folder_that_reloads_bit_for_bit(tiny_model_folder, tmp_path, monkeypatch, how):
    src = tiny_model_folder("qwen2")
    up = tmp_path / "uploaded"
    calls = _capture_uploads(monkeypatch, up)
    model = _packed(how, src, tmp_path)
    model.push_to_hub("someone/tiny-glyd")
    assert calls == [("create_repo", "someone/tiny-glyd"), ("create_commit", "someone/tiny-glyd")]
    assert (up / MANIFEST).is_file()
    cfg = json.loads((up / "config.json").read_text())
    assert cfg["model_type"] == "glyd" and cfg["quantization_config"]["quant_method"] == "glyd"
    assert glyd.verify(up, progress=False)["packed"] > 0
    again = glyd.from_pretrained(up, device="cpu", progress=False)
    _same_model(model, again)
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    _same_model(again.dequantize(), ref)  # every weight is the bf16 source's, bit for bit
