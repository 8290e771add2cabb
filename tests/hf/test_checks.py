"""A packed folder that does not describe one complete model never loads (glyd.hf.checks).

Before these checks, ``glyd.from_pretrained(P, verify=True)`` returned a model with random weights
when config.json had lost its quantization_config, or when a tensor had been removed from both the
manifest and the shard: it verified 0 tensors and ignored the config's hash in glyd.json."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import glyd
from glyd.errors import CorruptError, FormatError
from glyd.store import MANIFEST
from glyd.store.checkpoint import SHARD_METADATA, dump_manifest, key_for

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402


@pytest.fixture(scope="module")
def packed_folder(tiny_model_folder, tmp_path_factory):
    model = glyd.from_pretrained(tiny_model_folder("qwen2"), device="cpu", progress=False)
    return glyd.save_pretrained(model, tmp_path_factory.mktemp("checks") / "glyd", progress=False)


@pytest.fixture
def folder(packed_folder, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(packed_folder, dst)
    return dst


def _manifest(folder):
    return json.loads((folder / MANIFEST).read_text())


def _rewrite(folder, manifest, tensors):
    """Write the single shard and glyd.json back (the hashes stay those of the tensors kept)."""
    save_file(tensors, str(folder / "model.safetensors"), metadata=SHARD_METADATA)
    (folder / MANIFEST).write_text(dump_manifest(manifest))


def _loads(folder, verify):
    return glyd.from_pretrained(folder, device="cpu", verify=verify, progress=False)


@pytest.mark.parametrize("verify", [False, True])
def test_config_without_quantization_config_is_refused(folder, verify):
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["quantization_config"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match="quantization_config"):
        _loads(folder, verify)


def test_edited_config_warns_and_verify_refuses(folder, caplog):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["max_position_embeddings"] = 512  # a legitimate edit: the model is unchanged
    (folder / "config.json").write_text(json.dumps(cfg))
    with caplog.at_level(logging.WARNING, logger="glyd"):
        _loads(folder, verify=False)
    assert any("sha256 mismatch" in r.getMessage() for r in caplog.records)
    with pytest.raises(CorruptError, match="config.json"):
        _loads(folder, verify=True)


@pytest.mark.parametrize("which", ["packed", "raw"])
@pytest.mark.parametrize("verify", [False, True])
def test_tensor_removed_from_manifest_and_shard_is_refused(folder, which, verify):
    m = _manifest(folder)
    name = "model.layers.1.mlp.down_proj.weight" if which == "packed" else "model.layers.1.input_layernorm.weight"
    e = m["tensors"].pop(name)
    keys = [key_for(name, a) for a in e["arrays"]] if which == "packed" else [name]
    tensors = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if k not in keys}
    _rewrite(folder, m, tensors)
    with pytest.raises(FormatError, match="lacks tensor"):
        _loads(folder, verify)
    with pytest.raises(FormatError, match="lacks tensor"):  # native loading too
        AutoModelForCausalLM.from_pretrained(folder)


def test_tensor_with_no_place_in_the_model_is_refused(folder):
    m = _manifest(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    extra = torch.ones(3)
    tensors["model.layers.9.extra"] = extra
    m["tensors"]["model.layers.9.extra"] = {"kind": "raw", "dtype": "float32", "shape": [3],
                                            "sha256": glyd.store.sha256_tensor(extra), "file": "model.safetensors"}
    _rewrite(folder, m, tensors)
    with pytest.raises(FormatError, match="no place in the model"):
        _loads(folder, verify=False)


def test_raw_tensor_stored_in_another_dtype_is_refused(folder):
    # a float32 norm would come back bf16: glyd never changes a dtype without saying so
    m = _manifest(folder)
    name = "model.norm.weight"
    tensors = load_file(str(folder / "model.safetensors"))
    tensors[name] = tensors[name].float()
    m["tensors"][name].update(dtype="float32", sha256=glyd.store.sha256_tensor(tensors[name]))
    _rewrite(folder, m, tensors)
    with pytest.raises(FormatError, match="float32"):
        _loads(folder, verify=False)


def test_weights_swapped_in_the_shard_header_are_refused(folder):
    # Two arrays of one size with their byte ranges swapped: a valid safetensors file whose dtypes
    # and shapes all match glyd.json. verify=False and native loading returned the model with
    # gate_proj and up_proj exchanged; only the hashes (verify=True) saw it.
    import struct

    shard = folder / "model.safetensors"
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    a, b = (key_for(f"model.layers.0.mlp.{p}.weight", "lo") for p in ("gate_proj", "up_proj"))
    header[a]["data_offsets"], header[b]["data_offsets"] = header[b]["data_offsets"], header[a]["data_offsets"]
    raw = json.dumps(header).encode()
    shard.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])
    for verify in (False, True):
        with pytest.raises(FormatError, match=r"model\.safetensors: tensor '.*_proj\.weight_glyd_lo': data_offsets .* not where"):
            _loads(folder, verify)
    with pytest.raises(FormatError, match="not where a glyd shard holds it"):
        AutoModelForCausalLM.from_pretrained(folder)


@pytest.mark.parametrize("field, value", [("format_version", 2), ("format_version", "1"), ("layout", ["fixed12"]),
                                          ("merged", {"qkv_proj": "q_proj"})])
def test_unreadable_quantization_config_is_one_line(folder, field, value):
    # glyd.from_pretrained names the file (its messages named only the field, or were a TypeError);
    # natively transformers builds glyd's config before glyd knows the folder: the field is named.
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"][field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match=rf"/config\.json: quantization_config\.{field}"):
        _loads(folder, verify=False)
    with pytest.raises(FormatError, match=rf"quantization_config\.{field}"):
        AutoModelForCausalLM.from_pretrained(folder)


@pytest.mark.parametrize("field, value", [("model_type", "no-such-model"), ("hidden_act", "no-such-act"),
                                          ("rope_scaling", {"rope_type": "no-such-rope"}), ("vocab_size", -1)])
def test_edited_config_transformers_cannot_use_is_one_line(folder, field, value):
    # Before, transformers' own ValueError, KeyError or RuntimeError came out of glyd.from_pretrained.
    cfg = json.loads((folder / "config.json").read_text())
    cfg[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match=r"/config\.json: differs from the config\.json recorded in glyd\.json and "
                                          r"transformers cannot load the model from it \(\w+: ") as got:
        _loads(folder, verify=False)
    assert "\n" not in str(got.value)


@pytest.mark.parametrize("edit", [lambda wm: wm.update(dict.fromkeys(list(wm)[:1], "")),
                                  lambda wm: wm.update(dict.fromkeys(list(wm)[:1], "../model.safetensors")),
                                  lambda wm: wm.clear()], ids=["empty-name", "parent", "no-entries"])
def test_native_loading_checks_the_folder_asked_for(packed_folder, tmp_path, edit):
    # Natively, glyd took the folder to check from the first shard transformers resolved through
    # the index: '' or '../x' made it the parent folder ("not a glyd packed checkpoint"), and an
    # empty weight_map gave no folder at all. It is the folder asked for, and its index is wrong.
    model = glyd.from_pretrained(packed_folder, device="cpu", progress=False)
    sharded = glyd.save_pretrained(model, tmp_path / "sharded", max_shard_bytes=60_000, progress=False)
    index = sharded / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    edit(doc["weight_map"])
    index.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=r"sharded/model\.safetensors\.index\.json: (maps|has no entry)"):
        AutoModelForCausalLM.from_pretrained(sharded)


def test_layout_of_config_and_manifest_must_agree(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"]["layout"] = "tiered" if cfg["quantization_config"]["layout"] != "tiered" else "fixed12"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match="layout"):
        _loads(folder, verify=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_device_without_cuda_is_a_clear_error(packed_folder):
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        glyd.from_pretrained(packed_folder, device="cuda", progress=False)


def test_verify_of_an_unpacked_model_is_an_error(tiny_model_folder):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_folder("llama"), dtype=torch.bfloat16)
    with pytest.raises(FormatError, match="no glyd-packed weights"):
        glyd.verify(model, progress=False)


COUNTS = [("num_hidden_layers", 10**30), ("num_hidden_layers", 10**5), ("num_hidden_layers", -1),
          ("num_labels", 10**6), ("num_local_experts", 10**9)]


@pytest.mark.parametrize("field, value", COUNTS)
@pytest.mark.parametrize("loader", ["glyd", "native"])
def test_counts_past_what_the_checkpoint_holds_are_refused_before_building(folder, module_budget, loader, field, value):
    cfg = json.loads((folder / "config.json").read_text())
    cfg[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    n = len(_manifest(folder)["tensors"])
    module_budget.clear()
    most = n if field.endswith("layers") else 320  # the tiny model's vocabulary: its widest tensor
    with pytest.raises(FormatError, match=rf"/config\.json: {field} is -?\d+, not a count from 0 to {most} \(the "
                                          rf"checkpoint holds"):
        _loads(folder, verify=False) if loader == "glyd" else AutoModelForCausalLM.from_pretrained(folder)
    assert module_budget == []  # refused before transformers built anything


def test_counts_are_checked_at_any_depth_and_bound_by_the_weights():
    from glyd.hf.checks import check_counts

    shapes = [[320, 64], [64], [96, 64]]
    check_counts({"num_hidden_layers": 3, "text_config": {"num_hidden_layers": 2, "num_experts": 96},
                  "num_labels": 320, "max_position_embeddings": 10**9}, shapes, "c")
    check_counts({"num_labels": 1000, "id2label": {str(i): str(i) for i in range(1000)}}, shapes, "c")
    for bad, path in [({"num_hidden_layers": 4}, "num_hidden_layers"),
                      ({"text_config": {"n_layer": 2**64}}, "text_config.n_layer"),
                      ({"sub": [{"num_experts": 321}]}, r"sub\.0\.num_experts"), ({"num_labels": 321}, "num_labels")]:
        with pytest.raises(FormatError, match=rf"^c: {path} is \d+, not a count"):
            check_counts(bad, shapes, "c")



def test_experts_a_token_is_routed_to_are_one_to_the_experts():
    # num_experts_per_tok 0 built MoE blocks that add nothing (a wrong model, no error); -1 or more
    # than the experts failed at the first forward in torch.topk ("selected index k out of range")
    from glyd.hf.checks import check_counts

    shapes = [[320, 64], [8, 96, 64]]
    check_counts({"num_experts": 8, "num_experts_per_tok": 8, "text_config": {"num_local_experts": 4,
                                                                             "num_experts_per_tok": 1}}, shapes, "c")
    check_counts({"num_experts": 0, "num_experts_per_tok": 2}, shapes, "c")  # no experts: nothing is routed
    for bad, path, value, most, field in [
        ({"num_experts": 8, "num_experts_per_tok": 0}, "num_experts_per_tok", 0, 8, "num_experts"),
        ({"num_local_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok", 5, 4, "num_local_experts"),
        ({"text_config": {"n_routed_experts": 8, "num_experts_per_tok": -1}},
         r"text_config\.num_experts_per_tok", -1, 8, r"text_config\.n_routed_experts"),
    ]:  # the message names both fields: the top-k and the experts count
        with pytest.raises(FormatError, match=rf"^c: {path} is {value}, not a number of experts from 1 to {most} "
                                              rf"\({field}\)"):
            check_counts(bad, shapes, "c")

@pytest.mark.parametrize("own", [None, 5, ["llama"], ""])
def test_a_source_config_without_a_model_type_is_a_clear_error(tiny_model_folder, tmp_path, own):
    # glyd pack keeps such a config (it gives it back byte for byte); loading it raised
    # transformers' ValueError of several lines (AutoModelForCausalLM cannot pick a model).
    from glyd.store import pack_folder

    src = tmp_path / "src"
    shutil.copytree(tiny_model_folder("llama"), src)
    cfg = json.loads((src / "config.json").read_text())
    if own is None:
        del cfg["model_type"]
    else:
        cfg["model_type"] = own
    (src / "config.json").write_text(json.dumps(cfg))
    pack_folder(src, tmp_path / "packed", progress=False)
    what = "has no model_type" if own is None else "model_type is .*, not the name of a model type"
    with pytest.raises(FormatError, match=rf"packed/config\.json: {what}: AutoModelForCausalLM cannot tell"):
        _loads(tmp_path / "packed", verify=False)
    if own is None or own == "":  # a concrete class needs no model_type; one that is not a string never loads
        model = glyd.from_pretrained(tmp_path / "packed", model_class="LlamaForCausalLM", device="cpu", progress=False)
        assert type(model).__name__ == "LlamaForCausalLM"
    else:
        with pytest.raises(FormatError, match="not the name of a model type"):
            glyd.from_pretrained(tmp_path / "packed", model_class="LlamaForCausalLM", device="cpu", progress=False)
