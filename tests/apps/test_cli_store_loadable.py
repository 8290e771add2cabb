"""``glyd pack`` (:mod:`glyd.apps.cli_store`, :mod:`glyd.hf.pack_plan`): every folder it writes loads
with ``glyd.from_pretrained`` (exact logits equal bf16's bit for bit), or it refuses up front naming
the tensor and the command to use instead. 2-D bf16 tensors the model does not run packed (an MoE
router, BART's ``final_logits_bias``) are kept as they are and listed in the summary."""

from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import glyd
from glyd.cli import main
from glyd.store import CheckpointReader
from glyd.store._safetensors import read_header

transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))
from serve_model import build_chat_model  # noqa: E402

VOCAB = 128


def _moe_config(family: str):
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                  num_experts_per_tok=2, tie_word_embeddings=False)
    if family == "mixtral":
        return transformers.MixtralConfig(**common, intermediate_size=96, num_local_experts=4)
    return transformers.Qwen3MoeConfig(**common, intermediate_size=128, moe_intermediate_size=64, num_experts=4,
                                       head_dim=16)


def _random(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.05 if p.dim() >= 2 else 0.1) + (0 if p.dim() >= 2 else 1))
    return model.to(torch.bfloat16).eval()


def _reference(cls, folder: Path):
    # the bf16 model as transformers loads it (the one built in float32 keeps its rotary buffers in bf16)
    return cls.from_pretrained(folder, dtype=torch.bfloat16).eval()


def _logits(model, ids, **kw):
    with torch.no_grad():
        return model(ids, **kw).logits


def _ids():
    return torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(5))


def _packed(folder: Path) -> set[str]:
    reader = CheckpointReader(folder)
    return {n for n in reader.names() if reader.entry(n)["kind"] == "packed"}


def _bf16_2d(folder: Path) -> set[str]:
    return {n for f in folder.glob("*.safetensors") for n, i in read_header(f).tensors.items()
            if i.dtype == "bfloat16" and len(i.shape) == 2}


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_experts_stored_one_matrix_an_expert_are_refused_with_the_command_that_packs_them(family, tmp_path, capsys):
    # was: packed, then glyd.from_pretrained refused "packed tensor '...experts.0.down_proj.weight' names no module"
    model = _random(transformers.AutoModelForCausalLM.from_config(_moe_config(family), dtype=torch.float32))
    model.save_pretrained(tmp_path / "bf16")
    dst = tmp_path / "packed"
    capsys.readouterr()  # transformers' progress bar
    assert main(["-q", "pack", str(tmp_path / "bf16"), str(dst)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and not dst.exists()
    assert re.search(r"tensor 'model\.layers\.0\.(mlp|block_sparse_moe)\.experts\.0\.\w+\.weight' is stored in a "
                     r"layout that transformers converts", err), err
    command = shlex.split(err[err.index("python -c "):])
    assert command[:2] == ["python", "-c"] and len(command) == 3
    exec(command[2], {})  # the command it names writes a folder that loads, exact
    got = glyd.from_pretrained(dst, device="cpu", exact=True, progress=False)
    ids, ref = _ids(), _reference(transformers.AutoModelForCausalLM, tmp_path / "bf16")
    assert torch.equal(_logits(got, ids).view(torch.int16), _logits(ref, ids).view(torch.int16))


@pytest.mark.parametrize("fused", [False, True])
def test_a_config_routing_to_no_experts_is_named_and_the_plan_still_made(fused, tmp_path, capsys, caplog):
    # with the loader's check of num_experts_per_tok inside the plan's, a bad top-k made the plan fail:
    # "every 2-D bf16 tensor is packed", so a per-expert folder was packed (its router and experts as
    # matrices: a folder no fixed config.json loads) instead of refused with the command that packs it
    if fused:
        src = _fused_moe(tmp_path / "bf16")
    else:
        _random(transformers.AutoModelForCausalLM.from_config(_moe_config("mixtral"), dtype=torch.float32)).save_pretrained(
            tmp_path / "bf16")
        src = tmp_path / "bf16"
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "num_experts_per_tok": 0}))
    dst = tmp_path / "packed"
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="glyd"):
        rc = main(["-q", "pack", str(src), str(dst)])
    said = [r.getMessage() for r in caplog.records if "num_experts_per_tok is 0" in r.getMessage()]
    assert "not checked" not in caplog.text
    if not fused:
        assert rc == 1 and not dst.exists()
        assert "stored in a layout that transformers converts" in capsys.readouterr().err
        return
    assert rc == 0 and len(said) == 1 and "glyd.from_pretrained will refuse the packed folder" in said[0], said
    assert {n for n in _packed(dst) if ".mlp.gate." in n} == set()  # the router kept, as the loader runs it
    with pytest.raises(glyd.errors.FormatError, match=r"num_experts_per_tok is 0, not a number of experts"):
        glyd.from_pretrained(dst, device="cpu", progress=False)

def _fused_moe(src: Path) -> Path:
    # a Qwen3-MoE folder whose experts are stored fused (3-D), as the model holds them
    model = _random(transformers.AutoModelForCausalLM.from_config(_moe_config("qwen3_moe"), dtype=torch.float32))
    model.save_pretrained(src)
    (src / "model.safetensors").unlink()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(src / "model.safetensors"),
              metadata={"format": "pt"})
    return src


def test_a_router_beside_fused_experts_is_kept_and_the_folder_loads_exact(tmp_path, capsys):
    # experts stored fused (as the model holds them): nothing to convert; the router's 2-D weight
    # (Qwen3MoeTopKRouter) was packed, then refused by the loader ("cannot run packed")
    src = _fused_moe(tmp_path / "bf16")
    assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"kept unpacked\s+.*1 not run packed by the model", out), out
    assert "model.layers.0.mlp.gate.weight" in out
    assert _packed(tmp_path / "packed") == _bf16_2d(src) - {"model.layers.0.mlp.gate.weight"}
    got = glyd.from_pretrained(tmp_path / "packed", device="cpu", exact=True, progress=False)
    ids, ref = _ids(), _reference(transformers.AutoModelForCausalLM, src)
    assert torch.equal(_logits(got, ids).view(torch.int16), _logits(ref, ids).view(torch.int16))


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    cfg = transformers.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                                  encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                  decoder_ffn_dim=64, max_position_embeddings=64)
    model = _random(transformers.AutoModelForSeq2SeqLM.from_config(cfg, dtype=torch.float32))
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.1)  # a bias that changes the logits (its buffer starts at zero)
    src = tmp_path_factory.mktemp("bart") / "bf16"
    model.save_pretrained(src)
    return src


KEPT_BART = {"final_logits_bias", "model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}


def test_bart_keeps_its_final_logits_bias_and_positions_as_the_loader_does(bart, tmp_path, capsys):
    # final_logits_bias [1, vocab] and the learned positions were packed, then refused by the loader
    src = bart
    assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    out = capsys.readouterr().out
    assert "3 not run packed by the model" in out and "final_logits_bias" in out
    packed = _packed(tmp_path / "packed")
    assert packed == _bf16_2d(src) - KEPT_BART


def test_bart_packed_by_glyd_pack_loads_with_logits_equal_to_bf16(bart, tmp_path):
    src = bart
    assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    got = glyd.from_pretrained(tmp_path / "packed", device="cpu", exact=True, progress=False)
    ids, dec = _ids(), torch.arange(3, 9)[None].expand(2, -1)
    want = _logits(_reference(transformers.AutoModelForSeq2SeqLM, src), ids, decoder_input_ids=dec)
    assert torch.equal(_logits(got, ids, decoder_input_ids=dec).view(torch.int16), want.view(torch.int16))


def test_a_dense_model_packs_every_matrix_as_before(tmp_path, capsys):
    src = build_chat_model(tmp_path / "bf16")
    assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    out = capsys.readouterr().out
    assert "not run packed" not in out
    assert _packed(tmp_path / "packed") == _bf16_2d(src) and len(_bf16_2d(src)) == 16


def test_without_a_model_to_check_every_matrix_is_packed_with_a_warning(bart, tmp_path, caplog, monkeypatch):
    from glyd.hf import pack_plan

    def no_transformers(*args):
        raise ModuleNotFoundError("No module named 'transformers'", name="transformers")

    monkeypatch.setattr(pack_plan, "_meta_model", no_transformers)
    src = bart
    with caplog.at_level(logging.WARNING):
        assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    assert _packed(tmp_path / "packed") == _bf16_2d(src)
    assert any("transformers is not installed" in r.getMessage() and "was not checked" in r.getMessage()
               for r in caplog.records)


def test_a_config_transformers_cannot_build_packs_every_matrix_with_a_warning(tmp_path, caplog):
    src = build_chat_model(tmp_path / "bf16")
    cfg = (src / "config.json").read_text()
    (src / "config.json").write_text(cfg.replace('"model_type": "mistral"', '"model_type": "not-a-model"'))
    with caplog.at_level(logging.WARNING):
        assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    assert _packed(tmp_path / "packed") == _bf16_2d(src)
    assert any("was not checked" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("field, value, says", [
    ("num_attention_heads", "four", "Field 'num_attention_heads' expected int, got str"),  # a multi-line error
    ("rope_parameters", {"rope_type": "linear"}, "Missing required keys in `rope_parameters`"),
])
def test_loading_a_folder_packed_from_a_config_transformers_cannot_build_says_so_on_one_line(tmp_path, field, value,
                                                                                              says):
    # packed with a "not checked" warning (glyd unpack gives it back); loading raised transformers' own
    # exception (StrictDataclassFieldValidationError over two lines, a bare KeyError), not naming the folder
    src = build_chat_model(tmp_path / "bf16")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, field: value}))
    dst = tmp_path / "packed"
    assert main(["-q", "pack", str(src), str(dst)]) == 0
    with pytest.raises(glyd.errors.FormatError) as info:
        glyd.from_pretrained(dst, device="cpu", progress=False)
    msg = str(info.value)
    assert msg.startswith(f"{dst}: transformers cannot build the model its config.json describes (")
    assert says in msg and "\n" not in msg and info.value.__cause__ is not None, msg


def test_a_load_that_fails_for_another_reason_keeps_transformers_error(tmp_path, monkeypatch):
    # the config builds: the failure (here a device's) is not turned into a config error
    src = build_chat_model(tmp_path / "bf16")
    dst = tmp_path / "packed"
    assert main(["-q", "pack", str(src), str(dst)]) == 0

    def fail(*args, **kwargs):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(transformers.MistralForCausalLM, "from_pretrained", fail)
    with pytest.raises(RuntimeError, match="^CUDA out of memory$"):
        glyd.from_pretrained(dst, device="cpu", progress=False)


def test_a_tensor_the_model_has_no_place_for_is_named_in_a_warning(tmp_path, caplog):
    # kept (glyd unpack gives it back), but the packed folder's loader refuses it: said up front
    from safetensors.torch import load_file

    src = build_chat_model(tmp_path / "bf16")
    tensors = load_file(str(src / "model.safetensors"))
    tensors["model.position_ids"] = torch.arange(8)[None].to(torch.bfloat16)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    assert "model.position_ids" not in _packed(tmp_path / "packed")
    said = [r.getMessage() for r in caplog.records if "have no place in" in r.getMessage()]
    assert len(said) == 1 and "tensor(s) model.position_ids have no place in MistralForCausalLM" in said[0]


def test_weights_stored_without_the_models_prefix_are_refused_with_the_loader_command(tmp_path, capsys):
    # transformers' loader adds "model." to them; packed under their own names no module would take them
    from safetensors.torch import load_file

    src = build_chat_model(tmp_path / "bf16")
    tensors = load_file(str(src / "model.safetensors"))
    save_file({k.removeprefix("model."): v for k, v in tensors.items()}, str(src / "model.safetensors"),
              metadata={"format": "pt"})
    capsys.readouterr()
    assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and not (tmp_path / "packed").exists()
    assert re.search(r"tensor '[\w.]+' is stored in a layout that transformers renames into 'model\.[\w.]+'", err), err
    assert "python -c 'import glyd; glyd.save_pretrained(glyd.from_pretrained(" in err


def test_a_folders_own_code_is_never_run_nor_asked_about(tmp_path, monkeypatch, caplog):
    # was: transformers asked "Do you wish to run the custom code? [y/N]" on stdin, twice, and ran
    # the folder's configuration_*.py on "y" (AutoConfig without trust_remote_code=False)
    src = build_chat_model(tmp_path / "bf16")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(model_type="hostile", architectures=["HostileForCausalLM"],
               auto_map={"AutoConfig": "configuration_hostile.HostileConfig",
                         "AutoModelForCausalLM": "modeling_hostile.HostileForCausalLM"})
    (src / "config.json").write_text(json.dumps(cfg))
    ran = tmp_path / "ran"
    for module in ("configuration_hostile", "modeling_hostile"):
        (src / f"{module}.py").write_text(f"open({str(ran)!r}, 'a').write({module!r})\n")
    asked = []
    monkeypatch.setattr("builtins.input", lambda *args: asked.append(args) or "y")
    with caplog.at_level(logging.WARNING):
        assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    assert not asked and not ran.exists()
    assert any("was not checked" in r.getMessage() for r in caplog.records)


def test_tensors_whose_shapes_the_config_contradicts_are_named_in_a_warning(tmp_path, caplog):
    # a config.json edited (or of another model) so that the model it builds wants other shapes: packed
    # silently before, and only glyd.from_pretrained said "is [64, 96] in glyd.json but the model needs [64, 128]"
    src = build_chat_model(tmp_path / "bf16")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 128}))
    with caplog.at_level(logging.WARNING):
        assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    said = [r.getMessage() for r in caplog.records if "shape" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0], said
    first = "model.layers.0.mlp.down_proj.weight bfloat16[64, 96] (MistralForCausalLM's is bfloat16[64, 128])"
    assert (first in said[0]
            and "and 3 more" in said[0] and "glyd.from_pretrained will refuse the packed folder" in said[0]), said[0]
    with pytest.raises(glyd.errors.FormatError, match=r"down_proj.weight' is \[64, 96\] in glyd.json but the model"):
        glyd.from_pretrained(tmp_path / "packed", device="cpu", exact=True, progress=False)


def test_memory_limit_counts_the_tensors_kept_at_their_stored_bytes(tmp_path, caplog):
    # the router is kept bf16 (not run packed): counted at its bytes, a limit a byte under that count
    # takes dense11; counted packed (as every other 2-D bf16 tensor) fixed12 would have seemed to fit
    from glyd.hf.memory import weights_bytes

    src = _fused_moe(tmp_path / "bf16")
    router = "model.layers.0.mlp.gate.weight"
    packable = other = 0
    rows: dict[int, int] = {}
    for name, info in read_header(src / "model.safetensors").tensors.items():
        if info.dtype == "bfloat16" and len(info.shape) == 2 and name != router:
            packable += info.shape[0] * info.shape[1]
            rows[info.shape[1]] = rows.get(info.shape[1], 0) + info.shape[0]
        else:
            other += info.end - info.begin
    need = weights_bytes(packable, other, "fixed12", tuple(sorted(rows.items())))
    rows[64] += 4  # the router packed: [4, 64]
    assert weights_bytes(packable + 256, other - 512, "fixed12", tuple(sorted(rows.items()))) < need
    dst = tmp_path / "packed"
    with caplog.at_level(logging.INFO):
        assert main(["-q", "pack", str(src), str(dst), "--layout", "auto", "--memory-limit", f"{need - 1}B"]) == 0
    assert "layout auto: dense11 (fixed12 needs" in caplog.text
    reader = CheckpointReader(dst)
    assert reader.entry(router)["kind"] == "raw"
    assert {reader.entry(n)["layout"] for n in _packed(dst)} == {"dense11"}
    shutil.rmtree(dst)
    assert main(["-q", "pack", str(src), str(dst), "--layout", "auto", "--memory-limit", f"{need}B"]) == 0
    assert {CheckpointReader(dst).entry(n)["layout"] for n in _packed(dst)} == {"fixed12"}


def test_tensors_config_jsons_model_needs_and_the_folder_lacks_are_named_in_a_warning(tmp_path, caplog):
    # model_type qwen2 over Mistral weights: the names match, but Qwen2's attention has biases the folder
    # lacks; packed silently before, and glyd.from_pretrained refused it ("the checkpoint lacks tensor(s)")
    src = build_chat_model(tmp_path / "bf16")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    with caplog.at_level(logging.WARNING):
        assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    said = [r.getMessage() for r in caplog.records if "lacks" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0], said
    assert ("lacks tensor(s) Qwen2ForCausalLM needs: model.layers.0.self_attn.q_proj.bias, "
            "model.layers.0.self_attn.k_proj.bias, model.layers.0.self_attn.v_proj.bias and 3 more" in said[0]
            and "glyd.from_pretrained will refuse the packed folder" in said[0]), said[0]
    with pytest.raises(glyd.errors.FormatError, match="the checkpoint lacks tensor"):
        glyd.from_pretrained(tmp_path / "packed", device="cpu", exact=True, progress=False)


def test_a_tied_output_projection_stored_once_is_not_missing(tmp_path, caplog):
    src = build_chat_model(tmp_path / "bf16", tie_word_embeddings=True)
    with caplog.at_level(logging.WARNING):
        assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    got = glyd.from_pretrained(tmp_path / "packed", device="cpu", exact=True, progress=False)
    ids, ref = _ids(), _reference(transformers.AutoModelForCausalLM, src)
    assert torch.equal(_logits(got, ids).view(torch.int16), _logits(ref, ids).view(torch.int16))


def test_a_module_weight_stored_in_another_dtype_is_named_in_a_warning(tmp_path, caplog):
    # kept as it is (glyd packs bf16 only), and glyd.from_pretrained refuses it ("stored as float32[320, 64] but the
    # model holds bfloat16[320, 64]"): pack said only that it was not bf16, not that the folder would not load
    from safetensors.torch import load_file

    src = build_chat_model(tmp_path / "bf16")
    tensors = load_file(str(src / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["lm_head.weight"].float()
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    said = [r.getMessage() for r in caplog.records if "glyd.from_pretrained will refuse" in r.getMessage()]
    assert len(said) == 1 and "lm_head.weight float32[320, 64] (MistralForCausalLM's is bfloat16[320, 64])" in said[0]
    with pytest.raises(glyd.errors.FormatError, match=r"'lm_head.weight' is stored as float32\[320, 64\] but"):
        glyd.from_pretrained(tmp_path / "packed", device="cpu", exact=True, progress=False)


def test_a_per_expert_moe_folder_at_a_path_that_is_not_utf8_is_refused_for_its_path(tmp_path, capsys):
    # the loader command it printed could not work: safetensors opens no file at such a path
    import os

    model = _random(transformers.AutoModelForCausalLM.from_config(_moe_config("qwen3_moe"), dtype=torch.float32))
    model.save_pretrained(tmp_path / "bf16")
    src = (tmp_path / "bf16").rename(tmp_path / os.fsdecode(b"bf16\xff"))
    capsys.readouterr()
    assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "the source folder's path is not valid UTF-8" in err and "python -c" not in err, err
    assert not (tmp_path / "packed").exists()


def test_a_tensor_the_model_keeps_in_float32_is_not_called_a_mismatch(tmp_path, caplog):
    # DeepSeek-V3's e_score_correction_bias is stored float32 and loaded float32 (_keep_in_fp32_modules_strict);
    # the meta model holds it bf16, so the dtype check (earlier on this branch) warned the folder would not load
    cfg = transformers.DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
        first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=8, n_group=1, topk_group=1, tie_word_embeddings=False)
    model = _random(transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32))
    src = tmp_path / "bf16"
    model.save_pretrained(src)
    (src / "model.safetensors").unlink()
    state = {k: v.float() if "e_score_correction_bias" in k else v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(src / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    assert "will refuse" not in caplog.text, caplog.text
    glyd.from_pretrained(tmp_path / "packed", device="cpu", exact=True, progress=False)
