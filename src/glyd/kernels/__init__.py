"""Triton GPU kernels: bit-exact unpack, fused linear, and GPU pack for every layout.

``import glyd.kernels`` imports no Triton; the first call of ``linear`` or ``unpack`` does.
Every function takes a ``glyd.Packed`` whose arrays sit on the GPU (or on the CPU under
``TRITON_INTERPRET=1``, how the tests run them without a GPU).

Which kernel runs a product is chosen by ``glyd.kernels.registry`` from the GPU's table
(``kernels/tables/<GPU>.json``); pass a kernel family's config (``GemvConfig``, ``TcConfig``,
``GluonConfig``, ...) to run that kernel instead.

Example (needs a CUDA GPU)::

    import torch, glyd, glyd.kernels
    w = (torch.randn(4096, 4096, device="cuda") * 0.02).to(torch.bfloat16)
    p = glyd.kernels.pack(w, "fixed12")      # on the GPU, bit-identical to glyd.pack
    y = glyd.kernels.linear(torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16), p)
    assert torch.equal(glyd.kernels.unpack(p).view(torch.int16), w.view(torch.int16))

``linear`` never synchronises with the host, so it can run inside a CUDA graph; the first call on
a matrix builds a small derived index (fixed12 exceptions, tiered offset checks) with host syncs,
so call ``prepare`` (or the product) once before capturing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # pragma: no cover
    from glyd.codec.packed import Packed

__all__ = ["linear", "unpack", "pack", "prepare", "choose"]

#: Config classes, importable as ``glyd.kernels.<name>`` (each imports its kernel family's module).
CONFIGS = {
    "GemvConfig": "fixed12.gemv", "TcConfig": "fixed12.word_dot", "MmaConfig": "fixed12.operand_dot",
    "TileConfig": "fixed12.byte_dot", "GluonConfig": "fixed12.mma_v2", "WgConfig": "fixed12.wgmma",
    "WsConfig": "fixed12.wgmma_warpspec", "LongConfig": "fixed12.unpack_cublas", "UnpackConfig": "fixed12.unpack",
    "TieredGemvConfig": "tiered.gemv", "TieredLongConfig": "tiered.unpack_cublas", "TieredUnpackConfig": "tiered.unpack",
    "Dense11GemvConfig": "dense11.gemv", "Dense11LongConfig": "dense11.unpack_cublas",
    "Dense11UnpackConfig": "dense11.unpack",
}

#: The plane whose second dimension is a layout's padded K.
_KP_ARRAY = {"fixed12": "lo", "tiered": "sm", "dense11": "sm"}


def _packed(packed: Any) -> None:
    from glyd.codec.packed import Packed

    if not isinstance(packed, Packed):
        raise TypeError(f"packed must be a glyd.Packed, got {type(packed).__name__}")
    if packed.layout not in _KP_ARRAY:
        raise ValueError(f"no kernels for layout {packed.layout!r}")


def _kp(packed: "Packed") -> int:
    return packed.arrays[_KP_ARRAY[packed.layout]].shape[1]


def _problem(x2: torch.Tensor, packed: "Packed"):
    from glyd.kernels.registry import Problem

    n, k = packed.shape
    return Problem(packed.layout, x2.shape[0], n, k, _kp(packed))


def choose(x: torch.Tensor, packed: "Packed"):
    """(kernel class, config) that ``linear(x, packed)`` runs (from the device's table)."""
    from glyd.kernels import _common as C
    from glyd.kernels import registry

    _packed(packed)
    x2 = C.check_x(x, packed.shape[1])
    return registry.choose(_problem(x2, packed), registry.Device.of(x2.device))


# x: bf16 [..., K]; packed [N, K]; bias: [N] or None -> bf16 [..., N]
def linear(x: torch.Tensor, packed: "Packed", bias: torch.Tensor | None = None, config: Any = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` straight from the packed ``W`` [N, K]; x bf16 [..., K] -> bf16 [..., N].

    fp32 accumulation. ``config`` (a kernel family's config, e.g. ``GemvConfig(bm=2)``) runs that
    kernel; ``None`` lets the registry choose from the GPU's table.
    """
    from glyd.kernels import _common as C
    from glyd.kernels import registry

    _packed(packed)
    n, k = packed.shape
    x2 = C.check_x(x, k)
    C.check_device(packed, x2)
    bias = C.check_bias(bias, n, x2.device)
    m = x2.shape[0]
    C.check_size(f"{packed.layout} plane", n * _kp(packed))
    C.check_size("output", m * n)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x2.device)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    if k == 0:  # an empty sum: just the bias
        out.zero_()
        if bias is not None:
            out += bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], n)
    problem = _problem(x2, packed)
    device = registry.Device.of(x2.device)
    if config is None:
        kernel, config = registry.choose(problem, device)
    else:
        kernel = registry.kernel_for(config)
        ok, why = kernel.can_implement(problem, device, config)
        if not ok:
            raise ValueError(f"the {kernel.name} kernel cannot run this product ({problem}): {why}")
    return kernel.launch(x2, packed, bias, config, out).reshape(*x.shape[:-1], n)


def unpack(packed: "Packed", out: torch.Tensor | None = None, config: Any = None) -> torch.Tensor:
    """The bf16 matrix of ``packed``, bit for bit, decoded on the GPU (into ``out`` if given)."""
    _packed(packed)
    if packed.layout == "fixed12":
        from glyd.kernels.fixed12.unpack import unpack as _unpack
    elif packed.layout == "dense11":
        from glyd.kernels.dense11.unpack import unpack as _unpack
    else:
        from glyd.kernels.tiered.unpack import unpack as _unpack
    return _unpack(packed, out, config)


def pack(w: torch.Tensor, layout: str = "fixed12") -> "Packed":
    """Pack ``w`` on its own device with torch ops (bit-identical to ``glyd.pack``); no Triton."""
    from glyd.kernels.gpu_pack import pack as _pack

    return _pack(w, layout)


def prepare(packed: "Packed") -> None:
    """Build the derived per-matrix data now (host syncs), e.g. before capturing a CUDA graph."""
    _packed(packed)
    if packed.layout == "fixed12":
        from glyd.kernels.fixed12.exceptions import prepare as _prepare
    elif packed.layout == "dense11":
        from glyd.kernels.dense11.unpack import prepare as _prepare
    else:
        from glyd.kernels.tiered.unpack import check as _prepare
    _prepare(packed)


def __getattr__(name: str):
    if name in CONFIGS:
        return getattr(importlib.import_module(f"glyd.kernels.{CONFIGS[name]}"), name)
    raise AttributeError(f"module 'glyd.kernels' has no attribute {name!r}")
