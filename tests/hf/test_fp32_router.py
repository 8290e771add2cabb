"""Encoder-decoder mixtures of experts whose router transformers runs in float32: Switch Transformers
and NLLB-MoE, tiny and random in bf16. Each router sets ``self.dtype = config.router_dtype`` (float32)
and casts its ``classifier`` (an ``nn.Linear``) to it before each product: glyd packed it, and the
float32 product then met a bf16 packed weight. Now the routers stay ``nn.Linear`` as transformers
holds them, the experts (one ``nn.Linear`` pair each) are packed; exact logits equal bf16's bit for
bit through ``from_pretrained``, ``compress``, save, reload, ``glyd pack``, unpack and dequantize, and
the memory count is what is packed.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from torch import nn

import glyd
from glyd.hf.memory import WeightsCount, count_weights
from glyd.hf.pack_plan import packed_weights
from glyd.nn.modules import GlydLinear
from glyd.store import unpack_folder
from glyd.store._safetensors import read_header

transformers = pytest.importorskip("transformers")

VOCAB = 320
FAMILIES = ("switch_transformers", "nllb_moe")
IDS = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
DECODER_IDS = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))


def _config(family: str):
    moe = dict(vocab_size=VOCAB, d_model=64, num_experts=4, expert_capacity=16, encoder_sparse_step=1,
               decoder_sparse_step=1)
    if family == "switch_transformers":
        return transformers.SwitchTransformersConfig(**moe, d_kv=16, d_ff=96, num_layers=2, num_decoder_layers=2,
                                                     num_heads=4, decoder_start_token_id=0, pad_token_id=0,
                                                     eos_token_id=1)
    return transformers.NllbMoeConfig(**moe, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                      decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96,
                                      max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                      decoder_start_token_id=2)


def tiny(family: str) -> nn.Module:
    """The family's bf16 model, random weights with a wide spread (the routers pick several experts)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(_config(family))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 or name.endswith("bias"):
                p.normal_(0.0, 0.3)
            else:
                p.copy_(1.0 + 0.05 * torch.randn_like(p))
    return model.to(torch.bfloat16).eval()


def _bits(t: torch.Tensor) -> torch.Tensor:
    assert t.dtype == torch.bfloat16
    return t.view(torch.int16)


def logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return _bits(model(input_ids=IDS, decoder_input_ids=DECODER_IDS).logits)


def routers(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if n.endswith("router.classifier")}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp32_router")
    for family in FAMILIES:
        tiny(family).save_pretrained(root / family)
    return {f: root / f for f in FAMILIES}


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param


def _ref(folder):
    return transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.bfloat16).eval()


def assert_routers_kept(model: nn.Module, ref: nn.Module) -> None:
    """Every router a plain nn.Linear holding the reference's values, float32 once the model has run (as
    transformers' own, which its router casts), and every expert packed."""
    got, want = routers(model), routers(ref)
    assert set(got) == set(want) and len(got) == 4
    for name, m in got.items():
        assert type(m) is nn.Linear, name
        assert m.weight.dtype == torch.float32 and want[name].weight.dtype == torch.float32, name
        assert torch.equal(m.weight, want[name].weight), name
    experts = [m for n, m in model.named_modules()
               if ".experts.expert_" in n and n.endswith(("wi", "wo", "fc1", "fc2"))]
    assert len(experts) == 4 * 4 * 2 and all(isinstance(m, GlydLinear) for m in experts)


def test_the_routers_are_kept_as_the_model_runs_them(family):
    from glyd.hf._model import kept_unpacked

    model = tiny(family)
    kept = kept_unpacked(model)
    assert set(routers(model)) <= kept and not any(".experts." in n or "attn" in n for n in kept)
    assert not any(n.startswith(tuple(routers(model))) for n in [w[: -len(".weight")] for w in packed_weights(model)])


def test_bf16_folder_loads_with_exact_logits(folders, family):
    ref = _ref(folders[family])
    model = glyd.from_pretrained(folders[family], exact=True, device="cpu", progress=False)
    assert torch.equal(logits(model), logits(ref))
    assert_routers_kept(model, ref)
    assert torch.equal(model.generate(input_ids=IDS, max_new_tokens=4, do_sample=False),
                       ref.generate(input_ids=IDS, max_new_tokens=4, do_sample=False))


def test_compress_is_exact_and_keeps_the_routers(folders, family):
    ref = _ref(folders[family])
    want = logits(ref)  # its routers now float32: compress must leave them so
    model = glyd.compress(_ref(folders[family]), exact=True, progress=False)
    assert torch.equal(logits(model), want)
    assert_routers_kept(model, ref)
    again = glyd.compress(ref, exact=True, progress=False)  # a model that has run: float32 routers kept
    assert torch.equal(logits(again), want)


def test_save_load_verify_unpack_and_dequantize_bit_for_bit(folders, family, tmp_path):
    ref = _ref(folders[family])
    want = logits(ref)
    model = glyd.from_pretrained(folders[family], exact=True, device="cpu", progress=False)
    out = glyd.save_pretrained(model, tmp_path / "glyd", progress=False)
    assert glyd.verify(out, progress=False)["packed"] == sum(1 for _ in glyd.hf.experts.packed_tensors(model))
    stored = read_header(out / "model.safetensors").tensors
    assert all(f"{n}.weight" in stored for n in routers(model))  # as they are, not packed
    for loaded in (glyd.from_pretrained(out, exact=True, verify=True, device="cpu", progress=False),
                   glyd.from_pretrained(glyd.save_pretrained(glyd.compress(_ref(folders[family]), progress=False),
                                                             tmp_path / "c", progress=False),
                                        exact=True, verify=True, device="cpu", progress=False)):
        assert torch.equal(logits(loaded), want)
        assert_routers_kept(loaded, ref)
    unpack_folder(out, tmp_path / "bf16", progress=False)
    bf16 = tiny(family).state_dict()
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        for k in f.keys():
            assert torch.equal(_bits(f.get_tensor(k)), _bits(bf16[k])), k
    plain = glyd.from_pretrained(out, device="cpu", progress=False).dequantize()
    assert not any(isinstance(m, GlydLinear) for m in plain.modules())
    assert torch.equal(logits(plain), want)


def test_glyd_pack_leaves_the_routers(folders, family, tmp_path):
    from glyd.cli import main

    ref = _ref(folders[family])
    assert main(["pack", str(folders[family]), str(tmp_path / "packed"), "--layout", "fixed12"]) == 0
    model = glyd.from_pretrained(tmp_path / "packed", exact=True, verify=True, device="cpu", progress=False)
    assert torch.equal(logits(model), logits(ref))
    assert_routers_kept(model, ref)


def test_the_count_is_what_is_packed(folders, family):
    ref = _ref(folders[family])
    model = glyd.from_pretrained(folders[family], layout="fixed12", device="cpu", progress=False)
    shapes = [tuple(p.shape) for _, _, p, _ in glyd.hf.experts.packed_tensors(model)]
    assert (4, 64) not in shapes and (64, 4) not in shapes  # the routers' [experts, d_model] stay apart
    count = WeightsCount.of(ref)
    assert count.packable == sum(a * b for a, b in shapes)
    assert count.other_bytes == sum(t.nbytes for t in model.parameters())
    with torch.device("meta"):
        empty = transformers.AutoModelForSeq2SeqLM.from_config(_config(family))
    assert WeightsCount.of(empty, stored=read_header(folders[family] / "model.safetensors").tensors) == count
    # glyd fit's count (it builds causal LMs only, so it refuses these folders): the routers unpacked
    params, packable, unpacked = count_weights(empty, read_header(folders[family] / "model.safetensors").tensors)
    assert packable == count.packable and unpacked["Linear"] == 4 * 4 * 64  # four routers, [4 experts, 64]


def test_transformers_loads_the_glyd_folder_with_the_routers_as_they_are(folders, family, tmp_path):
    from glyd.nn import set_exact

    ref = _ref(folders[family])
    out = glyd.save_pretrained(glyd.from_pretrained(folders[family], device="cpu", progress=False), tmp_path / "glyd",
                               progress=False)
    loaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    set_exact(loaded, True)
    assert torch.equal(logits(loaded), logits(ref))
    assert_routers_kept(loaded, ref)


def test_a_folder_with_a_packed_router_is_refused_in_one_line(folders, tmp_path, monkeypatch):
    # a folder packed before glyd kept the routers: its float32 products would meet a packed bf16 weight
    import glyd.hf.packer

    monkeypatch.setattr(glyd.hf.packer, "kept_unpacked", lambda model: frozenset())
    model = glyd.from_pretrained(folders["nllb_moe"], device="cpu", progress=False)
    assert isinstance(model.model.encoder.layers[0].ffn.router.classifier, GlydLinear)
    out = glyd.save_pretrained(model, tmp_path / "old", progress=False)
    monkeypatch.undo()
    with pytest.raises(glyd.UnsupportedError, match=r"packed tensor 'model\.\w+\.layers\.0\.ffn\.router\.classifier"
                                                    r"\.weight' belongs to a module the model runs in float32") as e:
        glyd.from_pretrained(out, device="cpu", progress=False)
    assert "\n" not in str(e.value)
