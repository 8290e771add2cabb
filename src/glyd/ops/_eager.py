"""``torch.ops.glyd.linear`` from eager Python: straight to its CUDA implementation where the
dispatcher would only pass the call through.

Because ``glyd::linear`` has an autograd formula (``torch.library.register_autograd``), every call
goes through a Python autograd kernel and a Python redispatch before the CUDA implementation, even
under ``torch.no_grad()`` (about 45 us of host time a product on the H200's host, 2026-12-03).
When nothing between them could act (no gradient wanted, plain tensors, no torch-function or
dispatch mode, no functorch transform, no profiler, not traced by ``torch.compile``), this calls
``backends.cuda.linear`` itself: the same function the dispatcher would reach, so the same result.
Everything else, and every device but CUDA, takes ``torch.ops.glyd.linear``. Off with launch plans
(``GLYD_PLANS=0``, ``glyd.kernels._plan.set_enabled``).
"""

from __future__ import annotations

import torch
from torch import nn

from glyd.kernels import _plan
from glyd.ops.backends import cuda as _cuda

__all__ = ["linear", "direct", "passes_through"]

_C = torch._C
_PLAIN = (torch.Tensor, nn.Parameter)
_PROBES = (getattr(_C, "_is_torch_function_mode_enabled", None), getattr(_C, "_len_torch_dispatch_stack", None),
           getattr(_C, "_are_functorch_transforms_active", None),
           getattr(getattr(_C, "_autograd", None), "_profiler_enabled", None))
#: The torch build has every probe ``direct`` asks (else every call takes the dispatcher).
USABLE = all(f is not None for f in _PROBES)
_fn_mode, _dispatch_modes, _functorch, _profiling = _PROBES


def direct(x, bias, arrays) -> bool:
    """True when ``torch.ops.glyd.linear(x, ..., arrays, bias, ...)`` would reach
    ``backends.cuda.linear`` with these very arguments and nothing else would see the call."""
    if torch.compiler.is_compiling():  # first: torch.compile traces the op (its fake implementation)
        return False
    return type(x) is torch.Tensor and x.is_cuda and passes_through(x, bias, arrays)


def passes_through(x, bias, arrays) -> bool:
    """True when the dispatcher would take a call with these arguments straight to the backend's
    implementation: no gradient wanted, plain tensors, no mode, transform or profiler active (and
    plans on). ``direct`` adds: x on CUDA, not traced by ``torch.compile``."""
    if not (USABLE and _plan.enabled()) or type(x) is not torch.Tensor:
        return False
    grad = torch.is_grad_enabled()
    if grad and (x.requires_grad or (bias is not None and bias.requires_grad)):
        return False
    if bias is not None and type(bias) not in _PLAIN:
        return False
    for a in arrays:
        if type(a) not in _PLAIN:
            return False
    return not (_fn_mode() or _dispatch_modes() or _functorch() or _profiling())


def linear(x: torch.Tensor, layout: str, shape, arrays, bias, version: int) -> torch.Tensor:
    """``torch.ops.glyd.linear(x, layout, shape, arrays, bias, version)``, the same result."""
    if direct(x, bias, arrays):
        return _cuda.linear(x, layout, shape, arrays, bias, version)
    return torch.ops.glyd.linear(x, layout, shape, arrays, bias, version)
