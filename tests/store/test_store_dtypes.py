"""glyd pack never changes a dtype: a model with nothing to pack (fp32, fp16, no 2-D bf16) is refused."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from store_helpers import MINILM_FILES, minilm_dir

from glyd.cli import main
from glyd.errors import FormatError
from glyd.store import pack_folder


@pytest.mark.parametrize("dtype, name", [(torch.float32, "float32"), (torch.float16, "float16")])
def test_pack_refuses_a_model_that_is_not_bf16(tmp_path, capsys, dtype, name):
    src = tmp_path / "model"
    src.mkdir()
    for rel in MINILM_FILES:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(minilm_dir() / rel, src / rel)
    sd = load_file(minilm_dir() / "model.safetensors")  # all-MiniLM-L6-v2 as published: fp32
    save_file({k: v.to(dtype) for k, v in sd.items()}, src / "model.safetensors", metadata={"format": "pt"})
    config = (src / "config.json").read_text()

    rc = main(["-q", "pack", str(src), str(tmp_path / "packed")])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1
    assert f"no bf16 2-D matrices to pack: {len(sd)} {name} tensors" in err and str(src) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing written, no temporary
    assert (src / "config.json").read_text() == config
    assert "quantization_config" not in json.loads(config)


def test_pack_refuses_a_model_without_2d_bf16(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    save_file({"norm": torch.ones(8, dtype=torch.bfloat16), "ids": torch.arange(3), "w": torch.ones(2, 2)},
              str(src / "model.safetensors"))
    with pytest.raises(FormatError, match=r"no bf16 2-D matrices to pack: 1 bfloat16, 1 float32, 1 int64 tensors "
                                          r"\(the bfloat16 ones are not 2-D\)"):
        pack_folder(src, tmp_path / "out", progress=False)
    save_file({}, str(src / "model.safetensors"))
    with pytest.raises(FormatError, match="no bf16 2-D matrices to pack: no tensors"):
        pack_folder(src, tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_pack_keeps_the_2d_bf16_tensors_it_is_asked_to_keep(tmp_path):
    # glyd pack passes those its model's loader would not run packed (a router, final_logits_bias)
    src = tmp_path / "src"
    src.mkdir()
    w, bias = torch.randn(4, 8).to(torch.bfloat16), torch.randn(1, 8).to(torch.bfloat16)
    save_file({"w": w, "final_logits_bias": bias, "norm": torch.ones(8, dtype=torch.bfloat16)},
              str(src / "model.safetensors"))
    s = pack_folder(src, tmp_path / "out", progress=False, keep={"final_logits_bias"})
    assert (s.packed, s.kept_asked, s.kept_names) == (1, 1, ["final_logits_bias", "norm"])
    assert "2 bfloat16 (1 not 2-D, 1 not run packed by the model)" in str(s)
    raw = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert torch.equal(raw["final_logits_bias"].view(torch.int16), bias.view(torch.int16))
    with pytest.raises(FormatError, match=r"no bf16 2-D matrices to pack: 3 bfloat16 tensors \(the bfloat16 ones "
                                          r"are not 2-D or not run packed by the model\)"):
        pack_folder(src, tmp_path / "out2", progress=False, keep={"w", "final_logits_bias"})
    assert not (tmp_path / "out2").exists()
