"""Triton GPU kernels: bit-exact unpack and fused linear for every layout that has kernels.

``import glyd.kernels`` imports no Triton; the first call of ``linear`` or ``unpack`` does.
Every function takes a ``glyd.Packed`` whose arrays sit on the GPU (or on the CPU under
``TRITON_INTERPRET=1``, how the tests run them without a GPU).

Which kernel runs a product is chosen by ``glyd.kernels.registry`` from the GPU's table
(``kernels/tables/<GPU>.json``); pass a kernel family's config (``GemvConfig``, ``TcConfig``,
``GluonConfig``, ...) to run that kernel instead. Which kernels a layout has, and its unpack and
prepare, its entry in ``glyd.codec.LAYOUTS`` says: nothing here names a layout.

Example (needs a CUDA GPU)::

    import torch, glyd, glyd.kernels
    w = (torch.randn(4096, 4096, device="cuda") * 0.02).to(torch.bfloat16)
    p = glyd.pack(w, "fixed12")              # packed on the GPU, where w is
    y = glyd.kernels.linear(torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16), p)
    assert torch.equal(glyd.kernels.unpack(p).view(torch.int16), w.view(torch.int16))

``linear`` never synchronises with the host, so it can run inside a CUDA graph; the first call on
a matrix builds a small derived index (fixed12 exceptions, tiered offset checks) with host syncs,
so call ``prepare`` (or the product) once before capturing.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

import torch

from glyd.codec.layout import LAYOUTS, Layout, resolve

if TYPE_CHECKING:  # pragma: no cover
    from glyd.codec.packed import Packed

__all__ = ["linear", "unpack", "prepare", "choose"]


def _layout(packed: Any, what: str = "kernels") -> Layout:
    from glyd.codec.packed import Packed

    if not isinstance(packed, Packed):
        raise TypeError(f"packed must be a glyd.Packed, got {type(packed).__name__}")
    lay = LAYOUTS[packed.layout]
    if not (lay.kernels if what == "kernels" else getattr(lay, what)):
        raise ValueError(f"layout {packed.layout!r} has no {what.replace('_kernel', '')} kernel")
    return lay


def _problem(x2: torch.Tensor, packed: "Packed"):
    from glyd.kernels.registry import Problem

    n, k = packed.shape
    return Problem(packed.layout, x2.shape[0], n, k, LAYOUTS[packed.layout].padded_k(packed.arrays), packed.version)


def choose(x: torch.Tensor, packed: "Packed"):
    """(kernel class, config) that ``linear(x, packed)`` runs (from the device's table)."""
    from glyd.kernels import _common as C
    from glyd.kernels import registry

    _layout(packed)
    x2 = C.check_x(x, packed.shape[1])
    return registry.choose(_problem(x2, packed), registry.Device.of(x2.device))


# x: bf16 [..., K]; packed [N, K]; bias: [N] or None -> bf16 [..., N]
def linear(x: torch.Tensor, packed: "Packed", bias: torch.Tensor | None = None, config: Any = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` straight from the packed ``W`` [N, K]; x bf16 [..., K] -> bf16 [..., N].

    fp32 accumulation. ``config`` (a kernel family's config, e.g. ``GemvConfig(bm=2)``) runs that
    kernel; ``None`` lets the registry choose from the GPU's table, and keeps what this call worked
    out for the next call with the same matrix and inputs like these (``glyd.kernels._plan``).
    """
    from glyd.kernels import _common as C
    from glyd.kernels import _plan, registry

    lay = _layout(packed)
    arrays = None
    if config is None and _plan.enabled() and all(a in packed.arrays for a in lay.arrays):
        arrays = [packed.arrays[a] for a in lay.arrays]
        y = _plan.run(x, packed.layout, packed.shape, arrays, bias, packed.version)
        if y is not None:
            return y
    n, k = packed.shape
    x2 = C.check_x(x, k)
    C.check_device(packed, x2)
    b = C.check_bias(bias, n, x2.device)
    m = x2.shape[0]
    C.check_size(f"{packed.layout} plane", n * lay.padded_k(packed.arrays))
    C.check_size("output", m * n)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x2.device)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    if k == 0:  # an empty sum: just the bias
        out.zero_()
        if b is not None:
            out += b.to(out.dtype)
        return out.reshape(*x.shape[:-1], n)
    problem = _problem(x2, packed)
    device = registry.Device.of(x2.device)
    if config is None:
        kernel, config = registry.choose(problem, device)
    else:
        kernel = registry.kernel_for(config)
        if kernel.experts:  # its launch takes expert ids: it would crash inside
            raise TypeError(f"{type(config).__name__} is the config of the experts kernel {kernel.name}: "
                            "pass it to glyd.kernels.experts.linear")
        ok, why = kernel.can_implement(problem, device, config)
        if not ok:
            raise ValueError(f"the {kernel.name} kernel cannot run this product ({problem}): {why}")
    if arrays is None:
        return kernel.launch(x2, packed, b, config, out).reshape(*x.shape[:-1], n)
    body = kernel.plan(x2, packed, b, config)
    y = body(x2, b, out, arrays)
    rows = registry.m_range(m) if kernel.any_rows else None  # choose's answer holds for the whole bucket
    _plan.store(x, packed.layout, packed.shape, arrays, bias, packed.version,
                _plan.Plan(body, x, x2, n, rows=rows is not None), rows)
    return y.reshape(*x.shape[:-1], n)


def unpack(packed: "Packed", out: torch.Tensor | None = None, config: Any = None) -> torch.Tensor:
    """The bf16 matrix of ``packed``, bit for bit, decoded on the GPU (into ``out`` if given)."""
    return resolve(_layout(packed, "unpack_kernel").unpack_kernel)(packed, out, config)


def prepare(packed: "Packed") -> None:
    """Build the derived per-matrix data now (host syncs), e.g. before capturing a CUDA graph."""
    resolve(_layout(packed, "prepare_kernel").prepare_kernel)(packed)


def pack(w: torch.Tensor, layout: str = "fixed12") -> "Packed":
    """Deprecated: ``glyd.pack(w, layout)`` packs on ``w``'s device, bit-identical to this."""
    warnings.warn("glyd.kernels.pack is deprecated: glyd.pack keeps the matrix's device", DeprecationWarning,
                  stacklevel=2)
    if layout not in LAYOUTS or LAYOUTS[layout].device_pack is None:
        raise ValueError(f"unknown layout {layout!r}; choose one of "
                         f"{', '.join(n for n, lay in LAYOUTS.items() if lay.device_pack)}")
    return resolve(LAYOUTS[layout].device_pack)(w)


def _config_modules() -> list[str]:
    """The modules of every layout's kernel families and unpack (where their config classes live)."""
    refs = [ref for lay in LAYOUTS.values() for ref in (*lay.kernels.values(), lay.unpack_kernel)]
    return list(dict.fromkeys(r.partition(":")[0] for r in refs if isinstance(r, str)))


def __getattr__(name: str):
    # A kernel family's config class (``GemvConfig``, ``TieredUnpackConfig``, ...), found in the
    # modules the layouts name: importing them imports Triton.
    failed: list[ImportError] = []
    modules = _config_modules() if name.endswith("Config") and not name.startswith("_") else []
    for module in modules:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:  # a Gluon family on a Triton without Gluon, or no Triton
            failed.append(exc)
            continue
        if isinstance(getattr(mod, name, None), type):
            return getattr(mod, name)
    if failed and len(failed) == len(modules):  # none imports (no Triton): say why
        raise failed[0]
    raise AttributeError(f"module 'glyd.kernels' has no attribute {name!r}")
