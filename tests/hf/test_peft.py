"""LoRA (PEFT) on packed models: the base stays packed, training with exact=True takes bf16's steps
bit for bit, merging gives bf16's merged model bit for bit, adapters save and load onto a packed
base, and what is not supported is refused by name."""

from __future__ import annotations

import copy
import importlib
import sys

import pytest
import torch

peft = pytest.importorskip("peft")

import glyd  # noqa: E402
from glyd.errors import MissingDependencyError, UnsupportedError  # noqa: E402
from glyd.hf import peft as glyd_peft  # noqa: E402
from glyd.nn import GlydEmbedding, GlydLinear, GlydLinearPart, GlydTiedLinear  # noqa: E402

from tiny_models import VOCAB  # noqa: E402

transformers = pytest.importorskip("transformers")

PACKED = (GlydLinear, GlydLinearPart, GlydEmbedding, GlydTiedLinear)
TARGETS = ["q_proj", "k_proj", "v_proj", "down_proj"]


def _config(**kw) -> peft.LoraConfig:
    return peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(TARGETS), **kw)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _ids() -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))


def _train(model, steps: int = 5) -> torch.Tensor:
    """``steps`` AdamW steps on one batch; the float32 losses."""
    ids = _ids()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().float())
    return torch.stack(losses)


def _lora(model) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.named_parameters() if v.requires_grad}


def _pair(folder, *, merge: bool = False, **config):
    """(LoRA on the packed model, LoRA on the bf16 model): same seed, same adapters."""
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    packed = glyd.from_pretrained(folder, exact=True, device="cpu", merge=merge, progress=False)
    torch.manual_seed(1)
    pm = glyd_peft.get_peft_model(packed, _config(**config))
    torch.manual_seed(1)
    pr = peft.get_peft_model(ref, _config(**config))
    return pm, pr


@pytest.fixture(scope="module")
def trained(tiny_model_folder):
    """Qwen2 (biases on q, k, v): 5 AdamW steps of LoRA on the packed and on the bf16 model."""
    pm, pr = _pair(tiny_model_folder("qwen2"))
    return pm, pr, _train(pm), _train(pr)


def test_base_stays_packed_and_only_lora_trains(trained):
    pm, pr, _, _ = trained
    layer = pm.base_model.model.model.layers[0]
    assert type(layer.self_attn.q_proj).__name__ == "GlydLoraLinear"
    assert isinstance(layer.self_attn.q_proj.base_layer, GlydLinear)
    assert isinstance(layer.mlp.gate_proj, GlydLinear)  # not targeted: as it was
    assert isinstance(pm.base_model.model.model.embed_tokens, GlydEmbedding)
    trainable = _lora(pm)
    assert trainable and all(".lora_A." in k or ".lora_B." in k for k in trainable)
    assert sorted(trainable) == sorted(_lora(pr))


def test_training_equals_bf16_bit_for_bit(trained):
    pm, pr, losses, ref_losses = trained
    assert _same(losses, ref_losses), (losses, ref_losses)
    assert not torch.equal(losses[0], losses[-1])  # the steps did move the adapters
    a, b = _lora(pm), _lora(pr)
    assert all(_same(a[k], b[k]) for k in b)


def test_forward_backward_fused_path():
    # exact=False: the forward is glyd::linear, the backward its autograd (grad @ unpacked W).
    torch.manual_seed(0)
    w = (torch.randn(24, 16) * 0.02).to(torch.bfloat16)
    b = torch.zeros(24, dtype=torch.bfloat16)  # PEFT wants a model with a parameter somewhere
    net = torch.nn.Sequential(glyd.GlydLinear(glyd.pack(w), b), torch.nn.ReLU(), glyd.GlydLinear(glyd.pack(w.T.contiguous())))
    pm = glyd_peft.get_peft_model(net, peft.LoraConfig(r=2, target_modules=["0", "2"], init_lora_weights=False))
    x = torch.randn(3, 5, 16, dtype=torch.bfloat16, requires_grad=True)
    pm(x).float().square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in _lora(pm).values())
    assert all(isinstance(pm.base_model.model[i].base_layer, GlydLinear) for i in (0, 2))


def test_merge_and_unload_equals_bf16_bit_for_bit(trained):
    pm, pr, _, _ = trained
    pm, pr = copy.deepcopy(pm), copy.deepcopy(pr)
    ref = pr.merge_and_unload().state_dict()
    partly = copy.deepcopy(pm).merge_and_unload()  # PEFT's own: adapted layers bf16, the rest packed
    q = partly.model.layers[0].self_attn.q_proj
    assert type(q) is torch.nn.Linear and _same(q.weight, ref["model.layers.0.self_attn.q_proj.weight"])
    assert isinstance(partly.model.layers[0].mlp.gate_proj, GlydLinear)
    full = glyd_peft.merge_and_unload(pm)
    assert not any(isinstance(m, PACKED) for m in full.modules())
    sd = full.state_dict()
    assert sorted(sd) == sorted(ref)
    assert all(_same(sd[k], ref[k]) for k in ref)


def test_unmerge_restores_the_packed_layer(trained):
    pm = copy.deepcopy(trained[0])
    lora = pm.base_model.model.model.layers[0].self_attn.v_proj
    before = {k: v.clone() for k, v in lora.base_layer.state_dict().items()}
    pm.merge_adapter()
    assert type(lora.base_layer) is torch.nn.Linear
    pm.unmerge_adapter()
    assert isinstance(lora.base_layer, GlydLinear)
    after = lora.base_layer.state_dict()
    assert sorted(after) == sorted(before) and all(torch.equal(after[k], before[k]) for k in before)


def test_adapter_saves_and_loads_onto_a_packed_base(trained, tiny_model_folder, tmp_path):
    pm, pr, _, _ = trained
    pm.save_pretrained(tmp_path / "adapter")
    assert not any("glyd" in k for k in peft.utils.load_peft_weights(str(tmp_path / "adapter")))
    glyd.save_pretrained(glyd.from_pretrained(tiny_model_folder("qwen2"), device="cpu", progress=False),
                         tmp_path / "packed")
    base = glyd.from_pretrained(tmp_path / "packed", exact=True, device="cpu")
    loaded = glyd_peft.from_pretrained(base, tmp_path / "adapter")
    assert isinstance(loaded.base_model.model.model.layers[1].self_attn.k_proj.base_layer, GlydLinear)
    ids = _ids()
    with torch.no_grad():
        out, ref = loaded(input_ids=ids).logits, pr(input_ids=ids).logits
    assert _same(out, ref)


@pytest.mark.slow
def test_training_on_merged_products_equals_bf16(tiny_model_folder):
    # q|k|v and gate|up as one packed product each (a GPU's default): LoRA on the parts.
    pm, pr = _pair(tiny_model_folder("llama"), merge=True, bias="lora_only")
    assert isinstance(pm.base_model.model.model.layers[0].self_attn.q_proj.base_layer, GlydLinearPart)
    assert _same(_train(pm), _train(pr))
    a, b = _lora(pm), _lora(pr)
    assert sorted(a) == sorted(b) and all(_same(a[k], b[k]) for k in b)
    sd, ref = glyd_peft.merge_and_unload(pm).state_dict(), pr.merge_and_unload().state_dict()
    assert sorted(sd) == sorted(ref) and all(_same(sd[k], ref[k]) for k in ref)


def test_all_linear_finds_the_packed_linears(tiny_model_folder):
    model = glyd.from_pretrained(tiny_model_folder("llama"), device="cpu", merge=True, progress=False)
    pm = glyd_peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules="all-linear"))
    names = {n.rsplit(".", 1)[-1] for n, m in pm.named_modules() if type(m).__name__ == "GlydLoraLinear"}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert isinstance(pm.base_model.model.lm_head, GlydTiedLinear)  # the output head is left out, as PEFT does


@pytest.mark.parametrize("what, config, match", [
    ("embedding", dict(target_modules=["embed_tokens"]), "packed embedding"),
    ("tied head", dict(target_modules=["lm_head"]), "tied to the packed embedding"),
    ("merged product", dict(target_modules=["qkv_proj"]), "merged packed product"),
    ("dora", dict(target_modules=["q_proj"], use_dora=True), "use_dora"),
])
def test_unsupported_is_refused_by_name(tiny_model_folder, what, config, match):
    model = glyd.from_pretrained(tiny_model_folder("llama"), device="cpu", merge=True, progress=False)
    with pytest.raises(UnsupportedError, match=match):
        glyd_peft.get_peft_model(model, peft.LoraConfig(r=2, **config))


def test_register_takes_only_lora():
    with pytest.raises(UnsupportedError, match="LoraConfig"):
        glyd_peft.register(peft.IA3Config(target_modules=["q_proj"]))


def test_without_register_peft_refuses_the_packed_layer():
    w, b = torch.randn(4, 4).to(torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16)
    net = torch.nn.Sequential(glyd.GlydLinear(glyd.pack(w), b))
    with pytest.raises(ValueError, match="GlydLinear.*not supported"):
        peft.get_peft_model(net, peft.LoraConfig(r=2, target_modules=["0"]))


def test_without_peft_the_module_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` now fails
    monkeypatch.delitem(sys.modules, "glyd.hf.peft")
    try:
        with pytest.raises(MissingDependencyError, match=r"glyd-lossless\[peft\]"):
            importlib.import_module("glyd.hf.peft")
    finally:
        monkeypatch.undo()
    assert importlib.import_module("glyd.hf.peft") is glyd_peft


def test_unmerge_with_lora_bias_gives_back_the_packed_bias_bit_for_bit(tiny_model_folder):
    # lora_bias=True: PEFT's merge adds B's bias to the base bias in place and its unmerge subtracts
    # it again, which in bf16 does not round back; the packed layer's own bias must stay untouched.
    model = glyd.from_pretrained(tiny_model_folder("qwen2"), exact=True, device="cpu", progress=False)
    pm = glyd_peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_bias=True))
    lora = pm.base_model.model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        lora.lora_B["default"].bias.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(0))
    before = lora.base_layer.bias.detach().clone()
    pm.merge_adapter()
    assert not _same(lora.base_layer.bias, before)  # the merged bf16 layer carries the adapter's bias
    pm.unmerge_adapter()
    assert isinstance(lora.base_layer, GlydLinear) and _same(lora.base_layer.bias, before)


@pytest.mark.parametrize("config, match", [
    (dict(modules_to_save=["embed_tokens"]), r"modules_to_save.*'model\.embed_tokens'"),
    (dict(modules_to_save=["lm_head"]), r"modules_to_save.*'lm_head'"),
    (dict(modules_to_save=["down_proj"]), r"modules_to_save.*'model\.layers\.0\.mlp\.down_proj'"),
    (dict(modules_to_save=["mlp"]), r"modules_to_save.*'model\.layers\.0\.mlp'"),
    (dict(task_type="SEQ_CLS"), r"modules_to_save.*'score'"),
    (dict(trainable_token_indices=[5, 6]), r"trainable_token_indices.*'model\.embed_tokens'"),
    (dict(trainable_token_indices={"embed_tokens": [5]}), r"trainable_token_indices.*'model\.embed_tokens'"),
])
def test_packed_modules_to_save_or_trainable_tokens_are_refused(tiny_model_folder, config, match):
    # A packed module holds its weight in buffers: as PEFT's trainable copy it trained nothing, silently,
    # and the saved adapter carried the whole packed weight; trainable tokens raised a TypeError.
    if config.get("task_type") == "SEQ_CLS":
        model = glyd.compress(transformers.AutoModelForSequenceClassification.from_pretrained(
            tiny_model_folder("llama"), dtype=torch.bfloat16, num_labels=2), progress=False)
    else:
        model = glyd.from_pretrained(tiny_model_folder("llama"), device="cpu", progress=False)
    with pytest.raises(UnsupportedError, match=match):
        glyd_peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"], **config))
    assert not any(type(m).__name__ == "GlydLoraLinear" for m in model.modules())  # refused before any change


def test_adapter_with_packed_modules_to_save_is_refused_on_load(tiny_model_folder, tmp_path):
    bf16 = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_folder("llama"), dtype=torch.bfloat16)
    peft.get_peft_model(bf16, peft.LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["down_proj"])
                        ).save_pretrained(tmp_path / "adapter")
    model = glyd.from_pretrained(tiny_model_folder("llama"), device="cpu", progress=False)
    with pytest.raises(UnsupportedError, match=r"modules_to_save.*down_proj"):
        glyd_peft.from_pretrained(model, tmp_path / "adapter")


def test_a_failed_merge_leaves_the_packed_layer_in_place(tiny_model_folder):
    # safe_merge=True refuses a broken adapter; the packed base had already been swapped for its bf16
    # copy and stayed swapped (the layer reported merged=False over an unpacked base).
    model = glyd.from_pretrained(tiny_model_folder("llama"), exact=True, device="cpu", progress=False)
    pm = glyd_peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    lora = pm.base_model.model.model.layers[0].self_attn.q_proj
    packed = lora.base_layer
    with torch.no_grad():
        lora.lora_B["default"].weight.fill_(float("inf"))
    with pytest.raises(ValueError, match="NaNs detected"):
        lora.merge(safe_merge=True)
    assert lora.base_layer is packed and not lora.merged and "_glyd_packed" not in lora.__dict__


def test_dequantize_while_merged_then_unmerge_stays_plain(tiny_model_folder):
    # The packed layer parked by merge came back on unmerge, into a model dequantize had made plain.
    from glyd.hf.dequantize import dequantize

    model = glyd.from_pretrained(tiny_model_folder("llama"), exact=True, device="cpu", progress=False)
    want = model.model.layers[0].self_attn.q_proj._unpack()
    pm = glyd_peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    pm.merge_adapter()
    dequantize(pm.base_model.model)
    pm.unmerge_adapter()
    assert not any(isinstance(m, PACKED) for m in pm.modules())
    base = pm.base_model.model.model.layers[0].self_attn.q_proj.base_layer
    assert type(base) is torch.nn.Linear and _same(base.weight, want)


def test_merge_and_unload_keeps_tied_embeddings_tied(tiny_model_folder, tmp_path):
    # PEFT's merge_and_unload compares lm_head.weight.data_ptr() with the embedding's; a packed weight
    # unpacked anew for each, so PEFT set tie_word_embeddings=False: the glyd folder saved from it
    # then failed to load (lm_head.weight missing), and the bf16 model claimed untied embeddings.
    model = glyd.from_pretrained(tiny_model_folder("llama"), exact=True, device="cpu", progress=False)
    assert model.config.tie_word_embeddings
    # data_ptr() names the packed storage: the same for the tied pair, apart for two matrices of one shape
    # (unpacked anew, both were whatever address the allocator gave, often the same freed block)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    downs = [layer.mlp.down_proj.weight for layer in model.model.layers]
    assert downs[0].data_ptr() != downs[1].data_ptr()
    partly = glyd_peft.get_peft_model(model, _config()).merge_and_unload()
    assert partly.config.tie_word_embeddings and isinstance(partly.lm_head, GlydTiedLinear)
    partly.save_pretrained(tmp_path / "partly")
    again = glyd.from_pretrained(tmp_path / "partly", exact=True, device="cpu", progress=False)
    ids = _ids()
    with torch.no_grad():
        assert _same(again(input_ids=ids).logits, partly(input_ids=ids).logits)
    model = glyd.from_pretrained(tiny_model_folder("llama"), exact=True, device="cpu", progress=False)
    full = glyd_peft.merge_and_unload(glyd_peft.get_peft_model(model, _config()))
    assert full.config.tie_word_embeddings and full.lm_head.weight is full.model.embed_tokens.weight
