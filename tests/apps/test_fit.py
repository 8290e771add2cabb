"""``glyd fit``: parameter counts, KV cache and the fits/does-not-fit decision on known configs."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from glyd.cli import main
from glyd.errors import FormatError, GlydError
from glyd.apps import fit

GiB = 2**30


def test_qwen25_7b_counts_by_hand():
    cfg = fit.load_config("qwen2.5-7b")
    count = fit.count_from_config(cfg)
    h, inter, vocab, layers = 3584, 18944, 152064, 28
    per_layer = h * h + 2 * 512 * h + h * h + 3 * h * inter  # q, k+v (4 kv heads x 128), o, mlp
    assert count.packable == layers * per_layer + 2 * vocab * h == 7_615_283_200
    # norms (2 a layer + final) and q/k/v biases, in bf16
    assert count.other_bytes == 2 * (layers * (2 * h + h + 2 * 512) + h)
    # the published parameter count of Qwen2.5-7B: 7.62 B
    assert count.packable + count.other_bytes // 2 == 7_615_616_512


def test_llama31_8b_counts_and_kv_by_hand():
    cfg = fit.load_config("llama-3.1-8b")
    count = fit.count_from_config(cfg)
    assert count.packable + count.other_bytes // 2 == 8_030_261_248  # published: 8.03 B
    # 32 layers x 8 kv heads x 128 x (K, V) x 2 bytes x 8192 tokens = exactly 1 GiB
    assert fit.kv_cache_bytes(cfg, 8192, 1) == 32 * 8 * 128 * 2 * 2 * 8192 == GiB
    assert fit.kv_cache_bytes(cfg, 8192, 4) == 4 * GiB


def test_tied_embeddings_counted_once():
    cfg = fit.load_config("smollm2-135m")
    count = fit.count_from_config(cfg)
    per_layer = 576 * 576 * 2 + 2 * 192 * 576 + 3 * 576 * 1536
    assert count.packable == 30 * per_layer + 49152 * 576


@pytest.mark.parametrize(
    ("gpu", "fits_bf16", "fits_glyd"),
    [("12GB", False, False), ("16GB", False, True), ("24GB", True, True)],
)
def test_llama31_8b_fit_decisions(gpu, fits_bf16, fits_glyd):
    e, _ = fit.run_fit("llama-3.1-8b", gpu, 8192)
    assert (e.fits_bf16, e.fits_glyd) == (fits_bf16, fits_glyd)
    # the totals are the three stated terms
    assert e.total_bf16 == e.weights_bf16 + e.kv_cache + e.margin
    assert e.weights_glyd == round(8_029_995_008 * fit.LAYOUT_BITS["fixed12"] / 8) + 266_240 * 2
    margin = GiB + 2048 * (4 * 4096 + 2 * 14336) * 2 + 128256 * 4
    assert e.margin == margin


def test_tiered_is_smaller_and_batch_scales_kv():
    a, _ = fit.run_fit("qwen2.5-7b", "24GB", 4096, batch=1, layout="fixed12")
    b, _ = fit.run_fit("qwen2.5-7b", "24GB", 4096, batch=8, layout="tiered")
    assert b.weights_glyd < a.weights_glyd < a.weights_bf16
    assert b.kv_cache == 8 * a.kv_cache == 8 * 28 * 4 * 128 * 2 * 2 * 4096


def test_max_context_is_the_largest_that_fits():
    cfg = fit.load_config("llama-3.1-8b")
    e = fit.estimate(cfg, gpu_bytes=20 * GiB, context=8192)
    n = fit.max_context(e, cfg, e.weights_glyd)
    per_tok = fit.kv_cache_bytes(cfg, 1)
    assert e.weights_glyd + n * per_tok + fit.runtime_margin(cfg, n) <= 20 * GiB
    assert e.weights_glyd + (n + 1) * per_tok + fit.runtime_margin(cfg, n + 1) > 20 * GiB


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


def test_bad_inputs(tmp_path):
    with pytest.raises(FormatError, match="not a model folder"):
        fit.load_config(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(FormatError, match="config.json"):
        fit.load_config(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(FormatError, match="num_hidden_layers"):
        fit.run_fit(str(tmp_path), "1GB", 16)
    # a safetensors header whose length points past the end of the file
    (tmp_path / "config.json").write_text(json.dumps(fit.KNOWN_CONFIGS["smollm2-135m"]))
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(FormatError, match="model.safetensors"):
        fit.run_fit(str(tmp_path), "1GB", 16)
    for bad in ("lots", "-3GB", "0"):
        with pytest.raises(GlydError):
            fit.parse_size(bad)
    assert fit.parse_size("80GiB") == 80 * GiB
    assert fit.parse_size("16000MB") == 16000 * 2**20


def test_cli_fit(capsys):
    assert main(["fit", "qwen2.5-7b", "--gpu", "24GB", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "fits in 24.0 GiB" in out and "KV cache (8192 tok x 1)" in out
    assert main(["fit", "llama-3.1-8b", "--gpu", "16GB", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["fits_bf16"] is False and d["fits_glyd"] is True
    assert main(["fit", "no-such-model", "--gpu", "24GB"]) == 1
    assert "not a model folder" in capsys.readouterr().err
