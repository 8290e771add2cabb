"""The op face: products, unpacking and row lookups of packed matrices on any device.

Every call goes through one ``torch.library`` op (``glyd::linear``, ``glyd::unpack``, ``glyd::rows``;
``glyd.ops._library``): the Triton kernels for CUDA tensors, the pure-torch twin elsewhere (which
the tests compare the kernels against), a fake implementation for ``torch.compile``.
``import glyd.ops`` imports no Triton.

>>> import torch, glyd, glyd.ops
>>> w = (torch.randn(16, 64) * 0.02).to(torch.bfloat16)
>>> p = glyd.pack(w, "auto")              # "fixed12" on the CPU: no measurements for it
>>> y = glyd.ops.linear(torch.randn(2, 64, dtype=torch.bfloat16), p)
>>> y.shape, y.dtype
(torch.Size([2, 16]), torch.bfloat16)
"""

from __future__ import annotations

import logging
import math
import warnings

import torch

from glyd.codec import LAYOUTS, Packed
from glyd.codec import pack as _codec_pack
from glyd.codec.layout import resolve
from glyd.ops import _eager
from glyd.ops import _library  # noqa: F401 - defines the glyd:: ops
from glyd.ops.backends.cuda import triton_available

log = logging.getLogger(__name__)

__all__ = ["linear", "unpack", "rows", "choose_layout", "triton_available"]


def _args(p: Packed) -> tuple:
    if not isinstance(p, Packed):
        raise TypeError(f"expected a glyd.Packed, got {type(p).__name__}")
    return p.layout, list(p.shape), [p.arrays[a] for a in LAYOUTS[p.layout].arrays], p.version


def linear(x: torch.Tensor, p: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for the packed ``W`` [N, K], any leading dims of ``x``.

    The fused Triton kernels for CUDA bf16 ``x`` (bf16 output); else the twin
    ``F.linear(x, glyd.unpack(p).to(x.dtype), bias)``. Differentiable in ``x`` and ``bias``.
    """
    layout, shape, arrays, version = _args(p)
    return _eager.linear(x, layout, shape, arrays, bias, version)


def unpack(p: Packed) -> torch.Tensor:
    """The bf16 matrix of ``p`` on ``p``'s device, bit for bit (the GPU kernel on CUDA)."""
    return torch.ops.glyd.unpack(*_args(p))


def rows(p: Packed, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` (any shape of int indices) of ``p`` as bf16 ``(*index.shape, K)``, bit for bit:
    only those rows are decoded (an embedding lookup)."""
    layout, shape, arrays, version = _args(p)
    return torch.ops.glyd.rows(layout, shape, arrays, version, index)


def _pack(matrix: torch.Tensor, layout: str = "fixed12") -> Packed:
    """``glyd.pack``: a CUDA matrix packs on the GPU with torch ops (its layout's ``device_pack``,
    bit-identical to the CPU codec) and stays there; any other matrix packs with the CPU codec.
    ``layout="auto"`` asks ``choose_layout``."""
    if not isinstance(matrix, torch.Tensor):
        raise TypeError(f"matrix must be a torch.Tensor, got {type(matrix).__name__}")
    if layout == "auto":
        layout = choose_layout(tuple(matrix.shape), matrix.device)
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of auto, {', '.join(LAYOUTS)}")
    device_pack = LAYOUTS[layout].device_pack
    if not matrix.is_cuda:
        return _codec_pack(matrix, layout)
    if device_pack is None:  # a layout without a torch-op pack: the CPU codec, then back
        return _codec_pack(matrix, layout).to(matrix.device)
    return resolve(device_pack)(matrix)


def pack(w: torch.Tensor, layout: str = "fixed12") -> Packed:
    """Deprecated: ``glyd.pack`` (the same result: it keeps a CUDA matrix's device)."""
    warnings.warn("glyd.ops.pack is deprecated: use glyd.pack (the same result)", DeprecationWarning, stacklevel=2)
    return _pack(w, layout)


#: Tiered is chosen when its measured time is at most this much above fixed12's (it is smaller).
TIERED_SLACK = 0.03


def choose_layout(shape: tuple[int, ...], device: torch.device | str | None = None) -> str:
    """``"fixed12"`` or ``"tiered"`` for a matrix of ``shape`` on ``device``, from measurements.

    Reads the ``layout`` times of the GPU's own table (``glyd/kernels/tables/<GPU>.json``: kernel
    times at the decode step measured by ``benchmarks/kernels.py``), takes the measured shape
    nearest in log(N), log(K), and picks the faster layout, ``"tiered"`` when it is within
    ``TIERED_SLACK`` of ``"fixed12"`` (it is ~10% smaller). ``"fixed12"`` where nothing was
    measured (CPU, a GPU without a table).
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda" or not torch.cuda.is_available() or len(shape) != 2 or min(shape) <= 0:
        return "fixed12"
    from glyd.kernels.registry import layout_times

    entry = layout_times(torch.cuda.get_device_name(dev))
    if not entry or not entry.get("shapes"):
        return "fixed12"
    return _pick(entry["shapes"], shape)


def _pick(shapes: dict, shape: tuple[int, ...]) -> str:
    n, k = shape

    def dist(key: str) -> float:
        sn, sk = (int(v) for v in key.split("x"))
        return abs(math.log(sn / n)) + abs(math.log(sk / k))

    t = shapes[min(shapes, key=dist)]
    if "tiered" in t and "fixed12" in t and t["tiered"] <= t["fixed12"] * (1 + TIERED_SLACK):
        return "tiered"
    return "fixed12"
