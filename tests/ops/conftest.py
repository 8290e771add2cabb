"""Shared by the op-face tests."""

from __future__ import annotations

import torch


def random_weights(n: int, k: int, kind: str = "normal", device: str = "cpu") -> torch.Tensor:
    """Fresh bf16 weights, std 0.02, with a few far below the fixed12 window (exceptions)."""
    assert kind == "normal"
    w = torch.randn(n, k) * 0.02
    if n * k:
        pick = torch.randint(0, n * k, (max(1, n * k // 500),))
        w.view(-1)[pick] = torch.randn(pick.numel()) * 1e-12
    return w.to(torch.bfloat16).to(device)
