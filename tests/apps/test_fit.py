"""``glyd fit``: parameter counts, KV cache and the fits/does-not-fit decision on known configs."""

from __future__ import annotations

import json
import signal
import struct
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from glyd.cli import main
from glyd.errors import FormatError, GlydError
from glyd.apps import fit, fit_meta

GiB = 2**30


def _shape(name):
    return fit.model_shape(fit.load_config(name))


def _reference_params(name):
    """Parameters of the model accelerate builds on the meta device from the embedded config."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    params = {k: v for k, v in fit.KNOWN_CONFIGS[name].items() if k != "model_type"}
    config = AutoConfig.for_model(fit.KNOWN_CONFIGS[name]["model_type"], **params)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    # transformers skips tying under accelerate's init_empty_weights (it ties on torch's meta
    # device and in from_pretrained); tie as a loaded model is tied, so a tied weight counts once.
    model.tie_weights()
    return sum(p.numel() for p in model.parameters())


# The published parameter counts (model cards / safetensors metadata): Qwen2.5-7B 7.62 B,
# Llama-3.1-8B 8.03 B, Mistral-7B-v0.3 7.25 B, Mixtral-8x7B 46.7 B, Gemma-2-9B 9.24 B (its
# embedding tied to the output), Qwen3-30B-A3B 30.5 B (3.3 B active), Qwen2.5-0.5B 0.49 B,
# Qwen2.5-32B 32.8 B, Llama-3.1-70B 70.6 B.
PUBLISHED = {
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-32b": 32_763_876_352,
    "llama-3.1-70b": 70_553_706_496,
    "qwen2.5-7b": 7_615_616_512,
    "llama-3.1-8b": 8_030_261_248,
    "mistral-7b": 7_248_023_552,
    "mixtral-8x7b": 46_702_792_704,
    "gemma-2-9b": 9_241_705_984,
    "qwen3-30b-a3b": 30_532_122_624,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_matches_the_meta_model(name):
    shape = _shape(name)
    assert abs(shape.params - _reference_params(name)) <= 0.01 * shape.params
    assert abs(shape.params - PUBLISHED[name]) <= 0.01 * PUBLISHED[name]
    assert 0 < shape.packable < shape.params


def test_moe_experts_counted_and_packed():
    """Mixtral's 8 experts a layer are counted and packed (fused 3-D tensors, packed expert by expert);
    only the routers stay bf16."""
    shape = _shape("mixtral-8x7b")
    h, inter, layers, vocab = 4096, 14336, 32, 32000
    attention = h * h * 2 + 2 * h * 1024  # q, o and k, v (8 kv heads x 128)
    experts, router = layers * 8 * 3 * h * inter, layers * 8 * h
    assert shape.packable == layers * attention + 2 * vocab * h + experts
    assert sum(shape.unpacked_matrices.values()) == router
    e, table = fit.run_fit("mixtral-8x7b", "80GB", 8192)
    assert e.weights_bf16 > 86 * GiB
    assert e.weights_glyd <= 0.76 * e.weights_bf16  # fixed12: 12.05 bits a packed weight
    assert e.fits_glyd and not e.fits_bf16
    assert "fits in 80GB = 79.65 GiB" in table  # a card sold as 80 GB: the H100 80GB's 81,559 MiB


def test_qwen3_30b_a3b_fits_a_48gb_gpu_only_packed():
    e, table = fit.run_fit("qwen3-30b-a3b", "rtx-a6000", 8192)  # 49,140 MiB
    assert e.weights_glyd <= 0.76 * e.weights_bf16
    assert e.fits_glyd and not e.fits_bf16
    assert "fits in rtx-a6000 = 47.99 GiB" in table
    e, table = fit.run_fit("qwen3-30b-a3b", "48GB", 2048)  # read as the smallest card sold as 48 GB: the L40S's
    assert not e.fits_glyd and "fits in 48GB = 44.99 GiB" in table  # 46,068 MiB: 0.4 GiB short


def test_a_model_fixed12_does_not_fit_is_told_the_smaller_layout_that_does():
    import re

    from glyd.hf.memory import WeightsCount, fit_layout

    e, table = fit.run_fit("qwen3-30b-a3b", "48GB", 8192)
    assert not e.fits_glyd
    note = next(line for line in table.splitlines() if line.startswith("note: dense11 fits"))
    assert note.endswith("GiB on demo, eval, serve)")  # not glyd pack: it keeps an MoE's experts bf16
    limit = float(re.search(r"--memory-limit ([0-9.]+)GiB", note).group(1)) * GiB
    count = fit.count_from_shape(_shape("qwen3-30b-a3b"))  # the limit told makes auto take dense11
    weights = WeightsCount(count.packable, count.other_bytes, count.rows)
    assert fit_layout(weights, "auto", int(limit)) == "dense11"
    assert weights.need("dense11") + e.kv_cache + e.margin <= e.gpu_bytes
    _, table = fit.run_fit("llama-3.1-70b", "24GB", 8192)
    assert "note: no layout fits at this context and batch" in table
    _, table = fit.run_fit("qwen2.5-14b", "24GB", 4096)  # a dense model: glyd pack takes the limit too
    assert "fits: weights" in table and "GiB on pack, demo, eval, serve)" in table
    _, table = fit.run_fit("qwen3-30b-a3b", "80GB", 8192)
    assert "fits:" not in table and "no layout fits" not in table  # fixed12 fits: nothing to say


def test_gemma2_ties_embeddings_as_its_class_does():
    shape = _shape("gemma-2-9b")
    # untied, the 256000 x 3584 embedding would count twice (10.16 B)
    assert shape.params == PUBLISHED["gemma-2-9b"]
    e, _ = fit.run_fit("gemma-2-9b", "24GB", 8192)
    assert e.weights_bf16 == 2 * PUBLISHED["gemma-2-9b"]


def test_qwen25_7b_counts_by_hand():
    shape = _shape("qwen2.5-7b")
    count = fit.count_from_shape(shape)
    h, inter, vocab, layers = 3584, 18944, 152064, 28
    per_layer = h * h + 2 * 512 * h + h * h + 3 * h * inter  # q, k+v (4 kv heads x 128), o, mlp
    assert count.packable == layers * per_layer + 2 * vocab * h == 7_615_283_200
    # norms (2 a layer + final) and q/k/v biases, in bf16
    assert count.other_bytes == 2 * (layers * (2 * h + h + 2 * 512) + h)
    assert count.packable + count.other_bytes // 2 == PUBLISHED["qwen2.5-7b"]


def test_llama31_8b_counts_and_kv_by_hand():
    shape = _shape("llama-3.1-8b")
    assert shape.params == PUBLISHED["llama-3.1-8b"]
    # 32 layers x 8 kv heads x 128 x (K, V) x 2 bytes x 8192 tokens = exactly 1 GiB
    assert fit.kv_cache_bytes(shape, 8192, 1) == 32 * 8 * 128 * 2 * 2 * 8192 == GiB
    assert fit.kv_cache_bytes(shape, 8192, 4) == 4 * GiB


def test_gemma2_sliding_window_kv():
    shape = _shape("gemma-2-9b")
    per_token_layer = 8 * 256 * 2 * 2  # kv heads x head_dim x (K, V) x bf16
    full = 42 * per_token_layer * 16384  # the full-attention formula
    kv = fit.kv_cache_bytes(shape, 16384)
    assert kv < full
    assert kv == 21 * per_token_layer * 16384 + 21 * per_token_layer * 4096  # every other layer: 4096 tokens
    assert fit.kv_cache_bytes(shape, 4096) == 42 * per_token_layer * 4096  # within the window: all alike
    _, table = fit.run_fit("gemma-2-9b", "24GB", 16384)
    assert "21 of 42 layers hold at most 4096 tokens" in table


def test_mistral_v03_has_no_sliding_window():
    # MistralConfig's class default is a 4096-token window; v0.3's config says none.
    shape = _shape("mistral-7b")
    assert all(a.window is None for a in shape.attention)
    assert fit.kv_cache_bytes(shape, 32768) == 32 * 8 * 128 * 2 * 2 * 32768


def test_tied_embeddings_counted_once():
    shape = _shape("smollm2-135m")
    per_layer = 576 * 576 * 2 + 2 * 192 * 576 + 3 * 576 * 1536
    assert shape.packable == 30 * per_layer + 49152 * 576


def test_refuses_what_it_cannot_count(tmp_path):
    cases = {
        "unknown": ({"model_type": "no-such-arch", "hidden_size": 8}, "does not know model_type 'no-such-arch'"),
        "untyped": ({"hidden_size": 8, "num_hidden_layers": 2}, "no model_type"),
        "invalid": ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 5, "num_hidden_layers": 2},
                    "cannot read this llama config"),
        "not-causal": ({"model_type": "t5"}, "cannot build a causal LM"),
        "too-deep": ({"model_type": "llama", "num_hidden_layers": 10**6}, "num_hidden_layers"),
        # built by transformers, then its first forward failed (glyd eval --random: a RuntimeError traceback)
        "kv-heads": ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3,
                      "num_hidden_layers": 2}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    }
    for key, (cfg, message) in cases.items():
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(cfg))
        with pytest.raises(FormatError, match=message) as info:
            fit.run_fit(str(path), "24GB", 1024)
        assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_refuses_a_layer_type_without_a_sized_cache():
    text = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
                           layer_types=["full_attention", "linear_attention"])
    with pytest.raises(FormatError, match="linear_attention"):
        fit_meta.attention_layers(text)
    text.layer_types = ["full_attention", "sliding_attention"]
    text.sliding_window = 128
    assert [a.window for a in fit_meta.attention_layers(text)] == [None, 128]


def test_sizes_say_their_unit():
    assert fit.parse_size("16GB") == 16 * 10**9
    assert fit.parse_size("16 GiB") == fit.parse_size("16") == 16 * GiB  # a bare number is GiB
    assert fit.parse_size("16000MB") == 16 * 10**9
    assert fit.parse_size("16000MiB") == 16000 * 2**20
    assert fit.parse_size("1.5TB") == 15 * 10**11
    assert fit.parse_size("0.5tib") == 2**39
    for bad in ("lots", "-3GB", "0", "16G", "16 gigs", "GB"):
        with pytest.raises(GlydError, match="--gpu"):
            fit.parse_size(bad)


@pytest.mark.parametrize(
    ("gpu", "gpu_bytes", "fits_bf16", "fits_glyd"),
    [("12GB", 12 * 10**9, False, False), ("t4", 15_360 * 2**20, False, True), ("16GB", 15_360 * 2**20, False, True),
     ("l4", 23_034 * 2**20, True, True), ("80GiB", 80 * GiB, True, True)],
)
def test_llama31_8b_fit_decisions(gpu, gpu_bytes, fits_bf16, fits_glyd):
    e, _ = fit.run_fit("llama-3.1-8b", gpu, 8192)
    assert e.gpu_bytes == gpu_bytes  # 16GB: the size a T4 is sold as, read as its memory
    assert (e.fits_bf16, e.fits_glyd) == (fits_bf16, fits_glyd)
    # the totals are the three stated terms
    assert e.total_bf16 == e.weights_bf16 + e.kv_cache + e.margin
    assert e.weights_glyd == round(8_029_995_008 * fit.layout_bits("fixed12") / 8) + 266_240 * 2
    reserve = max(GiB, int(0.05 * gpu_bytes))
    repeat = 32 * 128 * 2 * 2 * 8192  # one layer's keys and values for all 32 query heads (8 KV heads)
    assert e.margin == reserve + 2048 * (4 * 4096 + 2 * 14336) * 2 + 128256 * 4 + repeat


def test_no_repeat_without_grouped_query_attention():
    shape = fit_meta.ModelShape("m", "llama", 10, 5, 64, 128, 100, None,
                                [fit_meta.AttentionLayer(4, 16), fit_meta.AttentionLayer(2, 16, 100, heads=8)])
    assert fit.attention_temporaries(shape, 1000) == 8 * 16 * 2 * 2 * 100  # the GQA layer, at its window
    shape.attention = shape.attention[:1]
    assert fit.attention_temporaries(shape, 1000) == 0


def test_tiered_is_smaller_and_batch_scales_kv():
    a, _ = fit.run_fit("qwen2.5-7b", "24GB", 4096, batch=1, layout="fixed12")
    b, _ = fit.run_fit("qwen2.5-7b", "24GB", 4096, batch=8, layout="tiered")
    assert b.weights_glyd < a.weights_glyd < a.weights_bf16
    assert b.kv_cache == 8 * a.kv_cache == 8 * 28 * 4 * 128 * 2 * 2 * 4096


def test_max_context_is_the_largest_that_fits():
    for name in ("llama-3.1-8b", "gemma-2-9b"):
        shape = _shape(name)
        e = fit.estimate(shape, gpu_bytes=20 * GiB, context=8192)
        n = fit.max_context(e, shape, e.weights_glyd)
        total = lambda t: e.weights_glyd + fit.kv_cache_bytes(shape, t) + fit.runtime_margin(shape, t, 1, 20 * GiB)  # noqa: E731
        assert total(n) <= 20 * GiB
        assert n == shape.max_positions or total(n + 1) > 20 * GiB


def _tiny_folder(tmp_path, glyd_folder=False):
    cfg = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=100, tie_word_embeddings=True)
    if glyd_folder:
        cfg["quantization_config"] = {"quant_method": "glyd"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if glyd_folder:
        tensors = {"a.weight_glyd_lo": torch.zeros(100, 64, dtype=torch.uint8),
                   "a.weight_glyd_code": torch.zeros(100, 32, dtype=torch.uint8),
                   "n.weight": torch.ones(64, dtype=torch.bfloat16)}
    else:
        tensors = {"embed.weight": torch.zeros(100, 64, dtype=torch.bfloat16),
                   "q.weight": torch.zeros(64, 64, dtype=torch.bfloat16),
                   "n.weight": torch.ones(64, dtype=torch.bfloat16),
                   "n32.weight": torch.ones(64, dtype=torch.float32)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_counts_from_safetensors_headers(tmp_path):
    folder = _tiny_folder(tmp_path)
    count = fit.count_from_files(folder)
    assert count.packable == 100 * 64 + 64 * 64
    assert count.other_bytes == 2 * 64 * 2  # 1-D tensors counted as bf16
    e, table = fit.run_fit(str(folder), "1GB", 16)
    assert e.weights_bf16 == 2 * (100 * 64 + 64 * 64) + 256
    assert "safetensors headers" in table


def test_folder_headers_size_and_the_models_packing(tmp_path):
    """A folder saved from the config's model: bf16 bytes from its headers, packed part by the packer's rule."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=100, tie_word_embeddings=False)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=torch.bfloat16)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    params = sum(p.numel() for p in model.parameters())
    linears = sum(m.weight.numel() for m in model.modules() if type(m) in (torch.nn.Linear, torch.nn.Embedding))
    e, table = fit.run_fit(str(tmp_path), "1GB", 16)
    assert e.params == params and e.weights_bf16 == 2 * params
    assert e.weights_glyd == round(linears * fit.layout_bits("fixed12") / 8) + 2 * (params - linears)
    assert "safetensors headers" in table and "the folder holds" not in table


def test_glyd_folder_counts_packed_bytes_as_stored(tmp_path):
    folder = _tiny_folder(tmp_path, glyd_folder=True)
    count = fit.count_from_files(folder)
    assert count.packed_bytes == 100 * 64 + 100 * 32
    assert count.glyd_bytes("fixed12") == 100 * 96 + 64 * 2
    e, table = fit.run_fit(str(folder), "1GB", 16)
    assert e.weights_glyd == 100 * 96 + 64 * 2 and "as stored" in table


def test_sharded_folder_reads_only_indexed_shards(tmp_path):
    folder = _tiny_folder(tmp_path)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    save_file({"stray.weight": torch.zeros(1000, 1000, dtype=torch.bfloat16)}, str(folder / "consolidated.safetensors"))
    index = {"weight_map": {k: "model-00001-of-00001.safetensors" for k in ("embed.weight", "q.weight", "n.weight", "n32.weight")}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert fit.count_from_files(folder).packable == 100 * 64 + 64 * 64
    index["weight_map"]["x.weight"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match="model-00002-of-00002"):
        fit.count_from_files(folder)


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    # counted twice (an MoE expert's matrix in two shards made the weights 3% larger), while loading
    # the same folder refuses it
    folder = _tiny_folder(tmp_path)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    save_file({"q.weight": torch.zeros(64, 64, dtype=torch.bfloat16)}, str(folder / "model-00002-of-00002.safetensors"))
    index = {"weight_map": {"embed.weight": "model-00001-of-00002.safetensors",
                            "q.weight": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match=r"tensor 'q\.weight' is in two shards: model-00001-of-00002\.safetensors "
                                          r"and model-00002-of-00002\.safetensors"):
        fit.count_from_files(folder)


def test_bad_inputs(tmp_path):
    with pytest.raises(FormatError, match="not a model folder"):
        fit.load_config(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(FormatError, match="config.json"):
        fit.load_config(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(FormatError, match="no model_type"):
        fit.run_fit(str(tmp_path), "1GB", 16)
    # a safetensors header whose length points past the end of the file
    (tmp_path / "config.json").write_text(json.dumps(fit.KNOWN_CONFIGS["smollm2-135m"]))
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(GlydError, match=r"model\.safetensors: truncated or not a safetensors file"):
        fit.run_fit(str(tmp_path), "1GB", 16)
    # the store's checks apply: two tensors sharing bytes
    head = json.dumps({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
                       "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + bytes(8))
    with pytest.raises(FormatError, match=r"model\.safetensors: tensor .*overlap"):
        fit.run_fit(str(tmp_path), "1GB", 16)


def test_cli_fit(capsys):
    assert main(["fit", "qwen2.5-7b", "--gpu", "24GB", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "sizes in GiB (2^30 bytes)" in out and "fits in 24GB = 22.49 GiB" in out
    assert "GPU: 24GB read as the memory of a card sold as 24 GB: 23,034 MiB" in out
    assert "KV cache (8192 tok x 1)" in out and "parameters: 7.62 B" in out
    assert main(["fit", "llama-3.1-8b", "--gpu", "16GB", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["fits_bf16"] is False and d["fits_glyd"] is True
    assert d["gpu"] == "16GB" and d["gpu_bytes"] == 15_360 * 2**20
    assert main(["fit", "no-such-model", "--gpu", "24GB"]) == 1
    assert "not a model folder" in capsys.readouterr().err
    assert main(["fit", "qwen2.5-7b", "--gpu", "24G"]) == 1
    assert "give a card (h200, h100-80gb" in capsys.readouterr().err


def test_dense11_sits_between_tiered_and_fixed12():
    sizes = {lay: fit.run_fit("qwen2.5-7b", "80GB", 4096, layout=lay)[0].weights_glyd
             for lay in ("tiered", "dense11", "fixed12")}
    assert sizes["tiered"] < sizes["dense11"] < sizes["fixed12"]


def test_sizes_past_any_gpu_and_nested_configs_are_one_line_errors(tmp_path, capsys):
    # --gpu with 400 digits raised OverflowError (float('9' * 400) is inf); a config.json nested
    # deeper than Python's recursion limit raised RecursionError from json.loads.
    huge = "9" * 400 + "GB"
    with pytest.raises(GlydError, match=r"--gpu '9{37}\.\.\.': more than any GPU holds"):
        fit.parse_size(huge)
    assert fit.parse_size(f"{2**30}GiB") == 2**60 == fit.MAX_GPU_BYTES  # the bound itself is taken
    with pytest.raises(GlydError, match="more than any GPU holds"):
        fit.parse_size(f"{2**30 + 1}GiB")
    assert main(["fit", "qwen2.5-7b", "--gpu", huge]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "more than any GPU holds" in err and len(err) < 300
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["fit", str(tmp_path), "--gpu", "24GB"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.json: not a readable JSON config (nested too deeply)" in err
    (tmp_path / "config.json").write_text('{"a": ' * 70 + "1" + "}" * 70)
    with pytest.raises(FormatError, match="nested more than 64 levels deep"):
        fit.load_config(str(tmp_path))


@pytest.mark.parametrize("field, value", [("num_hidden_layers", 10**30), ("num_hidden_layers", 10**7),
                                          ("num_experts", 10**12), ("num_labels", 10**30)])
def test_counts_are_bounded_before_transformers_reads_the_config(tmp_path, field, value):
    # Qwen2's config class builds a list a layer (layer_types), and every config a table of
    # num_labels entries: glyd fit ran until killed on 10^7 layers or 10^30 labels.
    cfg = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 320, "num_hidden_layers": 2, field: value}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    signal.signal(signal.SIGALRM, lambda *a: pytest.fail("glyd fit ran on and on"))
    signal.alarm(120)
    try:
        if field == "num_labels":  # sizes no causal LM: left out of what fit builds
            assert fit.run_fit(str(tmp_path), "24GB", 64)[0].params > 0
            return
        with pytest.raises(FormatError, match=rf"test_counts_are_bounded\w*: {field} \d+ is not between 0 and 4096"):
            fit.run_fit(str(tmp_path), "24GB", 64)
    finally:
        signal.alarm(0)



@pytest.mark.parametrize("top_k", [0, -1, 5])
def test_an_moe_config_routing_to_no_experts_or_past_them_is_refused(tmp_path, capsys, top_k):
    # fit counted and fitted a Mixtral routing each token to 0 (or 5 of its 4) experts: a model that
    # adds nothing in its MoE blocks, or fails at its first forward
    cfg = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "num_local_experts": 4,
           "num_experts_per_tok": top_k}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    # the message names both fields: the top-k and the experts count it is checked against
    with pytest.raises(FormatError, match=rf"num_experts_per_tok is {top_k}, not a number of experts from 1 to 4 "
                                          r"\(num_local_experts\)"):
        fit.run_fit(str(tmp_path), "h200", 64)
    assert main(["fit", str(tmp_path), "--gpu", "h200"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "num_experts_per_tok" in err and "num_local_experts" in err, err


_SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100}


@pytest.mark.parametrize("top_k", [2, 0])
@pytest.mark.parametrize("model_type, field", [("mixtral", "num_local_experts"), ("olmoe", "num_experts")])
def test_no_experts_where_transformers_builds_moe_blocks_anyway_is_refused(tmp_path, capsys, model_type, field, top_k):
    # fit counted a Mixtral of num_local_experts 0 as an MoE model (experts True, a router of 0 rows):
    # transformers builds its MoE blocks whatever the count, with no experts in them, and the first
    # forward fails in torch.topk; no such model exists to fit
    (tmp_path / "config.json").write_text(json.dumps({**_SMALL, "model_type": model_type, field: 0,
                                                      "num_experts_per_tok": top_k}))
    with pytest.raises(FormatError, match=rf"{tmp_path.name}\W*: {field} is 0, but transformers builds {model_type}'s "
                                          r"MoE blocks whatever the count: blocks with no experts"):
        fit.run_fit(str(tmp_path), "h200", 64)
    assert main(["fit", str(tmp_path), "--gpu", "h200"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{field} is 0" in err, err


@pytest.mark.parametrize("model_type, dense", [("qwen2_moe", "qwen2"), ("qwen3_moe", "qwen3")])
def test_no_experts_where_transformers_builds_dense_layers_is_a_dense_model(model_type, dense):
    # Qwen2-MoE and Qwen3-MoE build a dense MLP in every layer where num_experts is 0 (their decoder
    # layers ask num_experts > 0): the top-k routes nothing and the model is its dense sibling
    moe = fit_meta.model_shape({**_SMALL, "model_type": model_type, "num_experts": 0, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 32})
    twin = fit_meta.model_shape({**_SMALL, "model_type": dense})
    assert not moe.experts and not moe.unpacked_matrices  # no experts and no router
    assert (moe.params, moe.packable, moe.packable_rows) == (twin.params, twin.packable, twin.packable_rows)

def test_a_packed_folder_is_read_as_its_model(tmp_path):
    import glyd
    from glyd.store import CheckpointWriter, sha256_tensor
    from glyd.store._config import packed_config

    cfg = dict(fit.KNOWN_CONFIGS["qwen2.5-7b"])
    w = torch.ones(64, 64, dtype=torch.bfloat16)
    with CheckpointWriter(tmp_path / "packed", layout="tiered") as out:  # one matrix: sizes "as stored"
        out.add_packed("w", glyd.pack(w, "tiered"), sha256_tensor(w))
        out.set_config(packed_config(cfg, {"quant_method": "glyd", "layout": "tiered"}))
    e, table = fit.run_fit(str(tmp_path / "packed"), "h200", 4096)
    ref, _ = fit.run_fit("qwen2.5-7b", "h200", 4096)
    assert e.params == ref.params and e.kv_cache == ref.kv_cache  # the model's own config, not type "glyd"
    assert e.layout == "tiered, as stored"


def test_a_hub_id_whose_config_is_cached(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    snap = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("abc123")
    (snap / "config.json").write_text(json.dumps(fit.KNOWN_CONFIGS["qwen2.5-0.5b"]))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    e, _ = fit.run_fit("org/tiny", "24GB", 2048)
    assert e.params == fit.run_fit("qwen2.5-0.5b", "24GB", 2048)[0].params
    with pytest.raises(FormatError, match=r"org/other: not a local folder, and the Hugging Face cache has no "
                                          r"config.json for it \(glyd fit downloads nothing"):
        fit.run_fit("org/other", "24GB", 2048)


@pytest.mark.parametrize("name, weights_gib, measured", [
    ("llama-3.1-70b", 98.59, 101_888),  # fixed12
    ("qwen2.5-0.5b", 0.92, 8_868_608),  # bf16: without the repeated keys and values fit said 1.36x this
])
def test_largest_context_agrees_with_the_h200(name, weights_gib, measured):
    # benchmarks/fit_check.py: the largest contexts the H200 held (2026-12-03), weights as measured
    import dataclasses

    shape = dataclasses.replace(_shape(name), max_positions=None)
    e = fit.estimate(shape, gpu_bytes=143_771 * 2**20, context=512)
    assert abs(fit.max_context(e, shape, int(weights_gib * GiB)) / measured - 1) < 0.05


def test_bf16_llama_70b_on_an_h200_fits_only_a_short_context():
    e, table = fit.run_fit("llama-3.1-70b", "h200", 4096)
    assert e.fits_bf16 and e.fits_glyd
    bf16_max = fit.max_context(e, _shape("llama-3.1-70b"), e.weights_bf16)
    assert 3000 < bf16_max < 8192 and not fit.run_fit("llama-3.1-70b", "h200", 8192)[0].fits_bf16
