"""glyd pack -> verify -> info -> unpack on real model folders: every bit comes back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from store_helpers import assert_bits_equal, load_folder

from glyd.cli import main
from glyd.store import CheckpointReader, info, key_for


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("layout", ["fixed12", "tiered"])
@pytest.mark.parametrize("model", ["minilm_bf16", "tiny_llama"])
def test_cli_round_trip(model, layout, request, tmp_path, capsys):
    src: Path = request.getfixturevalue(model)
    packed, out = tmp_path / "packed", tmp_path / "unpacked"
    original = load_folder(src)

    rc, stdout, _ = _run(capsys, "pack", str(src), str(packed), "--layout", layout)
    assert rc == 0
    assert "bits a weight" in stdout and "kept unpacked" in stdout
    # MiniLM's position_ids, a buffer the fixture casts to bf16, is kept: BertModel runs it as it is
    # (packed, the folder did not load)
    kept = {"embeddings.position_ids"} if model == "minilm_bf16" else set()
    n2d = sum(1 for n, t in original.items() if t.dim() == 2 and n not in kept)
    assert f"packed matrices      {n2d} ({n2d} {layout})" in stdout
    n1d = len(original) - n2d
    assert f"{n1d} bfloat16" in stdout  # norms and biases are kept, and reported

    # The manifest: every 2-D bf16 tensor packed in the asked layout, the rest kept raw.
    reader = CheckpointReader(packed)
    assert sorted(reader.names()) == sorted(original)
    for name, t in original.items():
        e = reader.entry(name)
        assert e["dtype"] == "bfloat16" and e["shape"] == list(t.shape)
        assert e["kind"] == ("packed" if t.dim() == 2 and name not in kept else "raw")
        if e["kind"] == "packed":
            assert e["layout"] == layout and e["format_version"] == 1
    q = reader.config["quantization_config"]
    own = json.loads((src / "config.json").read_text())["model_type"]
    assert reader.config["model_type"] == "glyd"
    assert q == {"quant_method": "glyd", "layout": layout, "format_version": 1, "original_model_type": own}

    rc, stdout, _ = _run(capsys, "verify", str(packed))
    assert rc == 0 and stdout.startswith("OK ")
    assert f"{len(original)} tensors ({n2d} packed, {n1d} raw" in stdout

    rc, stdout, _ = _run(capsys, "info", str(packed))
    assert rc == 0
    some = next(n for n, t in original.items() if t.dim() == 2 and n not in kept)
    line = next(ln for ln in stdout.splitlines() if ln.startswith(some + " "))
    assert layout in line and "x".join(map(str, original[some].shape)) in line
    rows, totals = info(packed)
    assert totals["packed"] == n2d and totals["raw"] == n1d
    assert totals["weights"] == sum(t.numel() for t in original.values())
    bpw = totals["packed_bits_per_weight"]
    assert 8.0 < bpw < 16.0, bpw  # a real compression, for real weights and small random ones alike

    rc, stdout, _ = _run(capsys, "unpack", str(packed), str(out))
    assert rc == 0
    assert_bits_equal(original, load_folder(out))

    # Same files and shards as the source; config.json back without quantization_config.
    src_files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
    out_files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert out_files == src_files
    assert json.loads((out / "config.json").read_text()) == json.loads((src / "config.json").read_text())
    for rel in src_files:
        if rel not in ("config.json", "model.safetensors.index.json"):
            # Shards too: safetensors writes the same bytes for the same tensors and metadata.
            assert (out / rel).read_bytes() == (src / rel).read_bytes(), rel
    if model == "tiny_llama":
        # A folder written by transformers comes back byte for byte, config and index included.
        for rel in src_files:
            assert (out / rel).read_bytes() == (src / rel).read_bytes(), rel
    index = src / "model.safetensors.index.json"
    if index.is_file():
        wm_src = json.loads(index.read_text())["weight_map"]
        assert json.loads((out / "model.safetensors.index.json").read_text())["weight_map"] == wm_src


def test_packed_shards_use_pinned_keys(tiny_llama, tmp_path, capsys):
    packed = tmp_path / "p"
    assert main(["-q", "pack", str(tiny_llama), str(packed)]) == 0
    reader = CheckpointReader(packed)
    manifest = json.loads((packed / "glyd.json").read_text())
    index = json.loads((packed / "model.safetensors.index.json").read_text())
    name = "model.layers.0.mlp.up_proj.weight"
    e = manifest["tensors"][name]
    assert set(e["arrays"]) == {"lo", "code", "base", "exc_idx", "exc_hi"}
    with safe_open(str(packed / e["file"]), framework="pt") as f:
        assert f.metadata() == {"format": "pt", "glyd": "1"}
        keys = set(f.keys())
    assert {key_for(name, a) for a in e["arrays"]} <= keys
    assert "model.layers.0.mlp.up_proj.weight_glyd_lo" in keys
    assert index["weight_map"]["model.layers.0.mlp.up_proj.weight_glyd_lo"] == e["file"]
    assert index["weight_map"]["model.norm.weight"] == manifest["tensors"]["model.norm.weight"]["file"]
    # Shard boundaries of the source are kept: as many shards, with the same names.
    src_shards = sorted(p.name for p in tiny_llama.glob("model-*.safetensors"))
    assert sorted({reader.entry(n)["file"] for n in reader.names()}) == src_shards
