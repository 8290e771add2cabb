"""glyd.from_pretrained / compress / save_pretrained / verify on tiny bf16 models (CPU)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import glyd
from glyd.errors import CorruptError, FormatError
from glyd.nn import GlydEmbedding, GlydLinear, GlydLinearPart, GlydTiedLinear
from glyd import ops as _ops
from glyd.store import MANIFEST, CheckpointReader, key_for
from glyd.store._safetensors import read_header

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from tiny_models import TINY_FAMILIES, build_tiny_model  # noqa: E402


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def bf16_logits(folder, ids):
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    with torch.no_grad():
        return ref(ids).logits


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture
def count_packs(monkeypatch):
    """Counts every matrix glyd packs (through glyd.ops._pack, which every packing path uses)."""
    calls = []
    real = _ops._pack

    def spy(w, layout):
        calls.append(tuple(w.shape))
        return real(w, layout)

    monkeypatch.setattr(_ops, "_pack", spy)
    return calls


@pytest.mark.parametrize("family", [*TINY_FAMILIES, "gemma3"])
@pytest.mark.parametrize("merge", [False, True])
def test_exact_logits_equal_bf16_bit_for_bit(tiny_model_folder, input_ids, family, merge):
    src = tiny_model_folder(family)
    model = glyd.from_pretrained(src, exact=True, merge=merge, device="cpu", progress=False)
    assert any(isinstance(m, GlydLinearPart) for m in model.modules()) == merge
    assert isinstance(model.get_input_embeddings(), GlydEmbedding)
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert torch.equal(bits(logits(model, input_ids)), bits(bf16_logits(src, input_ids)))


@pytest.mark.parametrize("layout", ["fixed12", "tiered", "auto"])
def test_default_mode_is_close_to_bf16(tiny_model_folder, input_ids, layout):
    src = tiny_model_folder("qwen2")
    model = glyd.from_pretrained(src, layout=layout, device="cpu", progress=False)
    ref = bf16_logits(src, input_ids).float()
    got = logits(model, input_ids).float()
    # The fused path may sum in another order than cuBLAS/CPU bf16: a few bf16 ulps of the logits.
    assert (got - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95
    if layout != "auto":
        assert {m.layout for m in model.modules() if isinstance(m, (GlydLinear, GlydEmbedding))} == {layout}


def test_generate_equals_bf16_greedy(tiny_model_folder, input_ids):
    src = tiny_model_folder("llama")
    model = glyd.from_pretrained(src, exact=True, device="cpu", progress=False)
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    prompt = input_ids[:, :5]
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(prompt, **kw), ref.generate(prompt, **kw))


def test_tied_embeddings_are_packed_once(tiny_model_folder, count_packs, tmp_path):
    src = tiny_model_folder("llama")  # tie_word_embeddings=True
    model = glyd.from_pretrained(src, device="cpu", merge=False, progress=False)
    assert isinstance(model.lm_head, GlydTiedLinear)
    assert model.lm_head.source is model.get_input_embeddings()
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    assert count_packs.count((vocab, hidden)) == 1
    n_linear = 7 * model.config.num_hidden_layers
    assert len(count_packs) == n_linear + 1
    out = glyd.save_pretrained(model, tmp_path / "g", progress=False)
    names = CheckpointReader(out).names()
    assert "model.embed_tokens.weight" in names and not any(n.startswith("lm_head") for n in names)


def test_untied_lm_head_is_packed(tiny_model_folder):
    model = glyd.from_pretrained(tiny_model_folder("mistral"), device="cpu", progress=False)
    assert isinstance(model.lm_head, GlydLinear)


def test_compress_keeps_an_lm_head_untied_from_a_config_that_ties(tiny_model_folder, input_ids):
    # The config says tie_word_embeddings, but this loaded model's lm_head has a weight of its own
    # (untied after loading, or a head trained apart): compress replaced it by the embedding's,
    # silently other logits.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_folder("llama"), dtype=torch.bfloat16)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() * 2)
    ref = logits(model, input_ids)
    glyd.compress(model, layout="fixed12", exact=True, progress=False)
    assert isinstance(model.lm_head, GlydLinear) and torch.equal(bits(logits(model, input_ids)), bits(ref))


def test_save_then_load_packs_nothing_again(tiny_model_folder, input_ids, tmp_path, monkeypatch):
    src = tiny_model_folder("qwen2")
    model = glyd.from_pretrained(src, exact=True, device="cpu", progress=False)
    before = logits(model, input_ids)
    out = glyd.save_pretrained(model, tmp_path / "qwen2-glyd", progress=False)
    files = {p.name for p in out.iterdir()}
    assert {MANIFEST, "config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json"} <= files
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "glyd"
    assert cfg["quantization_config"]["format_version"] == 1

    def no_pack(*a, **k):
        raise AssertionError("a glyd folder must load without packing")

    monkeypatch.setattr(_ops, "_pack", no_pack)
    for name, lay in list(glyd.codec.LAYOUTS.items()):
        monkeypatch.setitem(glyd.codec.LAYOUTS, name, dataclasses.replace(lay, pack=no_pack))
    again = glyd.from_pretrained(out, exact=True, device="cpu", verify=True, progress=False)
    assert torch.equal(bits(logits(again, input_ids)), bits(before))
    # Every packed module holds exactly the arrays of the file.
    r = CheckpointReader(out)
    emb = again.get_input_embeddings()
    stored = r.get("model.embed_tokens.weight")
    for a, t in stored.arrays.items():
        assert torch.equal(getattr(emb, "weight_glyd_" + a), t)


def test_saving_twice_refuses_to_overwrite(tiny_model_folder, tmp_path):
    model = glyd.from_pretrained(tiny_model_folder("llama"), device="cpu", progress=False)
    out = glyd.save_pretrained(model, tmp_path / "m", progress=False)
    with pytest.raises(glyd.DestinationExistsError):
        glyd.save_pretrained(model, out, progress=False)
    glyd.save_pretrained(model, out, overwrite=True, progress=False)


@pytest.mark.parametrize("saved_merged", [False, True])
def test_load_in_the_other_merge_form(tiny_model_folder, input_ids, tmp_path, saved_merged):
    src = tiny_model_folder("qwen2")
    ref = bf16_logits(src, input_ids)
    model = glyd.from_pretrained(src, exact=True, merge=saved_merged, device="cpu", progress=False)
    out = glyd.save_pretrained(model, tmp_path / "m", progress=False)
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert ("merged" in cfg) == saved_merged
    other = glyd.from_pretrained(out, exact=True, merge=not saved_merged, device="cpu", progress=False)
    assert any(isinstance(m, GlydLinearPart) for m in other.modules()) == (not saved_merged)
    assert torch.equal(bits(logits(other, input_ids)), bits(ref))
    glyd.verify(other, progress=False)


def _flip_bit(shard, key, byte=3, bit=2):
    info = read_header(shard).tensors[key]
    with open(shard, "r+b") as f:
        f.seek(read_header(shard).data_start + info.begin + byte)
        b = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([b ^ (1 << bit)]))


@pytest.mark.parametrize("array", ["lo", "code"])
def test_verify_names_the_tensor_with_a_flipped_bit(tiny_model_folder, tmp_path, array):
    model = glyd.from_pretrained(tiny_model_folder("llama"), layout="fixed12", device="cpu", progress=False)
    out = glyd.save_pretrained(model, tmp_path / "m", progress=False)
    glyd.verify(out, progress=False)  # intact
    name = "model.layers.1.mlp.down_proj.weight"
    _flip_bit(out / "model.safetensors", key_for(name, array))
    with pytest.raises(CorruptError, match=name.replace(".", r"\.")):
        glyd.verify(out, progress=False)
    with pytest.raises(CorruptError, match=name.replace(".", r"\.")):
        glyd.from_pretrained(out, verify=True, device="cpu", progress=False)


def test_verify_true_checks_bytes_that_unpacking_ignores(tiny_model_folder, tmp_path):
    # A flipped padding column (K = 96 is stored as 128) decodes no weight, so unpacking alone once
    # let it through (a fused kernel reads it: inf there made products NaN); the padding is checked
    # when the matrix is first read, and verify=True names the stored array by its sha256.
    model = glyd.from_pretrained(tiny_model_folder("llama"), layout="fixed12", device="cpu", progress=False)
    out = glyd.save_pretrained(model, tmp_path / "m", progress=False)
    name = "model.layers.0.mlp.down_proj.weight"
    assert CheckpointReader(out).entry(name)["shape"] == [64, 96]
    _flip_bit(out / "model.safetensors", key_for(name, "lo"), byte=100)
    loaded = glyd.from_pretrained(out, device="cpu", progress=False)  # verify=False: no hashes
    with pytest.raises(CorruptError, match="padding columns 96..127"):
        _ops.unpack(loaded.model.layers[0].mlp.down_proj.packed)
    for check in (lambda: glyd.verify(out, progress=False),
                  lambda: glyd.from_pretrained(out, verify=True, device="cpu", progress=False)):
        named = rf"{name.replace('.', '[.]')}'.*(stored array 'lo'|padding columns 96..127)"
        with pytest.raises(CorruptError, match=named):
            check()


def test_verify_names_a_damaged_raw_tensor(tiny_model_folder, tmp_path):
    model = glyd.from_pretrained(tiny_model_folder("llama"), device="cpu", progress=False)
    out = glyd.save_pretrained(model, tmp_path / "m", progress=False)
    _flip_bit(out / "model.safetensors", "model.norm.weight", byte=0, bit=0)
    with pytest.raises(CorruptError, match=r"model\.norm\.weight"):
        glyd.from_pretrained(out, verify=True, device="cpu", progress=False)


def test_verify_of_a_model_in_memory(tiny_model_folder):
    model = glyd.from_pretrained(tiny_model_folder("mistral"), device="cpu", progress=False)
    counts = glyd.verify(model, progress=False)
    assert counts["packed"] == 7 * 2 + 2
    lin = model.model.layers[0].self_attn.o_proj
    lin.weight_glyd_lo[0, 0] ^= 1
    with pytest.raises(CorruptError, match=r"model\.layers\.0\.self_attn\.o_proj\.weight"):
        glyd.verify(model, progress=False)


@pytest.mark.parametrize("merge", [False, True])
def test_compress_in_place(tiny_model_folder, input_ids, tmp_path, merge):
    src = tiny_model_folder("gemma")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    ref = logits(model, input_ids)
    assert glyd.compress(model, layout="tiered", merge=merge, exact=True, progress=False) is model
    assert isinstance(model.lm_head, GlydTiedLinear)
    assert torch.equal(bits(logits(model, input_ids)), bits(ref))
    out = glyd.save_pretrained(model, tmp_path / "g", progress=False)
    assert (out / "tokenizer_config.json").is_file()  # copied from the folder the model came from
    glyd.verify(out, progress=False)
    with pytest.raises(ValueError, match="already packed"):
        glyd.compress(model)


def test_memory_of_the_packed_model(tiny_model_folder):
    src = tiny_model_folder("mistral")
    model = glyd.from_pretrained(src, layout="tiered", device="cpu", progress=False)
    packed = sum(m.packed_nbytes for m in model.modules() if isinstance(m, (GlydLinear, GlydEmbedding)))
    weights = sum(m.packed.numel for m in model.modules() if isinstance(m, (GlydLinear, GlydEmbedding)))
    assert packed < 2 * weights  # below 16 bits a weight even on tiny random matrices


# -- bad inputs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,name", [(torch.float32, "float32"), (torch.float16, "float16")])
def test_a_model_that_is_not_bf16_gets_a_clear_error(tmp_path, dtype, name):
    src = build_tiny_model("llama", tmp_path / "m", dtype=dtype)
    with pytest.raises(FormatError, match=rf"{name}.*bf16 models only"):
        glyd.from_pretrained(src, device="cpu", progress=False)


def test_a_folder_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(FormatError, match="config.json"):
        glyd.from_pretrained(tmp_path, device="cpu", progress=False)
    with pytest.raises(FormatError, match="no such model folder"):
        glyd.from_pretrained(tmp_path / "absent", device="cpu", progress=False)
    with pytest.raises(FormatError, match="not a folder"):
        glyd.from_pretrained(tmp_path / "notes.txt", device="cpu", progress=False)


def test_a_config_without_weights(tiny_model_folder, tmp_path):
    dst = tmp_path / "m"
    dst.mkdir()
    shutil.copy(tiny_model_folder("llama") / "config.json", dst / "config.json")
    with pytest.raises(FormatError, match="safetensors"):
        glyd.from_pretrained(dst, device="cpu", progress=False)
    (dst / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(FormatError, match="never unpickles"):
        glyd.from_pretrained(dst, device="cpu", progress=False)


def test_a_checkpoint_missing_a_tensor(tiny_model_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    dst = tmp_path / "m"
    shutil.copytree(tiny_model_folder("mistral"), dst)
    sd = load_file(dst / "model.safetensors")
    del sd["model.layers.1.self_attn.v_proj.weight"]
    save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(FormatError, match=r"model\.layers\.1\.self_attn\.v_proj\.weight"):
        glyd.from_pretrained(dst, device="cpu", merge=True, progress=False)


@pytest.mark.parametrize("key, keep", [("model.layers.0.input_layernorm.weight", 1), ("lm_head.weight", 300)])
def test_a_checkpoint_tensor_of_another_shape(tiny_model_folder, tmp_path, key, keep):
    # A norm weight of [1] for [64] was put in place (and broadcast), an lm_head of 300 rows for 320
    # packed (logits over a smaller vocabulary): a wrong model, loaded without a word.
    from safetensors.torch import load_file, save_file

    dst = tmp_path / "m"
    shutil.copytree(tiny_model_folder("mistral"), dst)
    sd = load_file(dst / "model.safetensors")
    want = list(sd[key].shape)
    sd[key] = sd[key][:keep].clone()
    save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})
    got = [keep, *want[1:]]
    with pytest.raises(FormatError, match=rf"^tensor '{key}' has shape \[{', '.join(map(str, got))}\], the model's is "
                                          rf"\[{', '.join(map(str, want))}\]$"):
        glyd.from_pretrained(dst, device="cpu", progress=False)


def test_bad_arguments(tiny_model_folder):
    src = tiny_model_folder("llama")
    with pytest.raises(ValueError, match="layout"):
        glyd.from_pretrained(src, layout="zip", device="cpu")
    with pytest.raises(ValueError, match="kv"):
        glyd.from_pretrained(src, kv="lossy", device="cpu")
    with pytest.raises(ValueError, match="no glyd-packed weights"):
        glyd.save_pretrained(torch.nn.Linear(2, 2), "unused")


@pytest.fixture
def one_thread():
    # the KV pool's torch twins run many small ops: on the 2-core CI machine torch's thread pool makes
    # them ~10x slower than one thread (as tests/kv/conftest.py); restored after the test
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_kv_lossless_is_wired_or_says_why(tiny_model_folder, family):
    # kv="lossless": generate gets glyd's static pool (kvf12 pages, the fused attention), whose tokens equal
    # the bf16 model's through a bf16 DynamicCache read by the same attention (tests/kv_reference.py)
    src = tiny_model_folder(family)
    try:
        from glyd.kv import generate  # noqa: F401
    except ImportError:
        with pytest.raises(NotImplementedError, match="glyd.kv.generate"):
            glyd.from_pretrained(src, kv="lossless", device="cpu", progress=False)
        return
    from kv_reference import use_reference
    from transformers import DynamicCache

    model = glyd.from_pretrained(src, kv="lossless", exact=True, device="cpu", progress=False)
    ids = torch.randint(3, 320, (2, 20), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # left padding
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model.generate(ids, **kw)
    here = str(Path(glyd.__file__).parent)
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
            if issubclass(w.category, (FutureWarning, DeprecationWarning)) and w.filename.startswith(here)]
    assert not ours
    assert type(out.past_key_values).__name__ == "GlydStaticCache" and out.past_key_values.context == 64
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    use_reference(ref, 64, 64)
    assert torch.equal(out.sequences, ref.generate(ids, past_key_values=DynamicCache(), **kw).sequences)


def test_kv_codes(tiny_model_folder):
    # kv="lossless": a static pool of fixed-rate pages (kvf12); kv="lossless-tiered": the growing cache of
    # tiered pages (kvtiered); glyd_make_growing_cache is the growing cache of either code
    pytest.importorskip("glyd.kv.generate")
    src = tiny_model_folder("llama")
    model = glyd.from_pretrained(src, kv="lossless", exact=True, device="cpu", progress=False)
    cache = model.glyd_make_cache(max_cache_len=64)
    assert type(cache).__name__ == "GlydStaticCache" and cache.code == "kvf12"
    assert type(model.glyd_make_growing_cache()).__name__ == "GlydCache" and model.glyd_make_growing_cache().code == "kvf12"
    model = glyd.from_pretrained(src, kv="lossless-tiered", exact=True, device="cpu", progress=False)
    assert type(model.glyd_make_cache()).__name__ == "GlydCache" and model.glyd_make_cache().code == "kvtiered"
    with pytest.warns(DeprecationWarning, match="lossless-tiered"):  # the name before 2026-12-03
        model = glyd.from_pretrained(src, kv="lossless-dense", exact=True, device="cpu", progress=False)
    assert model.glyd_make_cache().code == "kvtiered"


# -- a real model ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_roundtrip(tmp_path):
    smollm2 = pytest.importorskip("glyd.apps.smollm2")
    try:
        src = smollm2.bf16_folder()
    except glyd.GlydError as exc:
        pytest.skip(str(exc))
    ids = torch.tensor([[1, 504, 3458, 314, 260, 2135, 28, 282]])
    ref = bf16_logits(src, ids)
    model = glyd.from_pretrained(src, exact=True, device="cpu", progress=False)
    assert torch.equal(bits(logits(model, ids)), bits(ref))
    out = glyd.save_pretrained(model, tmp_path / "smollm2-glyd", progress=False)
    again = AutoModelForCausalLM.from_pretrained(out)
    glyd.nn.set_exact(again, True)
    assert torch.equal(bits(logits(again, ids)), bits(ref))
    assert glyd.verify(out, progress=False)["packed"] >= 211


# -- GPU (run through the device tool; skipped without CUDA) -----------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("layout", ["fixed12", "tiered"])
def test_gpu_load_generate_save_reload(tiny_model_folder, input_ids, tmp_path, family, layout):
    src = tiny_model_folder(family)
    ids = input_ids.cuda()
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).cuda()
    ref_logits = logits(ref, ids)
    exact = glyd.from_pretrained(src, layout=layout, exact=True, device="cuda", progress=False)
    assert any(isinstance(m, GlydLinearPart) for m in exact.modules())  # merged by default on a GPU
    assert all(b.is_cuda for b in exact.buffers())
    assert torch.equal(bits(logits(exact, ids)), bits(ref_logits))
    fast = glyd.from_pretrained(src, layout=layout, device="cuda", progress=False)
    got = logits(fast, ids).float()
    assert (got - ref_logits.float()).abs().max().item() <= 2e-2 * ref_logits.float().abs().max().item()
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert fast.generate(ids[:, :5], **kw).shape == (2, 11)
    out = glyd.save_pretrained(fast, tmp_path / "g", progress=False)
    again = glyd.from_pretrained(out, exact=True, verify=True, device="cuda", progress=False)
    assert torch.equal(bits(logits(again, ids)), bits(ref_logits))
    native = AutoModelForCausalLM.from_pretrained(out, device_map="cuda")
    glyd.nn.set_exact(native, True)
    assert torch.equal(bits(logits(native, ids)), bits(ref_logits))


def test_sharded_folders_in_and_out(tmp_path, input_ids):
    from transformers import AutoModelForCausalLM as Auto

    src = tmp_path / "bf16"
    build_tiny_model("mistral", src)
    sharded = tmp_path / "sharded"
    Auto.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(sharded, max_shard_size="60KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    ref = bf16_logits(src, input_ids)
    model = glyd.from_pretrained(sharded, exact=True, device="cpu", progress=False)
    assert torch.equal(bits(logits(model, input_ids)), bits(ref))
    out = glyd.save_pretrained(model, tmp_path / "g", max_shard_bytes=40_000, progress=False)
    assert len(list(out.glob("model-*.safetensors"))) > 1
    again = Auto.from_pretrained(out)
    glyd.nn.set_exact(again, True)
    assert torch.equal(bits(logits(again, input_ids)), bits(ref))
    assert glyd.verify(out, progress=False)["packed"] == 16


@pytest.mark.parametrize("merge", [False, True])
def test_weights_stream_one_tensor_at_a_time(tiny_model_folder, monkeypatch, merge):
    """The bf16 tensors read from the shards are freed as they are packed: never the whole model."""
    import weakref

    import safetensors

    alive: set[int] = set()
    most = [0]
    real_open = safetensors.safe_open

    class Spy:
        def __init__(self, *a, **k):
            self.inner = real_open(*a, **k)

        def __enter__(self):
            self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def get_tensor(self, key):
            t = self.inner.get_tensor(key)
            alive.add(id(t))
            weakref.finalize(t, alive.discard, id(t))
            most[0] = max(most[0], len(alive))
            return t

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    model = glyd.from_pretrained(tiny_model_folder("qwen2"), merge=merge, device="cpu", progress=False)
    n_tensors = len(model.state_dict())
    # Unmerged: the tensor being packed plus at most two waiting for their hash. Merged: one layer's
    # q, k, v weights and biases wait for each other.
    assert most[0] <= (8 if merge else 4) < n_tensors


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(num_hidden_layers=10**30), r"config\.json: num_hidden_layers is 10{30}, not a count from 0 to"),
    (lambda c: c.update(num_labels=10**30), r"config\.json: num_labels is 10{30}, not a count from 0 to 320"),
])
def test_a_bf16_config_with_counts_past_its_weights(tiny_model_folder, tmp_path, module_budget, edit, match):
    # transformers built layers (or a label table) until memory ran out, before glyd read a weight.
    src = tmp_path / "m"
    shutil.copytree(tiny_model_folder("llama"), src)
    cfg = json.loads((src / "config.json").read_text())
    edit(cfg)
    (src / "config.json").write_text(json.dumps(cfg))
    module_budget.clear()  # (the fixture's tiny model may have been built just now)
    with pytest.raises(FormatError, match=match):
        glyd.from_pretrained(src, device="cpu", progress=False)
    assert module_budget == []


def test_a_config_nested_too_deeply_is_one_line(tiny_model_folder, tmp_path):
    # json.loads raised RecursionError out of glyd.from_pretrained (config.json 100,000 lists deep).
    src = tmp_path / "m"
    shutil.copytree(tiny_model_folder("llama"), src)
    (src / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(FormatError, match=r"m/config\.json: not valid JSON \(nested too deeply\)"):
        glyd.from_pretrained(src, device="cpu", progress=False)
    (src / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 70 + "]" * 70 + "}")
    with pytest.raises(FormatError, match="nested more than 64 levels deep"):
        glyd.from_pretrained(src, device="cpu", progress=False)


def test_a_fifo_or_a_folder_in_place_of_a_json_file(tiny_model_folder, tmp_path):
    # glyd.json a FIFO made a packed folder load as a bf16 one; config.json a FIFO blocked the
    # loader forever (json read it); both now say what the path is.
    import os
    import signal

    packed = glyd.save_pretrained(glyd.from_pretrained(tiny_model_folder("llama"), device="cpu", progress=False),
                                  tmp_path / "p", progress=False)
    src = tmp_path / "m"
    shutil.copytree(tiny_model_folder("llama"), src)
    (src / "config.json").unlink()
    os.mkfifo(src / "config.json")
    signal.signal(signal.SIGALRM, lambda *a: pytest.fail("the loader blocked reading a FIFO"))
    signal.alarm(120)
    try:
        with pytest.raises(FormatError, match=r"m/config\.json: a FIFO \(named pipe\), not a regular file"):
            glyd.from_pretrained(src, device="cpu", progress=False)
        manifest = packed / MANIFEST
        for make in (os.mkfifo, os.mkdir):
            manifest.rmdir() if manifest.is_dir() else manifest.unlink()
            make(manifest)
            with pytest.raises(FormatError, match=r"p/glyd\.json: a (FIFO \(named pipe\)|folder), not a regular file"):
                glyd.from_pretrained(packed, device="cpu", progress=False)
    finally:
        signal.alarm(0)


def test_a_glyd_folder_without_its_glyd_json_is_named_so(tiny_model_folder, tmp_path):
    # It used to read "the model is already quantized (quant_method 'glyd'); glyd packs bf16 models".
    folder = glyd.save_pretrained(glyd.from_pretrained(tiny_model_folder("llama"), device="cpu", progress=False),
                                  tmp_path / "packed", progress=False)
    (folder / MANIFEST).unlink()
    with pytest.raises(FormatError, match=r"quant_method 'glyd'\) but glyd\.json is missing"):
        glyd.from_pretrained(folder, device="cpu", progress=False)


def test_subfolder_of_a_transformers_model(tiny_model_folder, tmp_path):
    # subfolder= reached the model class as a keyword: TypeError: LlamaForCausalLM.__init__() got an
    # unexpected keyword argument 'subfolder' (a pipeline's text_encoder/ is such a folder).
    shutil.copytree(tiny_model_folder("llama"), tmp_path / "pipe")
    shutil.copytree(tiny_model_folder("qwen2"), tmp_path / "pipe" / "text_encoder")
    model = glyd.from_pretrained(tmp_path / "pipe", subfolder="text_encoder", device="cpu", progress=False)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    for sub in ("../pipe", str(tmp_path / "pipe"), ""):
        with pytest.raises(ValueError, match="must name a folder inside the model folder"):
            glyd.from_pretrained(tmp_path / "pipe", subfolder=sub, device="cpu", progress=False)
    with pytest.raises(FormatError, match=r"no such folder \(subfolder='nope'\)"):
        glyd.from_pretrained(tmp_path / "pipe", subfolder="nope", device="cpu", progress=False)
