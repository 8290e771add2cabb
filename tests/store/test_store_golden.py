"""Checkpoints written by format version 1 (tests/data/store_v1) must keep loading, bit for bit.

The files were made once by ``make_store_golden.py`` and are never rewritten; this test pins the
format's names (files, keys, manifest fields) so a change to them cannot pass unnoticed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from make_store_golden import GOLDEN, GOLDEN_CONFIG, GOLDEN_TOKENIZER, golden_tensors
from safetensors import safe_open
from store_helpers import assert_bits_equal, load_folder

import glyd
from glyd.store import CheckpointReader, info, key_for, unpack_folder

TOP_FIELDS = {"format", "version", "glyd_version", "layout", "tensors", "files"}
RAW_FIELDS = {"kind", "dtype", "shape", "sha256", "file"}
PACKED_FIELDS = RAW_FIELDS | {"layout", "format_version", "arrays"}
ARRAYS = {
    "fixed12": ("lo", "code", "base", "exc_idx", "exc_hi"),
    "tiered": ("sm", "d1", "table", "esc_base", "esc_off", "area"),
    "dense11": ("sm", "code", "base", "etab", "esc", "esc_base", "esc_off", "exc_idx", "exc_exp"),
}
SHARDS = {
    "fixed12": ["model.safetensors"],
    "tiered": ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
    "dense11": ["model.safetensors"],
}


@pytest.mark.parametrize("layout", ["fixed12", "tiered", "dense11"])
def test_golden_v1_loads_and_verifies(layout, tmp_path):
    path = GOLDEN / layout
    reader = CheckpointReader(path)
    counts = reader.verify(progress=False)
    assert counts == {"tensors": 6, "packed": 3, "raw": 3, "weights": 12 * 40 + 16 * 72 + 16 + 40 + 8, "files": 2}

    expected = golden_tensors()
    got = {n: reader.get_original(n) for n in reader.names()}
    assert_bits_equal(expected, got)
    q = {"quant_method": "glyd", "layout": layout, "format_version": 1}
    if layout == "dense11":  # written after configs began to say model_type "glyd" (the model's own kept in q)
        want = {**GOLDEN_CONFIG, "model_type": "glyd", "quantization_config": {**q, "original_model_type": "glyd-golden"}}
    else:
        want = {**GOLDEN_CONFIG, "quantization_config": q}
    assert reader.config == want

    unpack_folder(path, tmp_path / "out", progress=False)
    assert_bits_equal(expected, load_folder(tmp_path / "out"))
    # Written before glyd kept the source's config.json bytes: its config comes back as it always did.
    plain = (json.dumps(GOLDEN_CONFIG, indent=2, sort_keys=True) + "\n").encode()
    assert (tmp_path / "out" / "config.json").read_bytes() == plain
    assert (tmp_path / "out" / "tokenizer.json").read_text() == GOLDEN_TOKENIZER
    rows, totals = info(path)
    assert sorted(r["name"] for r in rows) == sorted(expected) and totals["packed"] == 3


@pytest.mark.parametrize("layout", ["fixed12", "tiered", "dense11"])
def test_golden_v1_names_are_pinned(layout):
    path = GOLDEN / layout
    files = sorted(p.name for p in path.iterdir())
    want = ["config.json", "glyd.json", *SHARDS[layout], "tokenizer.json"]
    if len(SHARDS[layout]) > 1:
        want.append("model.safetensors.index.json")
    assert files == sorted(want)

    m = json.loads((path / "glyd.json").read_text())
    assert set(m) == TOP_FIELDS
    assert (m["format"], m["version"], m["layout"]) == ("glyd-checkpoint", 1, layout)
    assert set(m["files"]) == {"config.json", "tokenizer.json"}
    keys: dict[str, set[str]] = {s: set() for s in SHARDS[layout]}
    for name, e in m["tensors"].items():
        if e["kind"] == "packed":
            assert set(e) == PACKED_FIELDS
            assert (e["dtype"], e["layout"], e["format_version"]) == ("bfloat16", layout, 1)
            assert tuple(e["arrays"]) == ARRAYS[layout]
            for a, spec in e["arrays"].items():
                assert set(spec) == {"dtype", "shape", "sha256"}
                keys[e["file"]].add(f"{name}_glyd_{a}")
                assert key_for(name, a) == f"{name}_glyd_{a}"
        else:
            assert set(e) == RAW_FIELDS and e["kind"] == "raw"
            keys[e["file"]].add(name)
    assert {n for n, e in m["tensors"].items() if e["kind"] == "packed"} == {
        "model.embed_tokens.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.empty.weight",
    }
    for shard, ks in keys.items():
        with safe_open(str(path / shard), framework="pt") as f:
            assert f.metadata() == {"format": "pt", "glyd": "1"}
            assert set(f.keys()) == ks
    if len(SHARDS[layout]) > 1:
        wm = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
        assert wm == {k: s for s, ks in keys.items() for k in ks}


def test_golden_special_values_survive():
    w = CheckpointReader(GOLDEN / "fixed12").get("model.layers.0.mlp.up_proj.weight")
    bits = glyd.unpack(w).view(torch.int16).reshape(-1).to(torch.int32) & 0xFFFF
    for j, s in enumerate((0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF)):
        assert int(bits[(j * 37) % bits.numel()]) == s


def test_golden_generator_refuses_to_rewrite(capsys):
    from make_store_golden import main

    assert all(Path(GOLDEN / lay).is_dir() for lay in ("fixed12", "tiered", "dense11", "dense11_v2", "dense11_v3"))
    before = {p: p.read_bytes() for p in GOLDEN.rglob("*") if p.is_file()}
    assert main() == 0
    assert capsys.readouterr().err.count("never rewritten") == 5
    assert {p: p.read_bytes() for p in GOLDEN.rglob("*") if p.is_file()} == before
