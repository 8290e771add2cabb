"""diffusers models: a tiny FLUX-style ``FluxTransformer2DModel`` and a tiny SD3-style
``SD3Transformer2DModel`` built from configs with random bf16 weights. Packed in place with
``glyd.compress``, every weight unpacks bit for bit and ``exact=True`` outputs equal bf16's; a glyd
folder in diffusers' layout saves, verifies and loads back (also as a pipeline's ``transformer/``
subfolder, and from a bf16 diffusers folder, packed while loading); inside ``FluxPipeline`` the
image from ``exact=True`` equals bf16's bit for bit for a fixed seed.

The pipeline is FLUX's own, offline: ``FluxPipeline`` takes ``prompt_embeds`` and
``pooled_prompt_embeds`` directly, so it needs no tokenizer or text encoder (their files are not
on this machine); a tiny ``AutoencoderKL`` decodes the latents.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import glyd
from glyd.errors import FormatError, MissingDependencyError, UnsupportedError
from glyd.nn.modules import GlydLinear

diffusers = pytest.importorskip("diffusers")

TXT, IMG = 8, 16  # text and image tokens of the forward tests


def _bits(t: torch.Tensor) -> torch.Tensor:
    assert t.dtype == torch.bfloat16
    return t.view(torch.int16)


def _init(model: nn.Module, seed: int) -> nn.Module:
    """Random weights (normal, std 0.02; norms around 1), then bf16, eval."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 or name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            else:
                p.copy_(1.0 + 0.05 * torch.randn(p.shape, generator=g))
    return model.to(torch.bfloat16).eval()


def tiny_flux(seed: int = 0) -> nn.Module:
    return _init(diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=24, axes_dims_rope=(4, 6, 6)), seed)


def tiny_sd3(seed: int = 0) -> nn.Module:
    return _init(diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=24, out_channels=4,
        pos_embed_max_size=8), seed)


MODELS = {"flux": tiny_flux, "sd3": tiny_sd3}


def _inputs(kind: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    common = dict(encoder_hidden_states=r(1, TXT, 32), pooled_projections=r(1, 24),
                  timestep=torch.tensor([0.5], dtype=torch.bfloat16))
    if kind == "flux":
        return dict(hidden_states=r(1, IMG, 16), img_ids=torch.zeros(IMG, 3), txt_ids=torch.zeros(TXT, 3), **common)
    return dict(hidden_states=r(1, 4, 8, 8), **common)


def run(model: nn.Module, kind: str) -> torch.Tensor:
    with torch.no_grad():
        return model(**_inputs(kind), return_dict=False)[0]


def linears(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: m.weight.detach().clone() for n, m in model.named_modules() if type(m) is nn.Linear}


@pytest.fixture(params=list(MODELS))
def kind(request) -> str:
    return request.param


def test_compress_packs_every_linear_bit_for_bit(kind, caplog):
    model = MODELS[kind]()
    want = linears(model)
    assert len(want) >= 15
    with caplog.at_level(logging.INFO, logger="glyd"):
        assert glyd.compress(model, progress=False) is model
    for name, w in want.items():
        m = model.get_submodule(name)
        assert isinstance(m, GlydLinear), name
        assert torch.equal(_bits(glyd.unpack(m.packed)), _bits(w)), name
    lines = [r.getMessage() for r in caplog.records if "left unpacked:" in r.getMessage()]
    assert lines and (kind != "sd3" or "Conv2d: pos_embed.proj.weight" in lines[0])  # SD3's patch embedding


def test_exact_outputs_equal_bf16_bit_for_bit(kind):
    ref = MODELS[kind]()
    want = _bits(run(ref, kind))
    model = glyd.compress(MODELS[kind](), exact=True, progress=False)
    assert torch.equal(_bits(run(model, kind)), want)
    default = glyd.compress(MODELS[kind](), progress=False)
    torch.testing.assert_close(run(default, kind).float(), run(ref, kind).float(), atol=5e-2, rtol=5e-2)


def test_save_then_load_in_diffusers_layout(kind, tmp_path):
    ref = MODELS[kind]()
    want = _bits(run(ref, kind))
    model = glyd.compress(MODELS[kind](), exact=True, progress=False)
    folder = tmp_path / "pipe" / "transformer"
    glyd.save_pretrained(model, folder, progress=False)
    assert sorted(os.listdir(folder)) == ["README.md", "config.json", "diffusion_pytorch_model.safetensors", "glyd.json"]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["_class_name"] == type(ref).__name__ and cfg["_diffusers_version"] == diffusers.__version__
    assert cfg["quantization_config"]["quant_method"] == "glyd"
    assert glyd.verify(folder, progress=False)["packed"] == len(linears(ref))
    for choice in (None, type(ref), type(ref).__name__):
        again = glyd.from_pretrained(tmp_path / "pipe", subfolder="transformer", model_class=choice, exact=True,
                                     verify=True, device="cpu", progress=False)
        assert type(again) is type(ref), choice
        assert torch.equal(_bits(run(again, kind)), want), choice
    # diffusers without glyd refuses the folder rather than build a model with random weights
    with pytest.raises(ValueError, match="glyd"):
        type(ref).from_pretrained(folder)


def test_bf16_folder_is_packed_while_loading(tmp_path):
    ref = tiny_flux()
    ref.save_pretrained(tmp_path / "bf16")  # diffusers' own folder
    model = glyd.from_pretrained(tmp_path / "bf16", exact=True, layout="fixed12", device="cpu", progress=False)
    assert type(model) is type(ref)
    assert all(isinstance(model.get_submodule(n), GlydLinear) for n in linears(ref))
    assert torch.equal(_bits(run(model, "flux")), _bits(run(ref, "flux")))


def test_model_save_pretrained_and_dequantize(tmp_path):
    ref = tiny_flux()
    model = glyd.compress(tiny_flux(), exact=True, progress=False)
    model.save_pretrained(tmp_path / "t")  # diffusers' spelling writes the glyd folder
    assert (tmp_path / "t" / "glyd.json").is_file()
    again = glyd.from_pretrained(tmp_path / "t", exact=True, device="cpu", progress=False)
    again.save_pretrained(tmp_path / "t")  # replaces its own glyd folder
    plain = again.dequantize()
    assert not any(isinstance(m, GlydLinear) for m in plain.modules())
    for name, w in linears(ref).items():
        assert torch.equal(_bits(plain.get_submodule(name).weight), _bits(w)), name
    plain.save_pretrained(tmp_path / "bf16")  # diffusers' own save again: a bf16 folder diffusers loads
    back = diffusers.FluxTransformer2DModel.from_pretrained(tmp_path / "bf16", torch_dtype=torch.bfloat16)
    assert torch.equal(_bits(run(back, "flux")), _bits(run(ref, "flux")))


def _pipeline(transformer: nn.Module) -> object:
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1, latent_channels=4,
        norm_num_groups=4, sample_size=32, shift_factor=0.1159, scaling_factor=0.3611).to(torch.bfloat16).eval()
    return diffusers.FluxPipeline(scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
                                  tokenizer=None, text_encoder_2=None, tokenizer_2=None, transformer=transformer)


def _image(pipe) -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    embeds = torch.randn(1, TXT, 32, generator=g).to(torch.bfloat16)
    pooled = torch.randn(1, 24, generator=g).to(torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt_embeds=embeds, pooled_prompt_embeds=pooled, height=32, width=32, num_inference_steps=2,
               generator=torch.Generator().manual_seed(0), output_type="pt")
    return out.images


def test_flux_pipeline_image_equals_bf16_bit_for_bit(tmp_path):
    want = _image(_pipeline(tiny_flux()))
    pipe = _pipeline(tiny_flux())
    glyd.compress(pipe.transformer, exact=True, progress=False)
    assert torch.equal(_bits(_image(pipe)), _bits(want))
    pipe.save_pretrained(tmp_path / "pipe")  # diffusers' pipeline save: transformer/ through glyd's hook
    assert (tmp_path / "pipe" / "transformer" / "glyd.json").is_file()
    assert (tmp_path / "pipe" / "model_index.json").is_file()
    loaded = glyd.from_pretrained(tmp_path / "pipe", subfolder="transformer", exact=True, device="cpu", progress=False)
    none = dict(text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)
    again = diffusers.FluxPipeline.from_pretrained(tmp_path / "pipe", transformer=loaded, dtype=torch.bfloat16, **none)
    assert again.transformer is loaded
    assert torch.equal(_bits(_image(again)), _bits(want))


def test_bad_inputs_get_clear_errors(tmp_path):
    with pytest.raises(TypeError, match="takes a diffusers model"):
        glyd.diffusers.compress(nn.Linear(4, 4))
    with pytest.raises(FormatError, match="glyd packs bf16 weights only"):
        glyd.compress(tiny_flux().float(), progress=False)
    model = glyd.compress(tiny_flux(), progress=False)
    glyd.save_pretrained(model, tmp_path / "t", progress=False)
    with pytest.raises(UnsupportedError, match="'NoSuchModel': not a diffusers model class"):
        glyd.from_pretrained(tmp_path / "t", model_class="NoSuchModel", device="cpu")
    with pytest.raises(TypeError, match="unexpected keyword argument.*attn_implementation"):
        glyd.diffusers.from_pretrained(tmp_path / "t", attn_implementation="sdpa", device="cpu")
    with pytest.raises(FormatError, match="subfolder='nope'"):
        glyd.diffusers.from_pretrained(tmp_path, subfolder="nope", device="cpu")
    cfg = json.loads((tmp_path / "t" / "config.json").read_text())
    del cfg["quantization_config"]
    (tmp_path / "t" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match="no glyd quantization_config"):
        glyd.from_pretrained(tmp_path / "t", device="cpu", progress=False)


def test_without_diffusers_plain_modules_still_pack(monkeypatch):
    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers now raises ImportError
    m = glyd.compress(nn.Sequential(nn.Linear(8, 8).to(torch.bfloat16)), progress=False)
    assert isinstance(m[0], GlydLinear) and not glyd.diffusers.is_diffusers_model(m)
    with pytest.raises(MissingDependencyError, match=r"pip install 'glyd-lossless\[diffusion\]'"):
        glyd.diffusers.from_pretrained(".", model_class="FluxTransformer2DModel", device="cpu")


@pytest.mark.slow
def test_import_glyd_needs_no_diffusers():
    # diffusers made unimportable in a fresh interpreter: glyd, glyd.diffusers and compress still work
    code = (
        "import sys; sys.modules['diffusers'] = None\n"
        "import torch, glyd, glyd.diffusers\n"
        "m = glyd.compress(torch.nn.Sequential(torch.nn.Linear(8, 8).to(torch.bfloat16)), progress=False)\n"
        "assert type(m[0]).__name__ == 'GlydLinear' and not glyd.diffusers.is_diffusers_model(m)\n"
        "try:\n"
        "    glyd.diffusers.from_pretrained('.', model_class='FluxTransformer2DModel', device='cpu')\n"
        "except glyd.errors.MissingDependencyError as e:\n"
        "    print('refused:', e)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused: diffusers models need diffusers (pip install 'glyd-lossless[diffusion]')" in out.stdout
    assert issubclass(MissingDependencyError, ImportError)


def test_model_dequantize_to_float32_is_exact(tmp_path):
    # model.dequantize(dtype=...) as a transformers model takes it; the hook's signature refused it (TypeError)
    ref = tiny_flux()
    model = glyd.compress(tiny_flux(), progress=False)
    assert model.dequantize(dtype=torch.float32) is model
    want = {n: t for n, t in ref.state_dict().items()}
    got = model.state_dict()
    assert sorted(got) == sorted(want)
    for k, t in got.items():
        assert t.dtype == torch.float32 and torch.equal(t, want[k].float()), k
    with pytest.raises(UnsupportedError, match=r"^dequantize\(dtype=torch\.float16\)"):
        glyd.compress(tiny_flux(), progress=False).dequantize(dtype=torch.float16)


def test_a_glyd_folder_without_its_glyd_json_is_named_so(tmp_path):
    glyd.save_pretrained(glyd.compress(tiny_flux(), progress=False), tmp_path / "t", progress=False)
    (tmp_path / "t" / "glyd.json").unlink()
    with pytest.raises(FormatError, match=r"quant_method 'glyd'\) but glyd\.json is missing"):
        glyd.from_pretrained(tmp_path / "t", device="cpu", progress=False)


def test_subfolder_outside_the_folder_is_refused(tmp_path):
    # An absolute subfolder replaced the folder (Path(p) / "/abs" is "/abs"): a model from elsewhere loaded.
    glyd.save_pretrained(glyd.compress(tiny_flux(), progress=False), tmp_path / "other" / "t", progress=False)
    (tmp_path / "pipe").mkdir()
    for sub in (str(tmp_path / "other" / "t"), "../other/t"):
        with pytest.raises(ValueError, match="must name a folder inside the model folder"):
            glyd.diffusers.from_pretrained(tmp_path / "pipe", subfolder=sub, device="cpu", progress=False)


def test_a_pipeline_folder_without_subfolder_says_to_pass_one(tmp_path):
    # It read "no config.json: not a transformers model folder" (glyd.from_pretrained) or "not a
    # diffusers model folder" (glyd.diffusers.from_pretrained), with no word of subfolder=.
    _pipeline(tiny_flux()).save_pretrained(tmp_path / "pipe")
    for load in (glyd.from_pretrained, glyd.diffusers.from_pretrained):
        with pytest.raises(FormatError, match=r"a diffusers pipeline folder \(model_index\.json\): pass "
                                              r"subfolder= \(transformer, vae\)"):
            load(tmp_path / "pipe", device="cpu", progress=False)


def test_memory_limit_chooses_the_layout_of_a_diffusers_model(tmp_path):
    from glyd.errors import GlydError
    from glyd.hf.memory import WeightsCount

    ref = tiny_flux()
    ref.save_pretrained(tmp_path / "bf16")
    count = WeightsCount.of(ref)
    limit = count.need("fixed12") - 1
    model = glyd.from_pretrained(tmp_path / "bf16", device="cpu", progress=False, memory_limit=limit)
    assert {model.get_submodule(n).packed.layout for n in linears(ref)} == {"dense11"}
    with pytest.raises(GlydError, match="layout fixed12: its weights need"):
        glyd.from_pretrained(tmp_path / "bf16", layout="fixed12", device="cpu", progress=False, memory_limit=limit)
    glyd.compress(ref, memory_limit=count.need("dense11") - 1, progress=False)
    assert {ref.get_submodule(n).packed.layout for n in linears(tiny_flux())} == {"tiered"}


@pytest.mark.parametrize("packed", [False, True])
def test_a_tensor_of_another_shape_is_refused(tmp_path, packed):
    # A norm weight of [1] for [16] was put in place (and broadcast): a wrong model, loaded without a
    # word, from a bf16 folder and from a glyd folder whose glyd.json agreed with the file.
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from glyd.store import sha256_tensor

    folder = tmp_path / "t"
    if packed:
        glyd.save_pretrained(glyd.compress(tiny_flux(), progress=False), folder, progress=False)
    else:
        tiny_flux().save_pretrained(folder)
    f = folder / "diffusion_pytorch_model.safetensors"
    with safe_open(str(f), "pt") as st:
        meta = st.metadata()
    sd = load_file(f)
    key = "single_transformer_blocks.0.attn.norm_k.weight"
    sd[key] = sd[key][:1].clone()
    save_file(sd, f, metadata=meta)
    if packed:
        manifest = json.loads((folder / "glyd.json").read_text())
        manifest["tensors"][key].update(shape=[1], sha256=sha256_tensor(sd[key]))
        (folder / "glyd.json").write_text(json.dumps(manifest))
    with pytest.raises(FormatError, match=rf"tensor '{key}' has shape \[1\], the model's is \[16\]$"):
        glyd.from_pretrained(folder, device="cpu", progress=False)


@pytest.mark.parametrize("edit, why", [
    ({"in_channels": -5}, "RuntimeError: Trying to create tensor with negative dimension"),
    ({"_class_name": "ModelMixin"}, "AttributeError: type object 'ModelMixin' has no attribute 'from_config'"),
    ({"in_channels": None}, "TypeError: empty"),
])
def test_a_config_the_class_cannot_be_built_from_is_one_line(tmp_path, edit, why):
    # A negative width escaped as torch's RuntimeError, _class_name "ModelMixin" as an AttributeError,
    # and torch's TypeError of several lines was quoted whole.
    tiny_flux().save_pretrained(tmp_path / "t")
    cfg = json.loads((tmp_path / "t" / "config.json").read_text())
    (tmp_path / "t" / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(FormatError, match=rf"config\.json: \w+ cannot be built from it \({why}") as info:
        glyd.from_pretrained(tmp_path / "t", device="cpu", progress=False)
    assert "\n" not in str(info.value)


def test_a_bf16_config_with_more_layers_than_tensors_builds_nothing(tmp_path):
    # num_layers 10**30 built blocks until memory ran out before a weight was read (the glyd-folder
    # path bounded the counts; the bf16 one did not). A hook stops the build past 5,000 modules.
    built: list[str] = []

    def hook(module, name, sub):
        if type(sub).__module__.startswith("diffusers."):
            built.append(type(sub).__name__)
            if len(built) > 5000:
                raise MemoryError("more than 5,000 modules built")

    tiny_flux().save_pretrained(tmp_path / "t")
    cfg = json.loads((tmp_path / "t" / "config.json").read_text())
    (tmp_path / "t" / "config.json").write_text(json.dumps({**cfg, "num_layers": 6000}))
    handle = torch.nn.modules.module.register_module_module_registration_hook(hook)
    try:
        with pytest.raises(FormatError, match=r"config\.json: num_layers is 6000, not a count from 0 to \d+ \(the "
                                              r"checkpoint holds \d+ tensors\)"):
            glyd.from_pretrained(tmp_path / "t", device="cpu", progress=False)
    finally:
        handle.remove()
    assert built == []


@pytest.mark.parametrize("text, why", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"weight_map": {}, "weight_map": {"x": "diffusion_pytorch_model.safetensors"}}', "duplicate key 'weight_map'"),
])
def test_a_bf16_index_glyd_cannot_read_is_one_line(tmp_path, text, why):
    # json.loads raised RecursionError out of glyd.from_pretrained; a duplicate key took the last weight_map
    tiny_flux().save_pretrained(tmp_path / "t")
    index = tmp_path / "t" / "diffusion_pytorch_model.safetensors.index.json"
    index.write_text(text)
    with pytest.raises(FormatError, match=rf"index\.json: not a safetensors index \(JSON with a weight_map\) \({why}\)$"):
        glyd.from_pretrained(tmp_path / "t", device="cpu", progress=False)


def test_a_huge_bf16_index_is_not_read_whole(tmp_path):
    # the index was read into memory whole however large (a sparse 64 MiB + 1 file, then "not a safetensors
    # index (JSON with a weight_map) (Expecting value...)"); now refused by its size, as glyd fit's config.json
    tiny_flux().save_pretrained(tmp_path / "t")
    with open(tmp_path / "t" / "diffusion_pytorch_model.safetensors.index.json", "wb") as f:
        f.truncate((64 << 20) + 1)
    with pytest.raises(FormatError, match=r"index\.json: 67,108,865 bytes, too large for a safetensors index "
                                          r"\(at most 67,108,864\)$"):
        glyd.from_pretrained(tmp_path / "t", device="cpu", progress=False)


def test_a_huge_config_is_not_read_whole(tmp_path):
    # the diffusers check of glyd.from_pretrained read config.json whole however large (a sparse 64 MiB
    # + 1 file: read into memory, then taken for no config); now refused by its size, as the index is
    from glyd.diffusers._detect import folder_config, wants_diffusers

    tiny_flux().save_pretrained(tmp_path / "t")
    with open(tmp_path / "t" / "config.json", "wb") as f:
        f.write(b"{}")
        f.truncate((64 << 20) + 1)  # the store's MAX_JSON_FILE_BYTES, and one byte
    match = r"t/config\.json: 67,108,865 bytes, too large for a config\.json \(at most 67,108,864\)$"
    with pytest.raises(FormatError, match=match):
        folder_config(tmp_path / "t")
    with pytest.raises(FormatError, match=match):
        wants_diffusers(tmp_path, subfolder="t")
    with pytest.raises(FormatError, match=match):
        glyd.from_pretrained(tmp_path / "t", model_class="FluxTransformer2DModel", device="cpu", progress=False)
    assert folder_config(tmp_path / "none") == {}  # missing: still {}
