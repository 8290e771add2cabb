"""Shards named as diffusers names its weights (``diffusion_pytorch_model*.safetensors``):
written with ``CheckpointWriter(weights_name=...)``, read and unpacked under the same names, and a
folder that mixes the two names, or whose index has the other name, is refused."""

from __future__ import annotations

import json
import os

import pytest
import torch

import glyd
from glyd.errors import FormatError
from glyd.store import CheckpointReader, CheckpointWriter, sha256_tensor, unpack_folder

BASE = "diffusion_pytorch_model"


def _write(dst, *, shard_bytes: int = 2 * 1024**3, weights_name: str = BASE):
    torch.manual_seed(0)
    ws = {f"blocks.{i}.weight": (torch.randn(24, 40) * 0.02).to(torch.bfloat16) for i in range(3)}
    with CheckpointWriter(dst, layout="fixed12", max_shard_bytes=shard_bytes, weights_name=weights_name) as out:
        for name, w in ws.items():
            out.add_packed(name, glyd.pack(w), sha256_tensor(w))
        out.add_tensor("norm.weight", torch.ones(40, dtype=torch.bfloat16))
        out.set_config({"_class_name": "Demo", "_diffusers_version": "0.0"})
    return ws


def test_single_shard_is_diffusers_named(tmp_path):
    ws = _write(tmp_path / "c")
    assert sorted(os.listdir(tmp_path / "c")) == ["README.md", "config.json", f"{BASE}.safetensors", "glyd.json"]
    r = CheckpointReader(tmp_path / "c")
    assert r.weights_name == BASE
    for name, w in ws.items():
        assert torch.equal(glyd.unpack(r.get(name)).view(torch.int16), w.view(torch.int16))
    assert r.verify(progress=False)["packed"] == 3


def test_sharded_checkpoint_and_unpack_keep_the_names(tmp_path):
    ws = _write(tmp_path / "c", shard_bytes=1500)
    names = sorted(os.listdir(tmp_path / "c"))
    assert f"{BASE}.safetensors.index.json" in names and f"{BASE}-00001-of-00004.safetensors" in names
    assert not [n for n in names if n.startswith("model")]
    assert CheckpointReader(tmp_path / "c").weights_name == BASE
    unpack_folder(tmp_path / "c", tmp_path / "bf16", progress=False)
    out = sorted(os.listdir(tmp_path / "bf16"))
    assert f"{BASE}.safetensors.index.json" in out and f"{BASE}-00004-of-00004.safetensors" in out
    index = json.loads((tmp_path / "bf16" / f"{BASE}.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {*ws, "norm.weight"}


def test_default_name_is_transformers(tmp_path):
    _write(tmp_path / "c", weights_name="model")
    assert (tmp_path / "c" / "model.safetensors").is_file()
    assert CheckpointReader(tmp_path / "c").weights_name == "model"


def test_unknown_weights_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="weights_name must be one of model, diffusion_pytorch_model"):
        CheckpointWriter(tmp_path / "c", layout="fixed12", weights_name="pytorch_model")


def test_a_mix_of_names_is_refused(tmp_path):
    _write(tmp_path / "c", shard_bytes=1500)
    folder = tmp_path / "c"
    manifest = json.loads((folder / "glyd.json").read_text())
    first = f"{BASE}-00001-of-00004.safetensors"
    os.rename(folder / first, folder / "model-00001-of-00004.safetensors")
    for e in manifest["tensors"].values():
        if e["file"] == first:
            e["file"] = "model-00001-of-00004.safetensors"
    (folder / "glyd.json").write_text(json.dumps(manifest))
    with pytest.raises(FormatError, match="not one set of model.*safetensors or diffusion_pytorch_model"):
        CheckpointReader(folder)


def test_an_index_of_the_other_name_is_refused(tmp_path):
    _write(tmp_path / "c", shard_bytes=1500)
    folder = tmp_path / "c"
    os.rename(folder / f"{BASE}.safetensors.index.json", folder / "model.safetensors.index.json")
    with pytest.raises(Exception, match=f"{BASE}.safetensors.index.json: missing"):
        CheckpointReader(folder)
