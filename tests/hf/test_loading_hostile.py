"""Hostile folders through glyd.from_pretrained and native transformers loading (the bf16 loader,
the packed folder's loaders): each is refused with one clear line naming the file, before a weight
is loaded."""

from __future__ import annotations

import json
import shutil

import pytest

import glyd
from glyd.errors import FormatError
from glyd.hf.classes import read_config

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

#: The message for a config.json of the store's MAX_JSON_FILE_BYTES and one byte (``_huge_config``).
TOO_LARGE = r"config\.json: 67,108,865 bytes, too large for a config\.json \(at most 67,108,864\)$"


def _huge_config(folder) -> None:
    """A config.json of 64 MiB + 1 bytes, sparse (no disk): read whole it would take that memory."""
    with open(folder / "config.json", "wb") as f:
        f.write(b"{}")
        f.truncate((64 << 20) + 1)


def test_a_huge_safetensors_index_is_not_read_whole(tiny_model_folder, tmp_path):
    # the bf16 loader read model.safetensors.index.json whole however large (a sparse 64 MiB + 1 file:
    # read into memory as text, then "not a safetensors index (JSON with a weight_map): Expecting value")
    src = tmp_path / "m"
    shutil.copytree(tiny_model_folder("llama"), src)
    with open(src / "model.safetensors.index.json", "wb") as f:
        f.truncate((64 << 20) + 1)  # the store's MAX_JSON_FILE_BYTES, and one byte
    with pytest.raises(FormatError, match=r"m/model\.safetensors\.index\.json: 67,108,865 bytes, too large for a "
                                          r"safetensors index \(at most 67,108,864\)$"):
        glyd.from_pretrained(src, device="cpu", progress=False)


def test_read_config_refuses_a_huge_config_unread(tmp_path):
    # read_config read config.json whole however large (a sparse 64 MiB + 1 file: read into memory,
    # then "not valid JSON (Extra data ...)")
    _huge_config(tmp_path)
    with pytest.raises(FormatError, match=rf"{tmp_path.name}/{TOO_LARGE}"):
        read_config(tmp_path)
    assert read_config(tmp_path / "none") == {}  # missing: still {}, the loaders say so


@pytest.mark.parametrize("kind", ["bf16", "glyd"])
def test_a_huge_config_is_refused_in_one_line(tiny_model_folder, tmp_path, kind):
    src = tiny_model_folder("llama")
    if kind == "glyd":
        src = glyd.save_pretrained(glyd.from_pretrained(src, device="cpu", progress=False), tmp_path / "g",
                                   progress=False)
    dst = tmp_path / "m"
    shutil.copytree(src, dst)
    _huge_config(dst)
    with pytest.raises(FormatError, match=rf"m/{TOO_LARGE}") as err:
        glyd.from_pretrained(dst, device="cpu", progress=False)
    assert len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("top_k", [0, 9])
@pytest.mark.parametrize("kind", ["bf16", "glyd", "native"])
def test_a_top_k_past_the_class_default_experts_count_is_refused(tiny_model_folder, tmp_path, top_k, kind):
    # Mixtral's class builds 8 experts a layer when num_local_experts is left out: a top-k of 0 loaded a
    # model whose MoE blocks add nothing, 9 loaded and failed at the first forward in torch.topk; glyd fit
    # refused both (tests/apps/test_fit_hostile.py), the loaders checked only the count config.json gives
    src = tiny_model_folder("mixtral", num_local_experts=8)
    if kind != "bf16":
        src = glyd.save_pretrained(glyd.from_pretrained(src, device="cpu", progress=False), tmp_path / "g",
                                   progress=False)
    dst = tmp_path / "m"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    del cfg["num_local_experts"]
    cfg["num_experts_per_tok"] = top_k
    (dst / "config.json").write_text(json.dumps(cfg))
    load = AutoModelForCausalLM.from_pretrained if kind == "native" else glyd.from_pretrained
    kw = {} if kind == "native" else {"device": "cpu", "progress": False}
    with pytest.raises(FormatError, match=rf"m/config\.json: num_experts_per_tok is {top_k}, not a number of experts "
                                          r"from 1 to 8 \(num_local_experts\)"):
        load(dst, **kw)
    cfg["num_experts_per_tok"] = 8  # every expert: a model
    (dst / "config.json").write_text(json.dumps(cfg))
    assert load(dst, **kw).config.num_local_experts == 8
