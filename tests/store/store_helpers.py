"""Helpers shared by the store tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open


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
