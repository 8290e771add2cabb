"""Products and unpacking on any device: the Triton kernels on CUDA, the pure-torch twin elsewhere.

``import glyd.ops`` imports no Triton. ``linear`` runs the fused kernel when ``x`` is a CUDA bf16
tensor and Triton imports; otherwise its twin ``F.linear(x, glyd.unpack(p).to(x.dtype), bias)``,
which the tests compare the kernels against.

>>> import torch, glyd, glyd.ops
>>> w = (torch.randn(16, 64) * 0.02).to(torch.bfloat16)
>>> p = glyd.ops.pack(w, "auto")          # "fixed12" on the CPU: no measurements for it
>>> y = glyd.ops.linear(torch.randn(2, 64, dtype=torch.bfloat16), p)
>>> y.shape, y.dtype
(torch.Size([2, 16]), torch.bfloat16)
"""

from __future__ import annotations

import functools
import importlib
import logging
import math

import torch
import torch.nn.functional as F

from glyd.codec import LAYOUTS, Packed
from glyd.codec import pack as _codec_pack
from glyd.codec import unpack as _codec_unpack

log = logging.getLogger(__name__)

__all__ = ["linear", "unpack", "pack", "choose_layout", "triton_available"]


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when ``triton`` imports (checked once)."""
    try:
        importlib.import_module("triton")
        return True
    except Exception as exc:  # ImportError, or a broken install raising anything else
        log.info("Triton is not available (%s); glyd.ops uses the pure-torch twin", exc)
        return False


def _kernels():
    return importlib.import_module("glyd.kernels")


def _use_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda and triton_available()


def linear(x: torch.Tensor, p: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for the packed ``W`` [N, K]: bf16 output, any leading dims of ``x``.

    Fused Triton kernel for CUDA bf16 ``x``; else ``F.linear(x, glyd.unpack(p).to(x.dtype), bias)``.
    """
    if not isinstance(p, Packed):
        raise TypeError(f"p must be a glyd.Packed, got {type(p).__name__}")
    if _use_gpu(x) and x.dtype == torch.bfloat16 and p.device == x.device:
        return _kernels().linear(x, p, bias)
    w = unpack(p).to(device=x.device, dtype=x.dtype)
    return F.linear(x, w, bias)


def unpack(p: Packed) -> torch.Tensor:
    """The bf16 matrix of ``p`` on ``p``'s device, bit for bit (GPU kernel on CUDA)."""
    if not isinstance(p, Packed):
        raise TypeError(f"p must be a glyd.Packed, got {type(p).__name__}")
    dev = p.device
    if dev.type == "cuda" and triton_available():
        return _kernels().unpack(p)
    return _codec_unpack(p).to(dev)


def pack(w: torch.Tensor, layout: str = "fixed12") -> Packed:
    """Pack a 2-D bf16 matrix; on CUDA with torch ops on the GPU (bit-identical to the CPU codec).

    ``layout="auto"`` asks ``choose_layout``. The result stays on ``w``'s device.
    """
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"w must be a torch.Tensor, got {type(w).__name__}")
    if layout == "auto":
        layout = choose_layout(tuple(w.shape), w.device)
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of auto, {', '.join(LAYOUTS)}")
    if w.is_cuda:
        from glyd.kernels.gpu_pack import pack as gpu_pack

        return gpu_pack(w, layout)
    return _codec_pack(w, layout)


#: Tiered is chosen when its measured time is at most this much above fixed12's (it is smaller).
TIERED_SLACK = 0.03


def choose_layout(shape: tuple[int, ...], device: torch.device | str | None = None) -> str:
    """``"fixed12"`` or ``"tiered"`` for a matrix of ``shape`` on ``device``, from measurements.

    Reads ``glyd.kernels.measured.TIMES`` (kernel times at the decode step on each GPU measured by
    ``benchmarks/kernels.py``), takes the measured shape nearest in log(N), log(K), and picks the
    faster layout, ``"tiered"`` when it is within ``TIERED_SLACK`` of ``"fixed12"`` (it is ~10%
    smaller). ``"fixed12"`` where nothing was measured (CPU, unknown GPU).
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda" or not torch.cuda.is_available() or len(shape) != 2 or min(shape) <= 0:
        return "fixed12"
    from glyd.kernels.measured import TIMES

    entry = TIMES.get(torch.cuda.get_device_name(dev))
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
