"""``glyd fit`` on hostile inputs the earlier campaigns left: every bad config or path is one
FormatError line naming the problem, never a silently wrong estimate or memory blown on a read."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from glyd.apps import fit
from glyd.cli import main
from glyd.errors import FormatError

_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 256}


def _one_line_error(capsys, folder, needle: str) -> None:
    assert main(["fit", str(folder), "--gpu", "h200"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err


@pytest.mark.parametrize("key", ["sliding_window", "attention_chunk_size"])
def test_a_window_of_true_is_refused(tmp_path, capsys, key):
    # Llama's config class takes any extra field: sliding_window true (a bool, JSON's true) was read as a
    # window of 1 token, so the KV cache was counted as one token a layer ("hold at most True tokens")
    (tmp_path / "config.json").write_text(json.dumps({**_LLAMA, key: True}))
    with pytest.raises(FormatError, match=rf"needs a positive {key}, the config has True"):
        fit.run_fit(str(tmp_path), "h200", 128)
    _one_line_error(capsys, tmp_path, key)


@pytest.mark.parametrize("top_k", [0, -1, 9])
def test_a_top_k_past_the_class_default_experts_count_is_refused(tmp_path, capsys, top_k):
    # Mixtral's class builds 8 experts a layer when num_local_experts is left out: a top-k of 0, -1 or 9
    # (a model that routes to no experts, or fails at its first forward in torch.topk) was counted and
    # fitted; the same top-k beside num_local_experts 8 was already refused
    (tmp_path / "config.json").write_text(json.dumps({**_LLAMA, "model_type": "mixtral", "num_experts_per_tok": top_k}))
    with pytest.raises(FormatError, match=rf"num_experts_per_tok is {top_k}, not a number of experts from 1 to 8 "
                                          r"\(num_local_experts\)"):
        fit.run_fit(str(tmp_path), "h200", 128)
    _one_line_error(capsys, tmp_path, "num_experts_per_tok")
    (tmp_path / "config.json").write_text(json.dumps({**_LLAMA, "model_type": "mixtral", "num_experts_per_tok": 8}))
    assert fit.run_fit(str(tmp_path), "h200", 128)[0].params > 0  # every expert: a model


def test_a_large_file_given_as_the_model_is_not_read_whole(tmp_path, capsys, monkeypatch):
    # `glyd fit model.safetensors` read the whole weights file into memory as a config.json (a sparse
    # 3 GB file: 6.5 GB of memory and 24 s) before saying it was not JSON
    weights = tmp_path / "model.safetensors"
    with open(weights, "wb") as f:
        f.truncate(fit.MAX_CONFIG_BYTES + 1)
    reads = []
    monkeypatch.setattr(type(weights), "read_bytes", lambda self: reads.append(self) or b"")
    with pytest.raises(FormatError, match=r"model\.safetensors: 67,108,865 bytes, too large for a config\.json"):
        fit.load_config(str(weights))
    _one_line_error(capsys, weights, "too large for a config.json")
    assert reads == []


def test_a_huge_safetensors_index_is_not_read_whole(tmp_path, capsys):
    # fit read model.safetensors.index.json whole however large (a sparse 64 MiB + 1 file: read into
    # memory, then "not a valid safetensors index (Expecting value: line 1 column 1 (char 0))"), as it no
    # longer read a config.json of that size
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_LLAMA))
    with open(folder / "model.safetensors.index.json", "wb") as f:
        f.truncate(fit.MAX_CONFIG_BYTES + 1)
    with pytest.raises(FormatError, match=r"model\.safetensors\.index\.json: 67,108,865 bytes, too large for a "
                                          r"safetensors index \(at most 67,108,864\)$"):
        fit.count_from_files(folder)
    _one_line_error(capsys, folder, "too large for a safetensors index")


def test_a_text_config_beside_a_text_model_type_is_refused(tmp_path, capsys):
    # A Llama config keeps any extra field, and transformers builds the Llama of its own fields: fit
    # counted the text_config's model instead (here a Gemma 3 text model twice as wide), another model's
    # weights and KV cache, with no error
    (tmp_path / "config.json").write_text(json.dumps(
        {**_LLAMA, "text_config": {**_LLAMA, "model_type": "gemma3_text", "hidden_size": 128, "head_dim": 32}}))
    with pytest.raises(FormatError, match=r"config\.json: a text_config beside model_type 'llama', whose "
                                          r"transformers config has none"):
        fit.run_fit(str(tmp_path), "h200", 128)
    _one_line_error(capsys, tmp_path, "text_config")
    # a multimodal config still counts its language model
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "llava", "text_config": {**_LLAMA}, "vision_config": {"model_type": "clip_vision_model"}}))
    e, table = fit.run_fit(str(tmp_path), "h200", 128)
    assert e.params == fit.model_shape(dict(_LLAMA)).params and "its text_config" in table


@pytest.mark.parametrize("shard", ["../other/model.safetensors", "ABS"])
def test_an_index_naming_a_shard_outside_the_folder_is_refused(tmp_path, capsys, shard):
    # fit read and counted any file the index named (another folder's checkpoint, by a relative or an
    # absolute path): another model's weights, with no error; glyd pack refuses such a shard name
    other = tmp_path / "other"
    other.mkdir()
    save_file({"w": torch.zeros(1000, 1000, dtype=torch.bfloat16)}, str(other / "model.safetensors"))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_LLAMA))
    shard = str(other / "model.safetensors") if shard == "ABS" else shard
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(FormatError, match=r"index\.json: shard name '.* is not a file of the folder"):
        fit.count_from_files(folder)
    _one_line_error(capsys, folder, "is not a file of the folder")


def test_a_per_layer_intermediate_size_is_counted(tmp_path, capsys):
    # Gemma 3n's config gives intermediate_size a layer (a list, as google/gemma-3n-E2B's does): fit ended
    # in a TypeError traceback (int() of a list) after building the model; the prefill activations take
    # the widest layer's MLP
    cfg = {"model_type": "gemma3n_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100, "vocab_size_per_layer_input": 100,
           "hidden_size_per_layer_input": 8, "laurel_rank": 8, "altup_num_inputs": 2, "num_kv_shared_layers": 0,
           "layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 64,
           "activation_sparsity_pattern": [0.0] * 4, "intermediate_size": [128, 256, 128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = fit.model_shape(fit.load_config(str(tmp_path)))
    assert shape.intermediate == 256 and shape.params > 0
    assert main(["fit", str(tmp_path), "--gpu", "h200"]) == 0
    assert "fits in h200" in capsys.readouterr().out


@pytest.mark.parametrize("key", ["head_dim", "num_key_value_heads", "intermediate_size"])
@pytest.mark.parametrize("value", [[16, 16], {"a": 1}, "16", 16.5, True, -2])
def test_a_size_field_a_config_class_takes_unchecked_is_a_positive_integer(tmp_path, capsys, key, value):
    # GPT-2's config class keeps any extra field (head_dim, num_key_value_heads, intermediate_size), and
    # fit read them with int(): a list or a dict ended in a TypeError traceback at the CLI, "16" and 16.5
    # were taken as 16 and true as 1 (a KV cache of one channel a head)
    if key == "intermediate_size" and isinstance(value, list):
        value = [16, "16"]  # a list is a width a layer (Gemma 3n): each one an integer
    cfg = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 256,
           "bos_token_id": 0, "eos_token_id": 0, key: value}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match=rf"{key} .* is not a positive integer"):
        fit.run_fit(str(tmp_path), "h200", 128)
    _one_line_error(capsys, tmp_path, key)


def test_a_max_position_embeddings_of_true_is_no_bound(tmp_path):
    # BLOOM's config class keeps it as an extra field (BLOOM has no position table): true was read as
    # 1 position, and fit printed 1 as the largest context
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bloom", "hidden_size": 64, "n_layer": 2,
                                                      "n_head": 4, "vocab_size": 100, "max_position_embeddings": True}))
    e, table = fit.run_fit(str(tmp_path), "h200", 128)
    assert fit.model_shape(fit.load_config(str(tmp_path))).max_positions is None
    assert "max_position_embeddings" not in table
