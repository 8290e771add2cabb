"""Bridge to ``glyd.ops`` (GPU Triton kernels, pure-torch reference on the CPU).

``glyd.ops`` is the single entry point for products and unpacking on any device. Until it is
importable (older checkouts, or a build without it), the functions below fall back to the CPU
reference codec plus ``F.linear``, which is bit-exact but slow: the nn modules call only these.
"""

from __future__ import annotations

import functools
import importlib
import logging

import torch
import torch.nn.functional as F

from glyd.codec import LAYOUTS, Packed
from glyd.codec import pack as _codec_pack
from glyd.codec import unpack as _codec_unpack

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _ops():
    try:
        return importlib.import_module("glyd.ops")
    except ModuleNotFoundError as exc:
        if exc.name not in ("glyd.ops",):
            raise
        log.debug("glyd.ops is not available; using the CPU reference codec")
        return None


def unpack(packed: Packed) -> torch.Tensor:
    """The bf16 matrix of ``packed`` on ``packed``'s device, bit for bit."""
    ops = _ops()
    if ops is not None:
        return ops.unpack(packed)
    return _codec_unpack(packed).to(packed.device)


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` the packed matrix (fused kernel on the GPU)."""
    ops = _ops()
    if ops is not None:
        return ops.linear(x, packed, bias)
    return F.linear(x, unpack(packed).to(x.device), bias)


def pack(w: torch.Tensor, layout: str) -> Packed:
    """Pack a 2-D bf16 matrix with ``layout``; the result lives on ``w``'s device."""
    ops = _ops()
    if ops is not None and hasattr(ops, "pack"):
        return ops.pack(w, layout)
    return _codec_pack(w.detach().cpu(), layout).to(w.device)


def choose_layout(shape: tuple[int, int], device: torch.device | str) -> str:
    """The layout ``"auto"`` resolves to for a matrix of ``shape`` on ``device``."""
    ops = _ops()
    if ops is not None and hasattr(ops, "choose_layout"):
        layout = ops.choose_layout(tuple(shape), torch.device(device))
        if layout not in LAYOUTS:
            raise ValueError(f"glyd.ops.choose_layout returned unknown layout {layout!r}")
        return layout
    # Without measurements, the fastest-to-decode layout is the safe choice.
    return "fixed12"
