"""``device_map`` and ``dtype`` when loading packed models: honoured, or refused on one line."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

import glyd
from glyd.errors import UnsupportedError
from glyd.hf.placement import check_placement, device_of, normalize_map

transformers = pytest.importorskip("transformers")
from accelerate import init_empty_weights  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from glyd.hf.packer import Packer  # noqa: E402
from tiny_models import tiny_config  # noqa: E402

CPU = torch.device("cpu")
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")


def _bits(model):
    return {n: t.view(torch.int16) if t.dtype == torch.bfloat16 else t for n, t in model.state_dict().items()}


def _same(a, b, ids):
    sa, sb = _bits(a), _bits(b)
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    with torch.no_grad():
        assert torch.equal(a(ids).logits.view(torch.int16), b(ids).logits.view(torch.int16))


def _per_module(config):
    n = config.num_hidden_layers
    return {"model.embed_tokens": "cpu", **{f"model.layers.{i}": "cpu" for i in range(n)}, "model.norm": "cpu",
            "model.rotary_emb": "cpu", "lm_head": "cpu"}


@pytest.fixture(scope="module")
def packed_folder(tiny_model_folder, tmp_path_factory):
    src = tiny_model_folder("qwen2")
    model = glyd.from_pretrained(src, merge=True, device="cpu", progress=False)
    return src, glyd.save_pretrained(model, tmp_path_factory.mktemp("dm") / "glyd", progress=False)


@pytest.mark.parametrize("kind", ["cpu", "dict", "device", "auto", "per-module"])
def test_device_map_on_a_bf16_folder_equals_device_cpu(tiny_model_folder, input_ids, kind):
    src = tiny_model_folder("qwen2")
    want = glyd.from_pretrained(src, exact=True, device="cpu", progress=False)
    dm = {"cpu": "cpu", "dict": {"": "cpu"}, "device": CPU, "auto": "auto",
          "per-module": _per_module(want.config)}[kind]
    model = glyd.from_pretrained(src, exact=True, device_map=dm, progress=False)
    assert {t.device for t in model.state_dict().values()} == {CPU}
    assert set(model.hf_device_map.values()) == {"cpu"}
    _same(model, want, input_ids)


@pytest.mark.parametrize("kind", ["cpu", "dict", "auto", "per-module"])
def test_device_map_on_a_packed_folder(packed_folder, input_ids, kind):
    src, out = packed_folder
    want = glyd.from_pretrained(out, exact=True, device="cpu", progress=False)
    cfg = json.loads((out / "config.json").read_text())
    dm = {"cpu": "cpu", "dict": {"": "cpu"}, "auto": "auto",
          "per-module": _per_module(transformers.Qwen2Config(**cfg))}[kind]
    model = glyd.from_pretrained(out, exact=True, device_map=dm, progress=False)
    native = AutoModelForCausalLM.from_pretrained(out, device_map=dm)
    glyd.nn.set_exact(native, True)
    _same(model, want, input_ids)
    _same(native, want, input_ids)


OFFLOAD = [({"": "disk"}, "the whole model on 'disk'"),
           ({"model.embed_tokens": "cuda:0", "model.layers": "cpu", "model.norm": 0, "model.rotary_emb": 0,
             "lm_head": 0}, "'model.layers' on the cpu and other modules on cuda:0")]


@pytest.mark.parametrize("dm,why", OFFLOAD)
def test_offloading_packed_layers_is_refused(tiny_model_folder, packed_folder, dm, why):
    src, out = packed_folder
    for load in (lambda: glyd.from_pretrained(src, device_map=dm, progress=False),
                 lambda: glyd.from_pretrained(out, device_map=dm, progress=False),
                 lambda: AutoModelForCausalLM.from_pretrained(out, device_map=dm)):
        with pytest.raises(UnsupportedError, match=f"^device_map puts {why}"):
            load()


def test_what_cannot_be_placed_is_refused(tiny_model_folder):
    src = tiny_model_folder("qwen2")
    cfg = transformers.AutoConfig.from_pretrained(src)
    partial = {k: v for k, v in _per_module(cfg).items() if k != "lm_head"}
    with pytest.raises(UnsupportedError, match=r"^device_map places no module for lm_head\.weight"):
        glyd.from_pretrained(src, device_map=partial, progress=False)
    with pytest.raises(UnsupportedError, match="pass one of them"):
        glyd.from_pretrained(src, device="cpu", device_map="cpu", progress=False)
    with pytest.raises(UnsupportedError, match="^offload_folder"):
        glyd.from_pretrained(src, device_map="cpu", offload_folder="/tmp/x", progress=False)
    with pytest.raises(UnsupportedError, match="^max_memory"):
        glyd.from_pretrained(src, device_map="cpu", max_memory={"cpu": "1GB"}, progress=False)
    with pytest.raises(UnsupportedError, match="is not a device"):
        glyd.from_pretrained(src, device_map={"": "no-such-device"}, progress=False)


@needs_no_gpu
def test_a_gpu_this_machine_lacks(tiny_model_folder, packed_folder):
    for path in packed_folder:
        with pytest.raises(UnsupportedError, match=r"^device_map\[''\] = 'cuda:0': this machine has no CUDA GPU"):
            glyd.from_pretrained(path, device_map="cuda:0", progress=False)


def test_device_of_takes_the_longest_prefix():
    m = normalize_map({"": "cpu", "model.layers.1": "cpu"})
    assert device_of(m, "model.layers.10.mlp.up_proj.weight") == CPU  # "" only: 1 is not a prefix of 10
    assert device_of({"model.layers.1": CPU}, "model.layers.10.x") is None
    assert device_of({"model.layers.1": CPU}, "model.layers.1.x") == CPU
    assert device_of({"model.layers.1": CPU, "model.layers.1.mlp": torch.device("meta")},
                     "model.layers.1.mlp.up_proj.weight") == torch.device("meta")
    check_placement({"a": "cuda:0", "b": "cuda:1"})  # several accelerators: no offloading
    with pytest.raises(UnsupportedError):
        check_placement({"a": "cuda:0", "b": "cpu"})


def test_tied_weights_split_over_devices_are_refused():
    # The packer places each tensor where the map says; a tied output projection uses the
    # embedding's arrays, so it cannot be somewhere else.
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(tiny_config("llama"), dtype=torch.bfloat16)
    where = {"lm_head.weight": torch.device("meta")}
    with pytest.raises(UnsupportedError, match="lm_head and model.embed_tokens on different devices"):
        Packer(model, layout="auto", merge=False, exact=False, device=lambda n: where.get(n, CPU))
    Packer(model, layout="auto", merge=False, exact=False, device=lambda n: CPU).close()


# -- dtype -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_dtype_other_than_bf16_is_refused_for_a_packed_folder(packed_folder, dtype):
    src, out = packed_folder
    for load in (lambda: AutoModelForCausalLM.from_pretrained(out, dtype=dtype),
                 lambda: glyd.from_pretrained(out, dtype=dtype, device="cpu", progress=False),
                 lambda: glyd.from_pretrained(src, dtype=dtype, device="cpu", progress=False)):
        with pytest.raises(UnsupportedError, match=f"dtype={dtype}"):
            load()
    assert AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_a_config_dtype_of_float32_loads_bf16_and_says_so(packed_folder, tmp_path, input_ids, caplog):
    src, out = packed_folder
    edited = tmp_path / "f32"
    shutil.copytree(out, edited)
    cfg = json.loads((edited / "config.json").read_text())
    cfg["dtype"] = "float32"  # dtype="auto" (transformers' default) reads it
    (edited / "config.json").write_text(json.dumps(cfg))
    with caplog.at_level(logging.WARNING, logger="glyd"):
        model = AutoModelForCausalLM.from_pretrained(edited)
    assert "config.json gives dtype float32; a glyd model loads in bfloat16" in caplog.text
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    _same(model, AutoModelForCausalLM.from_pretrained(out), input_ids)
