"""Native loading: ``import glyd`` registers ``quant_method: "glyd"`` with transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import glyd
from glyd.errors import FormatError, UnsupportedError
from glyd.store import CheckpointReader
from glyd.nn import GlydEmbedding, GlydLinear, GlydLinearPart, GlydTiedLinear

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from glyd.hf.quantizer import GlydConfig, GlydHfQuantizer, _check_dtype, register_with_transformers  # noqa: E402


def bits(t):
    return t.view(torch.int16)


@pytest.fixture(scope="module")
def saved(tiny_model_folder, tmp_path_factory):
    """(bf16 folder, glyd folder) for a tied Llama and a merged Qwen2."""
    out = {}
    for family, merge in (("llama", False), ("qwen2", True)):
        src = tiny_model_folder(family)
        model = glyd.from_pretrained(src, merge=merge, device="cpu", progress=False)
        out[family] = (src, glyd.save_pretrained(model, tmp_path_factory.mktemp(family) / "glyd", progress=False))
    return out


def test_config_round_trip_and_validation():
    c = GlydConfig(layout="tiered", merged={"qkv_proj": ["q_proj", "k_proj", "v_proj"]})
    d = c.to_dict()
    assert d == {"quant_method": "glyd", "layout": "tiered", "format_version": 1,
                 "merged": {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}}
    assert GlydConfig.from_dict(d).to_dict() == d
    with pytest.raises(FormatError, match="layout"):
        GlydConfig(layout="zip")
    with pytest.raises(FormatError, match="format_version"):
        GlydConfig(format_version=99)
    with pytest.raises(FormatError, match="merged"):
        GlydConfig(merged={"qkv_proj": "q_proj"})
    # Values of the wrong type (read from a config.json) are the same one-line error, not a
    # TypeError or ValueError from inside the check; True is not format version 1.
    for kw, field in [({"layout": ["fixed12"]}, "layout"), ({"format_version": True}, "format_version"),
                      ({"format_version": "1"}, "format_version"), ({"merged": "qkv"}, "merged"),
                      ({"merged": 5}, "merged")]:
        with pytest.raises(FormatError, match=rf"^quantization_config\.{field}: "):
            GlydConfig(**kw)


def test_registration_is_idempotent():
    from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING

    register_with_transformers()
    register_with_transformers()
    glyd.hf.register()
    assert AUTO_QUANTIZER_MAPPING["glyd"] is GlydHfQuantizer
    assert AUTO_QUANTIZATION_CONFIG_MAPPING["glyd"] is GlydConfig


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_auto_model_loads_a_glyd_folder(saved, input_ids, family):
    src, out = saved[family]
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(model.get_input_embeddings(), GlydEmbedding)
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    if family == "llama":
        assert isinstance(model.lm_head, GlydTiedLinear)
        assert model.lm_head.source is model.get_input_embeddings()
    else:
        assert isinstance(model.model.layers[0].self_attn.k_proj, GlydLinearPart)
        assert isinstance(model.lm_head, GlydLinear)
    glyd.nn.set_exact(model, True)
    with torch.no_grad():
        assert torch.equal(bits(model(input_ids).logits), bits(ref(input_ids).logits))
    assert model.dtype == torch.bfloat16
    glyd.verify(model, progress=False)


@pytest.mark.parametrize("exact", [True, False])
def test_exact_passed_to_auto_model_is_applied(saved, input_ids, exact):
    # GlydConfig(exact=...) passed to from_pretrained is a loading option: it reaches every
    # packed product (transformers otherwise keeps only the checkpoint's own config).
    src, out = saved["qwen2"]
    model = AutoModelForCausalLM.from_pretrained(out, quantization_config=GlydConfig(exact=exact))
    flags = {m.exact for m in model.modules() if isinstance(m, (GlydLinear, GlydTiedLinear))}
    assert flags == {exact}
    if exact:
        ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
        with torch.no_grad():
            assert torch.equal(bits(model(input_ids).logits), bits(ref(input_ids).logits))


def test_hf_save_pretrained_of_a_natively_loaded_model_writes_a_glyd_folder(saved, tmp_path):
    # transformers' own call writes glyd's folder (its own would refuse: not serializable)
    model = AutoModelForCausalLM.from_pretrained(saved["llama"][1])
    model.save_pretrained(tmp_path / "x")
    assert CheckpointReader(tmp_path / "x").manifest["tensors"] == CheckpointReader(saved["llama"][1]).manifest["tensors"]


def test_quantizer_only_loads_packed_checkpoints(tiny_model_folder):
    with pytest.raises(ValueError, match="pre-quantized"):
        AutoModelForCausalLM.from_pretrained(tiny_model_folder("llama"), quantization_config=GlydConfig())


@pytest.mark.parametrize("first", ["glyd", "transformers", "glyd.hf.quantizer"])
def test_import_glyd_registers_without_importing_transformers(saved, first):
    out = saved["llama"][1]
    before = {
        "glyd": "import glyd\nassert 'transformers' not in sys.modules, 'import glyd imported transformers'",
        "transformers": "import transformers.quantizers.auto\nimport glyd",
        "glyd.hf.quantizer": "import glyd.hf.quantizer",
    }[first]
    code = f"""
import sys, json
{before}
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained({str(out)!r})
print(json.dumps([type(m.model.embed_tokens).__name__, type(m.lm_head).__name__]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == ["GlydEmbedding", "GlydTiedLinear"]


def test_a_packed_tensor_for_a_module_glyd_cannot_run(saved, tmp_path):
    import shutil

    out = tmp_path / "bad"
    shutil.copytree(saved["llama"][1], out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["num_hidden_layers"] = 1  # the checkpoint's layer 1 now names no module
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match=r"model\.layers\.1"):
        AutoModelForCausalLM.from_pretrained(out)


@pytest.mark.parametrize("layout", ["fixed12", "tiered"])
@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_a_folder_packed_by_glyd_pack_loads_natively(tiny_model_folder, tmp_path, input_ids, layout, family):
    from glyd.store import pack_folder

    src = tiny_model_folder(family)
    dst = tmp_path / "packed"
    pack_folder(src, dst, layout=layout, progress=False)
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(dst)
    assert {m.layout for m in model.modules() if isinstance(m, (GlydLinear, GlydEmbedding))} == {layout}
    glyd.nn.set_exact(model, True)
    with torch.no_grad():
        assert torch.equal(bits(model(input_ids).logits), bits(ref(input_ids).logits))
    again = glyd.from_pretrained(dst, exact=True, verify=True, device="cpu", progress=False)
    with torch.no_grad():
        assert torch.equal(bits(again(input_ids).logits), bits(ref(input_ids).logits))


def test_a_natively_loaded_model_saves_the_same_tensors(saved, tmp_path):
    from safetensors.torch import load_file

    out = saved["qwen2"][1]
    model = AutoModelForCausalLM.from_pretrained(out)
    again = glyd.save_pretrained(model, tmp_path / "again", progress=False)
    a, b = CheckpointReader(out), CheckpointReader(again)
    assert a.names() == b.names() or sorted(a.names()) == sorted(b.names())
    for name in a.names():
        assert a.entry(name)["sha256"] == b.entry(name)["sha256"], name
    sa, sb = load_file(out / "model.safetensors"), load_file(again / "model.safetensors")
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    cfg = json.loads((again / "config.json").read_text())["quantization_config"]
    assert cfg["merged"] == {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    assert (again / "tokenizer_config.json").is_file()


def test_scaled_embeddings_load_natively(tiny_model_folder, tmp_path, input_ids):
    src = tiny_model_folder("gemma3")
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model = glyd.from_pretrained(src, exact=True, device="cpu", progress=False)
    assert float(model.get_input_embeddings().embed_scale) == 8.0
    out = glyd.save_pretrained(model, tmp_path / "g3", progress=False)
    native = AutoModelForCausalLM.from_pretrained(out)
    glyd.nn.set_exact(native, True)
    assert native.get_input_embeddings().embed_scale is not None
    with torch.no_grad():
        want = ref(input_ids).logits
        assert torch.equal(bits(model(input_ids).logits), bits(want))
        assert torch.equal(bits(native(input_ids).logits), bits(want))


@pytest.mark.parametrize("merged", [{"qkv_proj": ["k_proj", "q_proj", "v_proj"]},
                                    {"gate_up_proj": ["up_proj", "gate_proj"], "qkv_proj": ["q_proj", "k_proj", "v_proj"]},
                                    {"qkv_proj": ["q_proj", "k_proj"]}, {"qk_proj": ["q_proj", "k_proj"]}])
def test_merged_parts_other_than_glyds_are_refused(saved, tmp_path, merged):
    # The parts' order decides which rows of a merged product each projection takes: a config.json whose
    # merged lists were reordered (gate_up_proj: up_proj, gate_proj) loaded with both loaders and gave
    # other logits with no error
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(saved["qwen2"][1], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"]["merged"] = merged
    (folder / "config.json").write_text(json.dumps(cfg))
    message = r"quantization_config\.merged: '\w+': \[.*\] is not a merge glyd writes \(qkv_proj: q_proj, k_proj, v_proj;"
    with pytest.raises(FormatError, match=message):
        AutoModelForCausalLM.from_pretrained(folder)
    with pytest.raises(FormatError, match=message):
        glyd.from_pretrained(folder, device="cpu", progress=False)
    with pytest.raises(FormatError, match=message):
        GlydConfig(merged=merged)


@pytest.mark.parametrize("exact", ["false", "no", 0, None])
def test_an_exact_that_is_not_true_or_false_is_refused(saved, tmp_path, exact):
    # transformers built GlydConfig from config.json and took bool(exact): "false" loaded every product
    # exact (native loading), the opposite of what the file says
    import shutil

    folder = tmp_path / "e"
    shutil.copytree(saved["llama"][1], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"]["exact"] = exact
    (folder / "config.json").write_text(json.dumps(cfg))
    message = r"quantization_config\.exact: .* is not true or false"
    with pytest.raises(FormatError, match=message):
        AutoModelForCausalLM.from_pretrained(folder)
    with pytest.raises(FormatError, match=message):
        glyd.from_pretrained(folder, device="cpu", progress=False)
    with pytest.raises(FormatError, match=message):
        GlydConfig(exact=exact)


def test_the_dtype_check_refuses_a_huge_config_unread(tmp_path):
    # the dtype check read config.json whole however large (a sparse 64 MiB + 1 file: read into memory
    # as text, then dropped as not JSON and the dtype refused as if the config named none)
    with open(tmp_path / "config.json", "wb") as f:
        f.write(b"{}")
        f.truncate((64 << 20) + 1)  # the store's MAX_JSON_FILE_BYTES, and one byte
    with pytest.raises(FormatError, match=rf"{tmp_path.name}/config\.json: 67,108,865 bytes, too large for a "
                                          r"config\.json \(at most 67,108,864\)$"):
        _check_dtype(torch.float32, tmp_path)
    _check_dtype(torch.bfloat16, tmp_path)  # bf16 asked for: the config is not read at all
    (tmp_path / "config.json").write_text('{"dtype": "float32"')  # malformed: names no dtype, as before
    with pytest.raises(UnsupportedError, match=r"dtype=torch\.float32: a glyd model loads in bfloat16"):
        _check_dtype(torch.float32, tmp_path)
    (tmp_path / "config.json").write_text('{"dtype": "float32"}')
    _check_dtype(torch.float32, tmp_path)  # the config's own dtype: said, not refused
